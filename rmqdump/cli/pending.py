"""`rmqdump pending`: what the broker still owes (undelivered delayed, half and timer messages)."""

from __future__ import annotations

import time
from collections import Counter

import click

from rmqdump.broker.systopics import ANOMALY_STATES, OWED_STATES, PENDING_FIELDS, STATES
from rmqdump.cli.options import (
    access_options,
    body_decoder_options,
    crc_option,
    now_option,
    parse_time,
    report_output_options,
    resolve_body_decoder,
    store_argument,
)
from rmqdump.cli.output import Column, RecordWriter, default_format, diag, iso_ms, progress_bar, report_body_errors
from rmqdump.codec.layout import record_size_limit
from rmqdump.codec.record import Message
from rmqdump.rows.schema import BodyErrors, output_body
from rmqdump.store.commitlog import Skipped
from rmqdump.store.config import load_delay_offsets
from rmqdump.store.root import Store

KIND_GROUPS = {"delay": ("delay",), "transaction": ("tx_half", "tx_prepared"), "timer": ("timer",)}
TABLE_COLUMNS = [
    Column("kind", "KIND", "fixed", 0), Column("state", "STATE", "fixed", 0), Column("topic", "TOPIC", "text", 4, 24, 10),
    Column("queue_id", "Q", "num", 7), Column("queue_offset", "QOFF", "num", 6), Column("offset", "OFFSET", "num", 0),
    Column("destination", "REAL TOPIC/Q", "text", 1, 32, 12), Column("level", "LVL", "num", 8),
    Column("due", "DUE (UTC)", "fixed", 2), Column("keys", "KEYS", "text", 5, 24, 8),
    Column("detail", "DETAIL", "wrap", 0, None, 30),
]
BODY_COLUMN = Column("body", "BODY", "text", 3, 40, 12)
FIELDS = (*PENDING_FIELDS, "overdue", "body")


def _due_text(due: int | None, overdue: bool | None) -> str:
    if not due:
        return "-"
    iso = iso_ms(due)
    if iso.endswith("+00:00"):
        iso = iso[:19] + "Z"
    return iso + (" (overdue)" if overdue else "")


@click.command()
@store_argument
@click.option("--kind", "kinds", type=click.Choice(tuple(KIND_GROUPS)), multiple=True,
              help="Only this kind of system message (repeatable; default: all).")
@click.option("--all", "show_all", is_flag=True,
              help="List every delayed, half, timer and PREPARED record with its state (delivered, resolved, "
                   "superseded, redeliver, lost, ...), not only the pending ones.")
@crc_option()
@now_option
@report_output_options
@body_decoder_options
@access_options
def pending(store, kinds, show_all, crc, now, fmt, quiet, body_mode, decompress, no_mmap, max_message_size):
    """List what the broker of STORE still owes: delayed messages in SCHEDULE_TOPIC_XXXX not yet
    delivered (checked against config/delayOffset.json per level and against a delivered copy
    with the same UNIQ_KEY in the real topic), transaction half messages without an op record
    (with their real topic), 5.x timer messages without a delivered copy, and PREPARED records
    nobody committed or rolled back. Exit 1 on damage or on a delayed message the offsets say was
    delivered but that is nowhere on disk (state `lost`)."""
    fmt = default_format(fmt, report=True)
    decoder = resolve_body_decoder(body_mode, fmt)
    now_ms = parse_time(now, "--now") if now is not None else int(time.time() * 1000)
    st = Store.open(store)
    cl = st.commitlog
    delay_offsets = None
    if st.root is not None:
        loaded = load_delay_offsets(st.root)
        if loaded.path is not None:
            delay_offsets = loaded.data or {}
            if loaded.used_backup and not quiet:
                diag(f"using {loaded.path} (the main delayOffset.json is missing or unreadable)", "yellow")
    if delay_offsets is None and not quiet:
        diag("no config/delayOffset.json: delayed messages are judged by delivered copies only", "yellow")
    from rmqdump.analysis.pending import walk_pending

    def on_skipped(rec: Skipped) -> None:
        if not quiet:
            diag(f"skipped damaged bytes [{rec.start}, {rec.end}) in {rec.file}: {rec.reason.kind}: "
                 f"{rec.reason.detail}", "yellow")

    max_record_size = record_size_limit(max_message_size)
    with progress_bar(sum(s.size for s in cl.segments), "pending", not quiet) as update:
        res = walk_pending(cl, delay_offsets, check_crc=crc != "off", use_mmap=not no_mmap,
                           max_record_size=max_record_size, on_skipped=on_skipped, progress=update)
    damage = res.damage
    if res.stop is not None and not quiet:
        diag(f"walk stopped at damage at offset {res.stop.offset}: {res.stop.kind}: {res.stop.detail}", "red")
    wanted = {k for g in (kinds or KIND_GROUPS) for k in KIND_GROUPS[g]}
    cands = [c for c in res.candidates if c.kind in wanted]
    counts = Counter(c.state for c in cands)
    table_columns = TABLE_COLUMNS + ([BODY_COLUMN] if decoder.needs_body else [])
    writer = RecordWriter(fmt, FIELDS, table_columns)
    try:
        for c in cands:
            if not show_all and c.state not in OWED_STATES:
                continue
            row = c.to_dict()
            due = row["due_time"]
            row["overdue"] = (due is not None and due <= now_ms) if c.state in OWED_STATES else None
            row["body"] = None
            if decoder.needs_body:
                m = cl.decode_at(c.offset, use_mmap=not no_mmap, check_crc=False, read_body=True,
                                 max_record_size=max_record_size)
                if isinstance(m, Message):
                    errors = BodyErrors()
                    body = output_body(m, decompress, errors)
                    where = f"offset {c.offset}"
                    for _off, detail in errors.first:
                        decoder.note_error(f"{where}: {detail}; body shown as stored ({m.compression})")
                    row["body"] = decoder.text(body, where) if fmt in ("table", "csv") else decoder.decode(body, where)
            if fmt == "table":
                rq = row["real_queue_id"]
                row["destination"] = f"{row['real_topic'] or '?'}" + (f"/{rq}" if rq is not None else "")
                row["due"] = _due_text(due, row["overdue"])
            writer.write(row)
    finally:
        writer.close()
        report_body_errors(decoder, quiet)
    if not quiet:
        summary = ", ".join(f"{counts[s]} {s}" for s in STATES if counts[s]) or "no delayed, half or timer messages"
        diag(f"{summary} (of {len(cands)} tracked system records; {res.records} records walked; "
             f"reference time {iso_ms(now_ms)})")
    if damage or counts["lost"]:
        if not quiet and any(counts[s] for s in ANOMALY_STATES):
            diag("rmqdump: inconsistent delivery state: " + ", ".join(f"{counts[s]} {s}" for s in sorted(ANOMALY_STATES)
                                                                   if counts[s]) + " (see --all)", "red")
        raise SystemExit(1)
