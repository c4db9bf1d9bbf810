"""`rmqdump scan`: walk the commitlog and print its records (optionally following a live store)."""

from __future__ import annotations

import codecs
import sys

import click

from rmqdump.broker.systopics import resolve
from rmqdump.cli.options import (
    access_options,
    body_decoder_options,
    crc_option,
    limit_option,
    output_options,
    parse_window,
    record_filter_options,
    resolve_body_decoder,
)
from rmqdump.cli.output import (
    Column,
    RecordWriter,
    _dumps,
    default_format,
    diag,
    iso_ms,
    progress_bar,
    report_body_errors,
    utc_ms,
)
from rmqdump.codec.layout import record_size_limit
from rmqdump.codec.record import END_OF_DATA, Message
from rmqdump.errors import FormatError
from rmqdump.rows.bodyfmt import BodyDecoder, message_to_row
from rmqdump.rows.filters import RecordFilter
from rmqdump.rows.schema import FIELDS
from rmqdump.store.commitlog import Skipped
from rmqdump.store.root import Store

#: the table at any width: offsets and numbers whole, text abbreviated with "…", the least needed columns left out
#: (and named on stderr) when the terminal is narrow; BODY only when a body is decoded (--body)
TABLE_COLUMNS = [
    Column("offset", "OFFSET", "num", 0), Column("topic", "TOPIC", "text", 1, 32, 12),
    Column("queue_id", "Q", "num", 5), Column("queue_offset", "QOFF", "num", 4),
    Column("store_time", "STORE TIME (UTC)", "fixed", 6), Column("tags", "TAGS", "text", 8, 16, 6),
    Column("keys", "KEYS", "text", 7, 32, 10), Column("size", "SIZE", "num", 9),
]
BODY_COLUMN = Column("body", "BODY", "text", 3, 60, 12)
RESOLVED_COLUMN = Column("destination", "RESOLVED DESTINATION", "text", 2, 64, 20)


def table_columns(decoder: BodyDecoder, resolved: bool = False) -> list[Column]:
    """The record table's columns for this ``--body`` and ``--resolve``."""
    return TABLE_COLUMNS + ([BODY_COLUMN] if decoder.needs_body else []) + ([RESOLVED_COLUMN] if resolved else [])


def describe_resolved(r: dict) -> str:
    """One-line summary of a :func:`rmqdump.broker.systopics.resolve` result (``-`` for ordinary records)."""
    kind = r["kind"]
    if kind == "normal" and not r.get("via"):
        return "-"
    dest = f"{r['real_topic'] or '?'}" + (f"/{r['real_queue_id']}" if r["real_queue_id"] is not None else "")
    if kind == "delay":
        return f"delay L{r['level']} -> {dest} due {iso_ms(r['due_time'])}"
    if kind == "timer":
        return f"timer -> {dest} due {iso_ms(r['due_time'])}"
    if kind == "tx_half":
        return f"half -> {dest}" + (f" (check {r['check_times']})" if r["check_times"] else "")
    if kind == "tx_op":
        return f"op for half offsets {r['half_queue_offsets']}"
    if kind in ("retry", "dlq"):
        return f"{kind} of {r['group']} for {dest}"
    if r.get("via"):
        return f"{kind} (delivered via {r['via']}" + (f" L{r['level']}" if r.get("level") else "") + ")"
    return kind


class _ResolvedFilter:
    """--topic/--queue matching either the record's own or its resolved destination."""

    def __init__(self, topics: tuple[str, ...], queue_id: int | None):
        self.topics = set(topics)
        self.queue_id = queue_id

    def match(self, msg: Message, r: dict) -> bool:
        for t, q in ((msg.topic, msg.queue_id), (r["real_topic"], r["real_queue_id"])):
            if self.topics and t not in self.topics:
                continue
            if self.queue_id is not None and q != self.queue_id:
                continue
            return True
        return False


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=str), metavar="PATH")
@record_filter_options("Only records of this topic (repeatable; with --resolve also records whose real "
                       "destination is this topic).")
@click.option("--from-offset", type=click.IntRange(0), default=None, help="Start at this commitlog offset.")
@click.option("--to-offset", type=click.IntRange(0), default=None, help="Stop before this commitlog offset.")
@limit_option("Stop after printing N records.")
@click.option("--max-bytes", type=click.IntRange(0), default=None, help="Stop after walking N commitlog bytes.")
@click.option("--keep-going", is_flag=True,
              help="Resynchronise past damaged regions (report the skipped byte ranges) instead of stopping.")
@crc_option()
@click.option("--resolve", "do_resolve", is_flag=True,
              help="Resolve system topics: show the real destination of delayed (SCHEDULE_TOPIC_XXXX), "
                   "transaction half/op, timer, retry and DLQ records (adds a `resolved` field).")
