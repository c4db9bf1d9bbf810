"""`rmqdump report`: one self-contained HTML page about a store (incident channel, post-mortem)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from rmqdump import __version__
from rmqdump.analysis.report import write_report
from rmqdump.cli.options import access_options, report_output_options, store_argument
from rmqdump.cli.output import default_format, diag, emit_document, escape_control, progress_bar
from rmqdump.codec.layout import record_size_limit
from rmqdump.store.root import Store

if TYPE_CHECKING:
    from rich.console import Console

DOC_EXAMPLES = [["report", "fixtures/oracle/498-flip-body-mid/store", "--to", "/tmp/rmqdump-report.html"]]


def render(console: Console, doc: dict) -> None:
    from rich.text import Text

    console.print(Text(escape_control(
        f"report of {doc['store']} written to {doc['report']}: {doc['records']} records; verify: "
        f"{doc['errors']} errors, {doc['warnings']} warnings"), style="bold red" if doc["errors"] else "bold"))


@click.command()
@store_argument
@click.option("--to", "to", required=True, type=click.Path(dir_okay=False, path_type=str), metavar="FILE.html",
              help="The page to write (outside the store; written to a temporary file, then renamed).")
@click.option("--keep-going", is_flag=True,
              help="Verify past damage (as verify --keep-going): every damaged range on the map.")
@click.option("--broker-version", type=click.Choice(("auto", "4.9", "5.3")), default="auto", show_default=True,
              help="Recovery model, as verify's.")
@report_output_options
@access_options
def report(store, to, keep_going, broker_version, fmt, quiet, no_mmap, max_message_size):
    """Write one self-contained HTML page about STORE for the incident channel and the post-mortem: a
    store map (commitlog segments on an offset axis with damaged ranges, blank and unwritten tails and
    the broker's predicted recovery cut), records per topic and per hour, consumer lag and messages
    deleted before consumption per group, the next-start estimate and the verify findings with file and
    offset. The numbers are verify's, stats' and consumers' -f json documents, embedded in the page; it
    fetches nothing (inline CSS, SVG and script). The store is only read; a --to path inside it is
    refused. Exit 0 written (whatever the store's state), 2 error."""
    fmt = default_format(fmt, report=True)
    if fmt == "csv":
        raise click.BadParameter("report prints one document: use table, json or jsonl", param_hint="--format")
    total = 2 * sum(s.size for s in Store.open(store).commitlog.segments)
    with progress_bar(total, "report", not quiet) as update:
        doc = write_report(store, to, version_label=__version__, keep_going=keep_going, version=broker_version,
                           use_mmap=not no_mmap, max_record_size=record_size_limit(max_message_size),
                           progress=update)
    emit_document(doc, fmt, render)
    if not quiet and fmt != "table":
        diag(escape_control(f"report: {doc['report']} written"))
    return 0
