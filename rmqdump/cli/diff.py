"""`rmqdump diff`: where two stores differ (master and slave, before and after, two replicas)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from rmqdump.analysis.diff import diff_stores
from rmqdump.cli.options import access_options, report_output_options
from rmqdump.cli.output import Column, default_format, diag, emit_document, escape_control, print_table
from rmqdump.codec.layout import record_size_limit

if TYPE_CHECKING:
    from rich.console import Console

DOC_EXAMPLES = [["diff", "fixtures/store", "fixtures/store"]]

RECORD_FIELDS = ("kind", "size", "topic", "queue_id", "queue_offset", "store_timestamp", "body_length", "body_crc",
                 "crc_ok", "keys", "uniq_key", "reason", "detail")
QUEUE_COLUMNS = [Column("queue", "queue", "wrap", 0, None, 20), Column("detail", "difference", "wrap", 0, None, 30)]
FILE_COLUMNS = [Column("file", "file", "fixed", 0), Column("detail", "difference", "wrap", 0, None, 30)]


def _record_line(rec: dict) -> str:
    return ", ".join(f"{k} {rec[k]}" for k in RECORD_FIELDS if rec.get(k) not in (None, [], ""))


def render(console: Console, doc: dict) -> None:
    from rich.text import Text

    console.print(Text(escape_control(f"A: {doc['a']}"), style="bold"))
    console.print(Text(escape_control(f"B: {doc['b']}"), style="bold"))
    if doc["identical"]:
        console.print(Text("identical: commitlog, consume queues, index headers, checkpoint and config match",
                           style="green"))
        return
    console.print(Text(f"{doc['differences']} difference(s)", style="bold red"))
    cl = doc["commitlog"]
    console.print(Text(f"commitlog: A {cl['a']['min_offset']}..{cl['a']['end']}, "
                       f"B {cl['b']['min_offset']}..{cl['b']['end']}", style="bold"))
    d = cl["first_divergence"]
    if d:
        console.print(Text(f"  first divergence at offset {d['offset']} (byte {d['byte_in_record']} of the record "
                           f"at {d['record_offset']})", style="red"))
        for side in ("a", "b"):
            console.print(Text(escape_control(f"  {side.upper()}: {_record_line(d[side])}")))
        if d.get("note"):
            console.print(Text(escape_control(f"  {d['note']}"), style="yellow"))
    for n in cl["notes"]:
        console.print(Text(escape_control(f"  {n}"), style="yellow"))
    if not d and not cl["notes"]:
        console.print(Text("  same bytes", style="green"))
    cq = doc.get("consume_queues")
    if cq and (cq["queues"] or cq["errors"]):
        rows = []
        for q in cq["queues"]:
            detail = q["detail"]
            f = q.get("first_difference")
            if f:
                detail += f" (A {f['a']}, B {f['b']})"
            rows.append((f"{q['topic']}/{q['queue_id']}", detail))
        print_table(console, QUEUE_COLUMNS, rows, title="consume queues")
        for e in cq["errors"]:
            console.print(Text(escape_control(e), style="red"))
    if doc.get("index"):
        print_table(console, FILE_COLUMNS, [(i["file"], i["detail"]) for i in doc["index"]], title="index files")
    if doc.get("checkpoint"):
        console.print(Text("checkpoint: " + ", ".join(f"{k} {a} vs {b}" for k, (a, b) in doc["checkpoint"].items())))
    if doc.get("config"):
        rows = [(c["file"], c["detail"] + (f"; keys: {', '.join(c['paths'])}" if c.get("paths") else ""))
                for c in doc["config"]]
        print_table(console, FILE_COLUMNS, rows, title="config")


@click.command()
@click.argument("stores", nargs=2, type=click.Path(exists=True, path_type=str), metavar="STORE_A STORE_B")
@report_output_options
@access_options
def diff(stores, fmt, quiet, no_mmap, max_message_size):
    """Compare STORE_A with STORE_B (master and slave, before and after, two replicas): the first offset
    where their commitlogs differ with both records decoded, or where one ends and the other goes on; per
    consume queue the max offsets and first differing entry; index file headers; checkpoint fields;
    config files (the key paths that differ, never their values). Raw bytes are compared in big chunks;
    records are decoded only at the divergence. Exit 0 identical, 1 they differ, 2 error."""
    fmt = default_format(fmt, report=True)
    if fmt == "csv":
        raise click.BadParameter("diff prints one document: use table, json or jsonl", param_hint="--format")
    doc = diff_stores(stores[0], stores[1], use_mmap=not no_mmap, max_record_size=record_size_limit(max_message_size))
    emit_document(doc, fmt, render)
    if not quiet and fmt != "table":
        diag(f"diff: {'identical' if doc['identical'] else str(doc['differences']) + ' difference(s)'}",
             None if doc["identical"] else "red")
    if not doc["identical"]:
        raise SystemExit(1)
    return 0