@click.option("--follow", "-F", is_flag=True,
              help="Keep reading as the broker writes, like tail -f (pread only; waits at the write frontier "
                   "instead of reporting it as damage). Stop with Ctrl-C or --until-idle.")
@click.option("--from-end", is_flag=True, help="With --follow: start at the current end of data (new records only).")
@click.option("--until-idle", type=click.FloatRange(0, min_open=True), default=None, metavar="SECONDS",
              help="With --follow: stop after SECONDS without a new record.")
@click.option("--poll-interval", type=click.FloatRange(0.001), default=0.2, show_default=True, metavar="SECONDS",
              help="With --follow: how often to re-read the frontier.")
@click.option("--partial-timeout", type=click.FloatRange(0, min_open=True), default=5.0, show_default=True,
              metavar="SECONDS",
              help="With --follow: how long an incomplete record at the frontier may stay incomplete before it "
                   "is reported as damage.")
@output_options
@body_decoder_options
@access_options
def scan(path, topic, queue_id, tag, key, since, until, body_contains, body_regex, from_offset, to_offset, limit, max_bytes, keep_going, crc,
         do_resolve, follow, from_end, until_idle, poll_interval, partial_timeout, fmt, quiet, body_mode, decompress,
         no_mmap, max_message_size):
    """Walk the commitlog of PATH (a store, its commitlog/ directory or one segment file) and
    print its records in the JSONL schema. Stops at the end of valid data and says why on
    stderr; exit 1 if it stopped at damage. With --follow, keeps printing records as a live
    broker writes them."""
    fmt = default_format(fmt)
    decoder = resolve_body_decoder(body_mode, fmt)
    rfilter = _ResolvedFilter(tuple(topic), queue_id) if do_resolve and (topic or queue_id is not None) else None
    flt = RecordFilter(() if rfilter else tuple(topic), None if rfilter else queue_id, tuple(tag), tuple(key),
                       *parse_window(since, until), tuple(body_contains), body_regex)
    read_body = decoder.needs_body or flt.needs_body
    max_record_size = record_size_limit(max_message_size)
    columns = list(FIELDS) + (["resolved"] if do_resolve else [])
    writer = RecordWriter(fmt, columns, table_columns(decoder, do_resolve))

    def emit(rec: Message) -> bool:
        """Print one record if it passes the filters; True when --limit is reached."""
        if limit == 0:
            return True
        r = resolve(rec) if do_resolve else None
        if not (flt.empty or flt.match(rec)) or (rfilter is not None and not rfilter.match(rec, r)):
            return False
        row = message_to_row(rec, decoder, decompress, as_text=fmt in ("table", "csv"))
        if do_resolve:
            row["resolved"] = r
        if fmt == "table":
            row["store_time"] = utc_ms(rec.store_timestamp)
            if do_resolve:
                row["destination"] = describe_resolved(r)
        writer.write(row)
        return limit is not None and writer.count >= limit

    if follow:
        if keep_going:
            raise click.UsageError("--keep-going cannot be combined with --follow (a live frontier is not damage)")
        if crc == "off":
            raise click.UsageError("--no-crc cannot be combined with --follow (the body CRC is what tells a "
                                   "half-written record from a complete one)")
        return _follow(path, from_offset, to_offset, from_end, until_idle, poll_interval, partial_timeout,
                       decoder, read_body, max_record_size, limit, writer, emit, quiet)
    if from_end or until_idle is not None:
        raise click.UsageError("--from-end and --until-idle need --follow")

    from rmqdump.analysis.scan import fast_jsonl_applies, scan_fast, scan_pure, scan_range, start_hint

    cl = Store.open(path).commitlog
    rng = scan_range(cl, from_offset, to_offset, max_bytes)
    check_crc, use_mmap = crc != "off", not no_mmap
    fast = None
    if fast_jsonl_applies(cl, rng, fmt=fmt, keep_going=keep_going, use_mmap=use_mmap,
                          per_record=do_resolve, limit=limit):
        fast = _fast_renderer(decoder, decompress, quiet)
    with progress_bar(rng.total, "scanning", not quiet) as update:
        if fast is not None:
            try:
                res = scan_fast(cl, rng, fast, flt, check_crc=check_crc, read_body=decoder.needs_body,
                                max_record_size=max_record_size, limit=limit, progress=update)
            finally:
                fast.close()
                writer.count = fast.count
                sys.stdout.buffer.flush()
                report_body_errors(decoder, quiet)
        else:
            def on_skipped(rec: Skipped) -> None:
                if not quiet:
                    diag(f"skipped damaged bytes [{rec.start}, {rec.end}) in {rec.file}: "
                         f"{rec.reason.kind}: {rec.reason.detail}", "yellow")

            try:
                res = scan_pure(cl, rng, emit, check_crc=check_crc, read_body=read_body,
                                keep_going=keep_going, use_mmap=use_mmap, max_record_size=max_record_size,
                                limit=limit, on_skipped=on_skipped, progress=update)
            finally:
                writer.close()
                report_body_errors(decoder, quiet)
    walk, limited, skipped, start = res.walk, res.limited, res.skipped, rng.start
    stop = walk.stop
    if limited or stop is None:
        if not quiet:
            diag(f"stopped after {writer.count} records (--limit)")
        return 0
    seg = cl.segment_for(stop.offset)
    where = f"{seg.path} at byte {stop.file_pos} (offset {stop.offset})" if seg else f"offset {stop.offset}"
    hint = start_hint(cl, rng, walk, skipped, use_mmap=use_mmap, max_record_size=max_record_size) \
        if from_offset is not None else None
    if hint is not None and hint.inside:
        raise FormatError(hint.text, hint.file, hint.file_pos)
    if stop.kind == END_OF_DATA:
        if not quiet:
            diag(f"end of valid data at {stop.offset}: {stop.detail}; {walk.records} records walked, "
                 f"{writer.count} printed" + (f", {skipped} damaged ranges skipped" if skipped else "")
                 + (f"; {hint.text}" if hint else ""))
        if skipped:
            raise SystemExit(1)
        return 0
    if walk.records == 0 and not skipped and stop.offset == start:
        raise FormatError(f"no valid record: {stop.kind}: {stop.detail}", seg.path if seg else path,
                          stop.file_pos if seg else None)
    diag(f"rmqdump: stopped at damage: {where}: {stop.kind}: {stop.detail}; {walk.records} records walked, "
         f"{writer.count} printed" + (f", {skipped} damaged ranges skipped" if skipped else ""), "red")
    raise SystemExit(1)


