"""`rmqdump scan`: walk the commitlog and print its records."""

from __future__ import annotations

import click

from ..commitlog import Skipped
from ..errors import FormatError
from ..filters import RecordFilter
from ..format import MAX_MESSAGE_SIZE, MAX_RECORD_SIZE
from ..record import END_OF_DATA, Blank, Message
from ..schema import FIELDS, message_to_dict
from ..store import Store
from .options import access_options, body_options, output_options, parse_time, resolve_body_mode
from .output import RecordWriter, default_format, diag, iso_ms, progress_bar

TABLE_COLUMNS = [
    ("offset", "OFFSET", 12), ("topic", "TOPIC", 24), ("queue_id", "Q", 3), ("queue_offset", "QOFF", 6),
    ("store_time", "STORE TIME (UTC)", 29), ("tags", "TAGS", 12), ("keys", "KEYS", 24), ("size", "SIZE", 7),
    ("body", "BODY", 30),
]


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=str), metavar="PATH")
@click.option("--topic", "-t", multiple=True, help="Only records of this topic (repeatable).")
@click.option("--queue", "queue_id", type=int, default=None, help="Only records of this queue id.")
@click.option("--tag", multiple=True, help="Only records whose TAGS equals this (repeatable).")
@click.option("--key", multiple=True, help="Only records with this key in KEYS or as UNIQ_KEY (repeatable).")
@click.option("--since", help="Store time lower bound (ISO 8601, UTC by default, or epoch ms).")
@click.option("--until", help="Store time upper bound (ISO 8601 or epoch ms).")
@click.option("--from-offset", type=click.IntRange(0), default=None, help="Start at this commitlog offset.")
@click.option("--to-offset", type=click.IntRange(0), default=None, help="Stop before this commitlog offset.")
@click.option("--limit", "-n", type=click.IntRange(0), default=None, help="Stop after printing N records.")
@click.option("--max-bytes", type=click.IntRange(0), default=None, help="Stop after walking N commitlog bytes.")
@click.option("--keep-going", is_flag=True,
              help="Resynchronise past damaged regions (report the skipped byte ranges) instead of stopping.")
@click.option("--no-crc", is_flag=True, help="Do not check body CRCs (the broker's dispatcher does not).")
@output_options
@body_options
@access_options
def scan(path, topic, queue_id, tag, key, since, until, from_offset, to_offset, limit, max_bytes, keep_going, no_crc,
         fmt, quiet, body_mode, decompress, no_mmap, max_message_size):
    """Walk the commitlog of PATH (a store, its commitlog/ directory or one segment file) and
    print its records in the JSONL schema. Stops at the end of valid data and says why on
    stderr; exit 1 if it stopped at damage."""
    fmt = default_format(fmt)
    body_mode = resolve_body_mode(body_mode, fmt)
    flt = RecordFilter(tuple(topic), queue_id, tuple(tag), tuple(key), parse_time(since, "--since"),
                       parse_time(until, "--until"))
    store = Store.open(path)
    cl = store.commitlog
    end = to_offset
    start = from_offset if from_offset is not None else cl.min_offset
    if max_bytes is not None:
        end = min(end, start + max_bytes) if end is not None else start + max_bytes
    walk = cl.walk(start=start, end=end, check_crc=not no_crc, read_body=body_mode != "none",
                   keep_going=keep_going, use_mmap=not no_mmap,
                   max_record_size=max_message_size + (MAX_RECORD_SIZE - MAX_MESSAGE_SIZE))
    writer = RecordWriter(fmt, FIELDS, TABLE_COLUMNS)
    total = sum(s.size for s in cl.segments if s.end > start)
    skipped = 0
    limited = False
    try:
        with progress_bar(total, "scanning", not quiet) as update:
            for n, rec in enumerate(walk):
                if n & 1023 == 0:
                    update(max(0, walk.end_offset - start))
                if isinstance(rec, Message):
                    if flt.empty or flt.match(rec):
                        row = message_to_dict(rec, body_mode, decompress)
                        if fmt == "table":
                            row["store_time"] = iso_ms(rec.store_timestamp)
                        writer.write(row)
                        if limit is not None and writer.count >= limit:
                            limited = True
                            break
                elif isinstance(rec, Skipped):
                    skipped += 1
                    if not quiet:
                        diag(f"skipped damaged bytes [{rec.start}, {rec.end}) in {rec.file}: "
                             f"{rec.reason.kind}: {rec.reason.detail}", "yellow")
                elif isinstance(rec, Blank):
                    continue
                if limit == 0:
                    limited = True
                    break
    finally:
        writer.close()
    stop = walk.stop
    if limited or stop is None:
        if not quiet:
            diag(f"stopped after {writer.count} records (--limit)")
        return 0
    seg = cl.segment_for(stop.offset)
    where = f"{seg.path} at byte {stop.file_pos} (offset {stop.offset})" if seg else f"offset {stop.offset}"
    if stop.kind == END_OF_DATA:
        if not quiet:
            diag(f"end of valid data at {stop.offset}: {stop.detail}; {walk.records} records walked, "
                 f"{writer.count} printed" + (f", {skipped} damaged ranges skipped" if skipped else ""))
        if skipped:
            raise SystemExit(1)
        return 0
    if walk.records == 0 and not skipped and stop.offset == start:
        raise FormatError(f"no valid record: {stop.kind}: {stop.detail}", seg.path if seg else path,
                          stop.file_pos if seg else None)
    diag(f"rmqdump: stopped at damage: {where}: {stop.kind}: {stop.detail}; {walk.records} records walked, "
         f"{writer.count} printed" + (f", {skipped} damaged ranges skipped" if skipped else ""), "red")
    raise SystemExit(1)
