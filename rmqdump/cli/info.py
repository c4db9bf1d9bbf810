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
INVENTORY_COLUMNS = [
    Column("path", "path", "fixed", 0), Column("status", "status", "fixed", 0),
    Column("entries", "entries", "num", 0, justify="right"), Column("what", "what", "wrap", 0, None, 18),
]
UNKNOWN_COLUMNS = [Column("path", "path", "wrap", 0, None, 30), Column("type", "type", "fixed", 0)]
FEATURE_COLUMNS = [
    Column("feature", "feature", "fixed", 0), Column("rmqdump", "rmqdump", "fixed", 0),
    Column("evidence", "evidence", "wrap", 0, None, 24),
]
_STATUS = {"read": "read", "named": "not read", "unknown": "unknown"}


def render(console: Console, doc: dict) -> None:
    cl = doc["commitlog"]
    console.print(Text(f"store: {escape_control(doc['store'])}", style="bold"))
    if doc.get("missing"):
        console.print(Text(escape_control(f"missing: {', '.join(doc['missing'])}"), style="yellow"))
    if cl is None:
        console.print(Text("commitlog: none here (a DLedger store keeps its records in dledger-<id>/data/, which "
                           "holds no data file here)", style="yellow"))
    else:
        _render_commitlog(console, cl)
    _render_parts(console, doc)
    if doc.get("controller"):
        _render_controller(console, doc["controller"])
    if doc.get("next_start"):
        _render_next_start(console, doc["next_start"])
    if "inventory" in doc:
        _render_inventory(console, doc["inventory"], doc["features"])


def _render_controller(console: Console, c: dict) -> None:
    """Controller mode: the broker identity and its epochs (epoch, start offset, end = the next start)."""
    ident = c.get("broker_identity")
    if ident:
        console.print(Text(escape_control(f"broker identity: {ident['error']}" if "error" in ident else
                                          f"broker identity: cluster {ident['cluster']}, broker "
                                          f"{ident['broker_name']}, id {ident['broker_id']}")))
    if c.get("epochs") is None:
        return
    for name, problem in c.get("epoch_file_problems", {}).items():
        console.print(Text(escape_control(f"  {name}: {problem}"), style="yellow"))
    if c.get("epoch_load_error"):
        console.print(Text(escape_control(f"epochs: the broker cannot load them: {c['epoch_load_error']}"),
                           style="red"))
        return
    spans = ", ".join(f"{e['epoch']}: {e['start_offset']}.." + ("" if e["end_offset"] is None else
                                                                 str(e["end_offset"])) for e in c["epochs"])
    console.print(Text(escape_control(f"epochs ({c.get('epoch_file')}): {spans or 'none'}")))


def _render_next_start(console: Console, ns: dict) -> None:
    """Two lines: what the broker's recovery reads at its next start, and why it starts there."""
    from rmqdump.broker.recovery.cost import summary_lines

    lines = summary_lines(ns)
    console.print(Text(escape_control("next start: " + lines[0])))
    if len(lines) > 1:
        console.print(Text(escape_control(f"  {lines[1]}; `rmqdump verify` walks it")), style="dim")


def _render_commitlog(console: Console, cl: dict) -> None:
    console.print(Text(escape_control(
        f"commitlog: {len(cl['segments'])} segments of {cl['file_size']} bytes; offsets "
        f"{cl['min_offset']}..{cl['max_offset']} ({cl['bytes_in_use']} bytes in use, "
        f"{cl['bytes_on_disk']} on disk); end: {cl['end_reason']}")))
    for f in cl.get("folders", ()):
        console.print(Text(escape_control(f"  folder {f['directory']}: {len(f['segments'])} segments"
                                          + (f" ({f['segments'][0]}..{f['segments'][-1]})" if f["segments"] else ""))))
    for p in cl["problems"]:
        console.print(Text(escape_control(f"  {p['severity']}: {p['kind']}: {p['file']}: {p['detail']}"),
                           style="red" if p["severity"] == "error" else "yellow"))


def _render_parts(console: Console, doc: dict) -> None:
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


def _render_inventory(console: Console, inv: dict, features: list[dict]) -> None:
    c = inv["counts"]
    print_table(console, INVENTORY_COLUMNS, [(g["path"], _STATUS[g["status"]], g["files"] + g["dirs"], g["what"])
                                             for g in inv["groups"]],
                title=f"store files: {c['read']} read, {c['named']} present but not read, {c['unknown']} unknown")
    if inv["unknown"]:
        print_table(console, UNKNOWN_COLUMNS, [(u["path"], u["type"]) for u in inv["unknown"]],
                    title="unknown files (no RocketMQ 4.9/5.3 file has that name there; not read)")
    for m in inv["unknown_unlisted"]:
        console.print(Text(escape_control(f"  and {m['more']} more unknown in {m['directory']}"), style="yellow"))
    for r in inv["irregular"]:
        how = "symlink, not followed" if r["type"] == "symlink" else "special file (FIFO, socket, device), not opened"
        console.print(Text(escape_control(f"{how}: {r['path']} ({r['what']})"), style="yellow"))
    if inv["stopped"]:
        console.print(Text(escape_control(f"inventory {inv['stopped']}: later entries not examined"), style="yellow"))
    shown = [f for f in features if f["present"]]
    if shown:
        print_table(console, FEATURE_COLUMNS, [(f["feature"], f["rmqdump"], f["evidence"] or "") for f in shown],
                    title="broker features (rmqdump: reads, or names only)")
    absent = [f["feature"] for f in features if not f["present"]]
    if absent:
        console.print(Text(f"features not seen: {', '.join(absent)} (v2 and crc32 are looked for in the last "
                           "segment's records only)", style="dim"))


@click.command()
@store_argument
@report_output_options
@access_options
def info(store, fmt, quiet, no_mmap, max_message_size):
    """Summarise STORE: commitlog segments and offset range, consume queues with entry counts,
    index files, checkpoint times (UTC), abort marker and whether the broker's lock is held
    (and by which PID); then every file and directory of the store, read by rmqdump, present but
    not read, or unknown, and the broker features it shows (timer, RocksDB, BatchCQ, DLedger...).
    Never takes the lock; reads only the last segment's records."""
    fmt = default_format(fmt, report=True)
    if fmt == "csv":
        raise click.BadParameter("info prints a document: use table, json or jsonl", param_hint="--format")
    emit_document(store_info(store, use_mmap=not no_mmap), fmt, render)
