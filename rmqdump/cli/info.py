"""`rmqdump info`: summarise a store without walking all of it."""

from __future__ import annotations

import click
from rich.console import Console
from rich.text import Text

from rmqdump.analysis.info import store_info
from rmqdump.cli.cq import SUMMARY_COLUMNS
from rmqdump.cli.options import access_options, report_output_options, store_argument
from rmqdump.cli.output import Column, default_format, emit_document, escape_control, print_table, utc_ms

INDEX_COLUMNS = [
    Column("file", "file", "fixed", 0), Column("geometry", "slots/entries", "fixed", 3),
    Column("begin", "begin", "fixed", 4), Column("end", "end", "fixed", 4),
    Column("phy", "phy offsets", "num", 1), Column("used", "used slots", "num", 2, justify="right"),
    Column("entries", "entries", "num", 0, justify="right"),
    Column("error", "error", "wrap", 0, None, 30, style="red"),
]


def render(console: Console, doc: dict) -> None:
    cl = doc["commitlog"]
    console.print(Text(f"store: {escape_control(doc['store'])}", style="bold"))
    if doc.get("missing"):
        console.print(Text(escape_control(f"missing: {', '.join(doc['missing'])}"), style="yellow"))
    console.print(Text(escape_control(
        f"commitlog: {len(cl['segments'])} segments of {cl['file_size']} bytes; offsets "
        f"{cl['min_offset']}..{cl['max_offset']} ({cl['bytes_in_use']} bytes in use, "
        f"{cl['bytes_on_disk']} on disk); end: {cl['end_reason']}")))
    for p in cl["problems"]:
        console.print(Text(escape_control(f"  {p['severity']}: {p['kind']}: {p['file']}: {p['detail']}"),
                           style="red" if p["severity"] == "error" else "yellow"))
    if "consume_queues" in doc:
        cq = doc["consume_queues"]
        rows = [(q["topic"], q["queue_id"], q["files"], q["min_offset"], q["max_offset"],
                 q["max_offset"] - q["min_offset"], q["max_physic_offset"]) for q in cq["queues"]]
        print_table(console, SUMMARY_COLUMNS[:-1], rows,  # cq's table without its notes: info has none
                    title=f"consume queues (file size {cq.get('file_size')})")
        for e in cq["errors"]:
            console.print(Text(escape_control(e), style="red"))
    if doc.get("index_files") is not None:
        rows = [(f["file"], "", "", "", "", "", "", f["error"]) if "error" in f else
                (f["file"], f"{f['hash_slots']}/{f['max_entries']}", utc_ms(f["begin_timestamp"]),
                 utc_ms(f["end_timestamp"]), f"{f['begin_phy_offset']}..{f['end_phy_offset']}",
                 f["hash_slot_count"], f["entries"], "") for f in doc["index_files"]]
        if not any(r[-1] for r in rows):
            rows = [r[:-1] for r in rows]
        print_table(console, INDEX_COLUMNS[:len(rows[0])] if rows else INDEX_COLUMNS, rows, title="index files")
    cp = doc.get("checkpoint")
    if cp and "error" not in cp:
        console.print(f"checkpoint: physic {cp['physic_msg_time'] or 'never'}, logics "
                      f"{cp['logics_msg_time'] or 'never'}, index {cp['index_msg_time'] or 'never'}", highlight=False)
    elif cp:
        console.print(Text(escape_control(f"checkpoint: {cp['error']}"), style="red"))
    if "abort" in doc:
        console.print("abort: " + ("present (the broker will run abnormal recovery)" if doc["abort"] else "absent"))
        lk = doc["lock"]
        held = lk.get("held_by_pid")
        console.print("lock: " + ("missing" if not lk["present"] else
                                  f"held by PID {held} (a broker is running)" if held else "not held"))
        for name, c in doc.get("config", {}).items():
            if "error" in c:
                console.print(Text(escape_control(f"config {name}: {c['error']}"), style="red"))
            elif c["file"]:
                console.print(Text(escape_control(f"config {name}: {c['entries']} entries from {c['file']}"
                                                  + (" (backup)" if c["from_backup"] else ""))))


@click.command()
@store_argument
@report_output_options
@access_options
def info(store, fmt, quiet, no_mmap, max_message_size):
    """Summarise STORE: commitlog segments and offset range, consume queues with entry counts,
    index files, checkpoint times (UTC), abort marker and whether the broker's lock is held
    (and by which PID). Never takes the lock; reads only the last segment's records."""
    fmt = default_format(fmt, report=True)
    if fmt == "csv":
        raise click.BadParameter("info prints a document: use table, json or jsonl", param_hint="--format")
    emit_document(store_info(store, use_mmap=not no_mmap), fmt, render)
