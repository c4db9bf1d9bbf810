"""`rmqdump fingerprint`: a digest per commitlog segment and consume-queue file; compare with another host's."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from rmqdump import __version__
from rmqdump.analysis.fingerprint import compare_fingerprints, fingerprint_store
from rmqdump.cli.options import access_options, report_output_options, store_argument
from rmqdump.cli.output import Column, default_format, diag, emit_document, escape_control, print_table, progress_bar
from rmqdump.codec.layout import record_size_limit

if TYPE_CHECKING:
    from rich.console import Console

DOC_EXAMPLES = [["fingerprint", "fixtures/store"]]
#: the largest --against file read (a fingerprint of a store with a million queue files is ~200 MB)
MAX_AGAINST_BYTES = 1 << 30
#: hex digits of a digest a table shows (128 bits; -f json has all 64)
SHOWN = 32

SEGMENT_COLUMNS = [
    Column("file", "segment", "fixed", 0), Column("used", "used bytes", "num", 0, justify="right"),
    Column("records", "records", "num", 1, justify="right"), Column("end", "end", "fixed", 2),
    Column("digest", "digest (first 32 hex)", "fixed", 0),
]
QUEUE_COLUMNS = [
    Column("queue", "queue", "wrap", 0, None, 20), Column("files", "files", "num", 1, justify="right"),
    Column("entries", "entries", "num", 0, justify="right"), Column("digest", "its files' digest (32 hex)", "fixed", 0),
]
DIFF_COLUMNS = [
    Column("part", "part", "fixed", 0), Column("name", "where", "wrap", 0, None, 20),
    Column("detail", "difference", "wrap", 0, None, 30),
]


def _queue_digest(files: list[dict]) -> str:
    """One digest per queue for the table (the JSON keeps one per file)."""
    import hashlib

    h = hashlib.blake2b(digest_size=32)
    for f in files:
        h.update(f"{f['file']}:{f['entries']}:{f['digest']};".encode())
    return h.hexdigest()


def render(console: Console, doc: dict) -> None:
    from rich.text import Text

    console.print(Text(escape_control(f"fingerprint of {doc['store']} ({doc['algorithm']}; rmqdump {doc['version']})"),
                       style="bold"))
    cl = doc["commitlog"]
    print_table(console, SEGMENT_COLUMNS, [(s["file"], s["used"], s["records"], s["end"], s["digest"][:SHOWN])
                                           for s in cl["segments"]],
                title=f"commitlog segments (file size {cl['file_size']}; bytes in use up to the last record)")
    for part in ("consumequeue", "batchconsumequeue"):
        qs = (doc.get(part) or {}).get("queues") or []
        if qs:
            print_table(console, QUEUE_COLUMNS, [(f"{q['topic']}/{q['queue_id']}", len(q["files"]),
                                                  sum(f["entries"] for f in q["files"]), _queue_digest(q["files"])[:SHOWN])
                                                 for q in qs], title=f"{part} (per-file digests: -f json)")
        for e in (doc.get(part) or {}).get("errors") or []:
            console.print(Text(escape_control(e), style="red"))


def render_comparison(console: Console, doc: dict) -> None:
    from rich.text import Text

    console.print(Text(escape_control(f"{doc['a']} (A) against {doc['b']} (B)"), style="bold"))
    if not doc["differences"]:
        console.print(Text("identical: every segment, queue file, index header, checkpoint field and config file "
                           "matches", style="green"))
        return
    data = sum(d["data"] for d in doc["differences"])
    console.print(Text(f"{len(doc['differences'])} differences ({data} in records or queue entries)",
                       style="bold red" if data else "yellow"))
    print_table(console, DIFF_COLUMNS, [(d["part"], d["name"], d["detail"]) for d in doc["differences"]])


def load_fingerprint(path: str) -> dict:
    """A fingerprint JSON file written by ``rmqdump fingerprint -f json`` (StoreError if it is not one)."""
    from rmqdump.disk.fileio import read_regular
    from rmqdump.errors import StoreError

    data = read_regular(path, MAX_AGAINST_BYTES + 1)
    if len(data) > MAX_AGAINST_BYTES:
        raise StoreError(f"larger than {MAX_AGAINST_BYTES} bytes: not a fingerprint", path)
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise StoreError(f"not JSON: {e}", path) from None
    if not isinstance(doc, dict) or "fingerprint_version" not in doc:
        raise StoreError("not an rmqdump fingerprint (no fingerprint_version)", path)
    return doc


@click.command()
@store_argument
@click.option("--against", "against", type=click.Path(exists=True, dir_okay=False, path_type=str), default=None,
              metavar="FILE.json", help="Compare with another host's `rmqdump fingerprint -f json` output and print "
                                        "where they differ (exit 1 if they do).")
@report_output_options
@access_options
def fingerprint(store, against, fmt, quiet, no_mmap, max_message_size):
    """A stable digest of STORE to compare replicas without copying data: one per commitlog segment (its
    bytes in use: up to the end of the last record, a closing BLANK's 8-byte header included, so file sizes
    and pre-allocated zero tails do not count; up to the last non-zero byte when the walk stops on damage),
    one per consume-queue file (its units up to the last non-zero one), plus index headers, checkpoint
    fields and config file digests. Save it with -f json on each host; --against FILE.json compares this
    store with another's. Exit 0 (with --against: identical), 1 they differ, 2 error."""
    fmt = default_format(fmt, report=True)
    if fmt == "csv":
        raise click.BadParameter("fingerprint prints one document: use table, json or jsonl", param_hint="--format")
    other = load_fingerprint(against) if against else None
    from rmqdump.store.root import Store

    total = sum(s.size for s in Store.open(store).commitlog.segments)
    with progress_bar(total, "fingerprinting", not quiet) as update:
        doc = fingerprint_store(store, use_mmap=not no_mmap, max_record_size=record_size_limit(max_message_size),
                                progress=update, version=__version__)
    if other is None:
        emit_document(doc, fmt, render)
        return 0
    diffs = compare_fingerprints(doc, other)
    emit_document({"a": doc["store"], "b": other.get("store"), "identical": not diffs, "differences": diffs},
                  fmt, render_comparison)
    if not quiet and fmt != "table":
        diag(f"fingerprint: {'identical' if not diffs else f'{len(diffs)} differences'}",
             "red" if diffs else None)
    if diffs:
        raise SystemExit(1)
    return 0