def _fast_renderer(decoder: BodyDecoder, decompress: bool, quiet: bool):
    """A :class:`rmqdump.fast.render.JsonlRenderer` on stdout when it can render this body mode to this
    stdout (UTF-8), else None."""
    enc = getattr(sys.stdout, "encoding", None)
    if not hasattr(sys.stdout, "buffer") or not enc or codecs.lookup(enc).name != "utf-8":
        return None
    if sys.stdout.isatty():
        return None  # a terminal gets escaped rows (RecordWriter), not the raw fast stream
    from rmqdump.fast import render as fastrender
    from rmqdump.fast import walk as fastwalk

    mode = fastrender.jsonl_mode(decoder)
    if mode is None:
        return None
    errors = sys.stdout.errors or "strict"
    if not quiet and not (fastrender.library_ready() and fastwalk.library_ready()):
        diag("compiling the fast scan kernels for this machine (once, 10-60 s) ...")

    def render(msg: Message) -> bytes:
        row = message_to_row(msg, decoder, decompress)
        return (_dumps(row) + "\n").encode(enc, errors)

    sys.stdout.flush()
    return fastrender.JsonlRenderer(sys.stdout.buffer.write, render, mode, decompress,
                                    jobs=min(fastwalk.default_jobs(), 4))


def _follow(path, from_offset, to_offset, from_end, until_idle, poll_interval, partial_timeout, decoder,
            read_body, max_record_size, limit, writer, emit, quiet) -> int:
    from rmqdump.analysis.follow import Follower, FollowNotice

    follower = Follower(path, start=from_offset, from_end=from_end and from_offset is None, end=to_offset,
                        poll_interval=poll_interval, idle_timeout=until_idle, partial_timeout=partial_timeout,
                        read_body=read_body, max_record_size=max_record_size)
    announced = False
    interrupted = False
    damage = None
    try:
        for item in follower:
            if isinstance(item, Message):
                if emit(item):
                    break
            elif isinstance(item, FollowNotice):
                if item.kind == "caught_up":
                    writer.flush()
                    if not announced and not quiet:
                        diag(f"following {follower.directory}: {item.detail} (Ctrl-C to stop)")
                    announced = True
                elif item.kind == "damage":
                    damage = item
                elif not quiet:
                    diag(item.detail, "yellow")
            if limit == 0:
                break
    except KeyboardInterrupt:
        interrupted = True
    finally:
        writer.close()
        report_body_errors(decoder, quiet)
    if damage is not None:
        diag(f"rmqdump: stopped at damage: {follower.directory / damage.file} at offset {damage.offset}: "
             f"{damage.detail}; {follower.records} records read, {writer.count} printed", "red")
        raise SystemExit(1)
    if not quiet:
        why = "interrupted" if interrupted else ("--limit" if follower.stop is None else follower.stop_detail)
        diag(f"follow stopped ({why}) at offset {follower.offset}; {follower.records} records read, "
             f"{writer.count} printed")
    return 0
