"""`rmqdump bundle`: one .tar.gz to hand to support (layout, config without secrets, info, verify, hashes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from rmqdump import __version__
from rmqdump.analysis.bundle import write_bundle
from rmqdump.cli.options import access_options, report_output_options, store_argument
from rmqdump.cli.output import Column, default_format, diag, emit_document, escape_control, print_table
from rmqdump.codec.layout import record_size_limit

if TYPE_CHECKING:
    from rich.console import Console

DOC_EXAMPLES = [["bundle", "fixtures/store", "--to", "/tmp/rmqdump-bundle.tar.gz"]]

MEMBER_COLUMNS = [Column("name", "member", "wrap", 0, None, 24), Column("what", "holds", "wrap", 0, None, 24)]
WHAT = {
    "layout.json": "every file and directory: size, mtime, allocated bytes, sparse or not",
    "geometry.json": "file sizes the store is laid out with",
    "checkpoint.json": "the checkpoint's fields",
    "info.json": "rmqdump info -f json",
    "verify.json": "rmqdump verify -f json, with its exit code",
    "evidence.json": "sha256, size and mtime of every file info and verify read",
    "manifest.json": "rmqdump, Python and platform versions; what was stripped or left out",
}


def _what(name: str) -> str:
    if name.startswith("config/"):
        return "secrets stripped"
    if name.startswith("data/"):
        return "the store's file, as is (--with-data)"
    return WHAT.get(name, "")


def render(console: Console, doc: dict) -> None:
    from rich.text import Text

    console.print(Text(escape_control(f"bundle of {doc['store']} written to {doc['bundle']}"
                                      + (" (with the store's data)" if doc["with_data"] else " (no store data)")),
                       style="bold"))
    print_table(console, MEMBER_COLUMNS, [(m["name"], _what(m["name"])) for m in doc["members"]])


@click.command()
@store_argument
@click.option("--to", "to", required=True, type=click.Path(dir_okay=False, path_type=str), metavar="FILE.tar.gz",
              help="The bundle to write (outside the store; written to a temporary file, then renamed).")
@click.option("--with-data", is_flag=True,
              help="Also add the store's files (commitlog, consume queues, index, checkpoint...) under data/; "
                   "config/ is only ever included with its secrets stripped.")
@click.option("--no-evidence", is_flag=True,
              help="Leave out evidence.json (the sha256 of every file info and verify read: on a big store "
                   "this reads every segment once more).")
@report_output_options
@access_options
def bundle(store, to, with_data, no_evidence, fmt, quiet, no_mmap, max_message_size):
    """Write one .tar.gz about STORE to hand on (a support ticket, an incident channel): the store's
    layout (every file with size, mtime, allocated bytes, sparse or not), geometry, checkpoint, config/
    with secrets stripped (values of keys like secretKey, accessKey, password, token replaced by
    "<stripped>", in JSON, YAML and properties files), `info` and `verify` as JSON, an evidence manifest
    (sha256 of every file they read) and the rmqdump version. No message data unless --with-data. The
    store is only read; a --to path inside it is refused. Exit 0 written, 2 error."""
    fmt = default_format(fmt, report=True)
    if fmt == "csv":
        raise click.BadParameter("bundle prints one document: use table, json or jsonl", param_hint="--format")
    doc = write_bundle(store, to, with_data=with_data, evidence_hashes=not no_evidence, use_mmap=not no_mmap,
                       max_record_size=record_size_limit(max_message_size), version=__version__)
    emit_document(doc, fmt, render)
    if not quiet and fmt != "table":
        diag(f"bundle: {len(doc['members'])} members written to {doc['bundle']}")
    return 0
