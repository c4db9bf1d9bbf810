"""`rmqdump stats`: counts and bytes per topic, queue, tag, producer host and hour."""

from __future__ import annotations

import click
from rich.console import Console
from rich.text import Text

from rmqdump.analysis.stats import ROW_FIELDS, compute_stats, has_errors, stats_rows
from rmqdump.cli.options import access_options, crc_option, report_output_options, store_argument
from rmqdump.cli.output import (
    Column,
    RecordWriter,
    default_format,
    diag,
    emit_document,
    escape_control,
    iso_ms,
    print_table,
    progress_bar,
)
from rmqdump.codec.layout import record_size_limit
from rmqdump.store.root import Store


def _table(title: str, headers: list[str], rows: list[list], console: Console) -> None:
    columns = []
    for i, h in enumerate(headers):
        numeric = bool(rows) and all(isinstance(r[i], (int, float)) or str(r[i]).endswith("%") for r in rows)
        columns.append(Column(h, h, "num", 1, justify="right") if numeric else Column(h, h, "text", 0, 48, 12))
    print_table(console, columns, rows, title=Text(title, style="bold"))


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def render(console: Console, doc: dict) -> None:
    t = doc["totals"]
    console.print(Text(escape_control(f"store: {doc['store']}"), style="bold"))
    console.print(Text(f"{t['records']} records, {t['bytes']} bytes ({t['body_bytes']} body bytes) in {t['topics']} "
                       f"topics / {t['queues']} queues; {t['blanks']} blanks; offsets {t['min_offset']}.."
                       f"{t['end_offset']}; store time {iso_ms(t['first_store_time'])} .. "
                       f"{iso_ms(t['last_store_time'])}"))
    total = t["records"]
    _table("per topic", ["topic", "records", "share", "bytes", "body bytes"],
           [[e["topic"], e["records"], _pct(e["records"], total), e["bytes"], e["body_bytes"]] for e in doc["topics"]],
           console)
    _table("per queue", ["topic", "queue", "records", "bytes"],
           [[e["topic"], e["queue_id"], e["records"], e["bytes"]] for e in doc["queues"]], console)
    _table("per tag", ["topic", "tag", "records", "bytes"],
           [[e["topic"], e["tag"], e["records"], e["bytes"]] for e in doc["tags"]], console)
    _table("per producer host (born host)", ["host", "records", "bytes"],
           [[e["host"], e["records"], e["bytes"]] for e in doc["producer_hosts"]], console)
    _table("per hour (store time, UTC)", ["hour", "records", "bytes"],
           [[e["hour"], e["records"], e["bytes"]] for e in doc["hours"]], console)
    if doc["system_kinds"]:
        _table("system topics resolved", ["kind", "real topic", "records", "bytes"],
               [[e["kind"], e["real_topic"], e["records"], e["bytes"]] for e in doc["system_kinds"]], console)
    _table("stored body size", ["bucket", "records", "share"],
           [[e["bucket"], e["records"], _pct(e["records"], total)] for e in doc["body_sizes"] if e["records"]],
           console)
    c = doc["compression"]
    console.print(Text(f"compressed: {c['compressed_records']} of {total} records "
                       f"({100 * c['compressed_share']:.1f}%), {c['compressed_body_bytes']} body bytes "
                       f"({100 * c['compressed_body_share']:.1f}%); "
                       + ", ".join(f"{e['compression']} {e['records']}" for e in c["by_type"])))
    s = doc["clock_skew"]
    if s["records"]:
        console.print(Text(f"clock skew (store - born) over {s['records']} producer writes ({s['excluded']} system "
                           f"and re-put records excluded): min {s['min_ms']} ms, mean {s['mean_ms']} ms, "
                           f"max {s['max_ms']} ms; born after store: {s['born_after_store']}"))
        _table("clock skew histogram", ["bucket", "records"],
               [[e["bucket"], e["records"]] for e in s["histogram"] if e["records"]], console)
    _table("per segment", ["file", "start", "records", "bytes", "blanks", "findings"],
           [[e["file"], e["start"], e["records"], e["bytes"], e["blanks"], e["findings"]] for e in doc["segments"]],
           console)
    for f in doc["findings"]:
        where = (f["file"] or "") + (f"@{f['offset']}" if f["offset"] is not None else "")
        console.print(Text(escape_control(f"{f['severity']}: {f['kind']}: {where}: {f['detail']}"),
                           style="red" if f["severity"] == "error" else "yellow"))


@click.command()
@store_argument
@crc_option()
@report_output_options
@access_options
def stats(store, crc, fmt, quiet, no_mmap, max_message_size):
    """Statistics of the commitlog of STORE, like pg_waldump --stats: records and bytes per
    topic, queue, tag, producer host and hour (UTC), stored body size histogram, compressed
    share, born-vs-store clock skew, system topics resolved to their real destinations and
    per-segment record and finding counts. Walks past damage (exit 1 if any). Table, json
    (one document), jsonl and csv (one row per section entry)."""
    fmt = default_format(fmt, report=True)
    cl = Store.open(store).commitlog
    total = sum(s.size for s in cl.segments)
    with progress_bar(total, "stats", not quiet) as update:
        doc = compute_stats(store, check_crc=crc != "off", use_mmap=not no_mmap,
                            max_record_size=record_size_limit(max_message_size),
                            progress=update)
    if fmt in ("jsonl", "csv"):
        w = RecordWriter(fmt, ROW_FIELDS)
        try:
            for r in stats_rows(doc):
                w.write(r)
        finally:
            w.close()
    else:
        emit_document(doc, fmt, render)
    if has_errors(doc):
        if not quiet:
            diag(f"rmqdump: {doc['totals']['findings']} findings while walking (damage skipped)", "red")
        raise SystemExit(1)
