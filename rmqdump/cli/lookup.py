"""`rmqdump lookup`: find messages by key, client id, offsetMsgId, queue position or offset."""

from __future__ import annotations

import click

from rmqdump.cli.geometry import geometry_options, resolve
from rmqdump.cli.options import (
    access_options,
    body_decoder_options,
    limit_option,
    output_options,
    parse_window,
    resolve_body_decoder,
    store_argument,
    time_window_options,
)

#: unreadable index targets listed one per line before the rest are counted
MAX_LISTED = 10
#: README examples (scripts/gen_docs.py): a hit with its skew, and a window that explains a "not found"
DOC_EXAMPLES: list[list[str]] = [
    ["lookup", "fixtures/store", "--key", "k1"],
    ["lookup", "fixtures/store", "--key", "big-zlib", "--since", "2026-11-01T00:00:03Z"],
]


@click.command()
@store_argument
@click.option("--key", "-k", default=None, help="A KEYS element or UNIQ_KEY, looked up through the index.")
@click.option("--uniq-key", default=None, metavar="ID", help="A client message id (UNIQ_KEY, 32 or 56 hex chars).")
@click.option("--msg-id", default=None, metavar="ID", help="A broker offsetMsgId (store host + commitlog offset).")
@click.option("--queue", "queue", type=(str, int, int), default=None, metavar="TOPIC QID QOFFSET",
              help="A consume queue position.")
@click.option("--offset", "phys", type=click.IntRange(0), default=None, metavar="PHYS",
              help="A commitlog offset (where a record starts).")
@click.option("--topic", "-t", default=None,
              help="Topic of --key/--uniq-key (without it every topic the store names is searched).")
@time_window_options
@limit_option("Print at most N records (newest first); says so on stderr when more exist.")
@click.option("--scan", "force_scan", is_flag=True, help="Walk the whole commitlog instead of using the index.")
@click.option("--show-collisions", is_flag=True,
              help="List the records that share the key's hash but not its topic/key (stderr).")
@output_options
@body_decoder_options
@access_options
@geometry_options
def lookup(store, key, uniq_key, msg_id, queue, phys, topic, since, until, limit, force_scan, show_collisions, fmt,
           quiet, body_mode, decompress, no_mmap, max_message_size, index_slots, index_entries, broker_config):
    """Find messages in STORE and print them in the scan JSONL schema, newest first.

    Exactly one of --key, --uniq-key, --msg-id, --queue, --offset. Key lookups go through the
    IndexFile like the broker's queryMsgByKey, without its 64-result cap, and decode every hit
    to confirm its topic and KEYS/UNIQ_KEY: hash collisions are counted, never printed. When
    the index is missing, would be deleted by the broker's crash recovery, or does not cover
    the commitlog or the time window, the uncovered commitlog is walked and stderr says why.
    Key lookups add each hit's born-vs-store skew (`timing` in JSON; SKEW in the table) and the
    time window the broker's own query would use (a query by key: the caller's window; by client
    id: from the id's time minus 1 s), saying on stderr which hits that query would miss (a
    producer clock ahead of the broker's, apache/rocketmq #681); a window that finds nothing lists
    the key's records outside it.
    Exit 0 found, 1 nothing found, 2 error (bad id, unknown queue, offset out of range).
    """
    from rmqdump.cli.output import default_format

    chosen = [n for n, v in (("--key", key), ("--uniq-key", uniq_key), ("--msg-id", msg_id), ("--queue", queue),
                             ("--offset", phys)) if v is not None]
    if len(chosen) != 1:
        raise click.UsageError("give exactly one of --key, --uniq-key, --msg-id, --queue, --offset"
                               + (f" (got {', '.join(chosen)})" if chosen else ""))
    keyed = chosen[0] in ("--key", "--uniq-key")
    if not keyed:
        for name, v in (("--topic", topic), ("--since", since), ("--until", until), ("--limit", limit)):
            if v is not None:
                raise click.UsageError(f"{name} only applies to --key and --uniq-key")
        if force_scan or show_collisions:
            raise click.UsageError("--scan and --show-collisions only apply to --key and --uniq-key")
    lo, hi = parse_window(since, until)
    fmt = default_format(fmt)
    decoder = resolve_body_decoder(body_mode, fmt)

    from rmqdump.analysis import lookup as lib
    from rmqdump.store.root import Store

    st = Store.open(store)
    geo = resolve(st, index_slots, index_entries, broker_config, max_message_size,
                  ("commitlog", "index") if keyed else ("commitlog",))
    use_mmap = not no_mmap
    if keyed:
        res = _keyed(lib, st, geo, key, uniq_key, topic, lo, hi, limit, force_scan, use_mmap, quiet)
    elif msg_id is not None:
        res = lib.lookup_msg_id(st, msg_id, use_mmap=use_mmap, geometry=geo)
    elif queue is not None:
        res = lib.lookup_queue(st, queue[0], queue[1], queue[2], use_mmap=use_mmap, geometry=geo)
    else:
        res = lib.lookup_offset(st, phys, use_mmap=use_mmap, geometry=geo)
    _print_records(res, fmt, decoder, decompress, geo)
    _report(res, keyed, limit, show_collisions, quiet)
    if not quiet and st.root is not None:
        from rmqdump.cli.timer import report_timer_state

        report_timer_state(st, res.hits)
    if not res.hits:
        raise SystemExit(1)


def _keyed(lib, st, geo, key, uniq_key, topic, lo, hi, max_num, force_scan, use_mmap, quiet):
    from rmqdump.cli.output import progress_bar

    cl = st.commitlog
    total = sum(s.size for s in cl.segments)
    with progress_bar(total, "scanning", not quiet) as update:
        kwargs = dict(begin=lo, end=hi, max_num=max_num, force_scan=force_scan, geometry=geo, use_mmap=use_mmap,
                      progress=lambda off: update(max(0, off - cl.min_offset)))
        if uniq_key is not None:
            return lib.lookup_uniq_key(st, uniq_key, topic, **kwargs)
        return lib.lookup_key(st, topic, key, **kwargs)


def _skew(ms: int) -> str:
    return f"{ms:+d} ms" if abs(ms) < 10_000 else f"{ms / 1000:+.1f} s"


def _print_records(res, fmt: str, decoder, decompress: bool, geo) -> None:
    from rmqdump.cli.output import Column, RecordWriter, report_body_errors, utc_ms
    from rmqdump.rows.bodyfmt import message_to_row
    from rmqdump.rows.schema import FIELDS

    timing = {t.offset: t for t in res.timing}
    columns = ()
    if fmt == "table":
        from rmqdump.cli.scan import table_columns

        columns = table_columns(decoder) + ([Column("skew", "SKEW", "num", 5)] if timing else [])
    writer = RecordWriter(fmt, (*FIELDS, "timing") if timing else FIELDS, columns)
    try:
        for rec in res.hits:
            row = message_to_row(rec, decoder, decompress, fmt in ("table", "csv"), geo.delay_levels_ms)
            t = timing.get(rec.offset)
            if t is not None:
                row["timing"] = t.to_dict() if fmt != "csv" else _skew(t.skew_ms)
            if fmt == "table":
                row["store_time"] = utc_ms(rec.store_timestamp)
                if t is not None:
                    row["skew"] = _skew(t.skew_ms)
            writer.write(row)
    finally:
        writer.close()
        report_body_errors(decoder, False)


def _report(res, keyed: bool, max_num: int | None, show_collisions: bool, quiet: bool) -> None:
    from rmqdump.cli.output import diag

    for reason in res.reasons:
        diag(f"rmqdump: commitlog scan: {reason}", "yellow")
    for w in res.warnings:
        diag(f"rmqdump: warning: {w}", "yellow")
    for off, why in res.unreadable[:MAX_LISTED]:
        diag(f"rmqdump: warning: the index points at offset {off}, where no valid record starts: {why}", "yellow")
    if len(res.unreadable) > MAX_LISTED:
        diag(f"rmqdump: warning: {len(res.unreadable) - MAX_LISTED} more index entries point at no valid record",
             "yellow")
    if res.truncated:
        diag(f"rmqdump: truncated: more than {max_num} records match; raise --limit to see them", "bold yellow")
    if not keyed:
        return
    _report_timing(res, quiet)
    if show_collisions:
        for c in res.collisions:
            diag(f"collision: offset {c.offset}: {c.reason}: topic {c.topic!r}, keys {c.keys}, "
                 f"uniq_key {c.uniq_key}")
    elif res.collisions and not quiet:
        c = len(res.collisions)
        diag(f"{c} hash collision{'' if c == 1 else 's'} skipped (records of other keys or topics in the same index "
             "chain); --show-collisions lists them")
    if not quiet:
        scanned = sum(b - a for a, b in res.scanned)
        via = {"index": "the index", "scan": "a commitlog scan", "index+scan": "the index and a commitlog scan"}
        more = " (truncated)" if res.truncated else ""
        extra = f", {scanned} commitlog bytes walked" if scanned and res.source != "index" else ""
        topics = f", {res.topics_searched} topics searched" if res.topics_searched > 1 else ""
        n, c = len(res.hits), len(res.collisions)
        hint = "; --scan also finds records the broker never indexes (ROLLBACK)" if not n and res.source == "index" \
            else ""
        diag(f"{n} record{'' if n == 1 else 's'} found{more} via {via.get(res.source, res.source)}"
             f"{topics}, {c} collision{'' if c == 1 else 's'}{extra}{hint}")


def _report_timing(res, quiet: bool) -> None:
    """The broker's query window, the hits it would miss, and the key's records outside an empty window."""
    from rmqdump.analysis.lookup.result import _iso
    from rmqdump.cli.output import diag

    def when(ms: int) -> str:
        return "Long.MAX_VALUE" if ms >= (1 << 63) - 1 else ("0" if ms == 0 else _iso(ms))

    shown = res.timing or res.outside_window
    if shown and not quiet:
        lo, hi = shown[0].window
        diag(f"the broker's query window: {when(lo)} .. {when(hi)} ({shown[0].how}); it compares the index time (the "
             "store time cut to whole seconds after the index file's first record)")
    for t in res.timing:
        if t.in_window is not True:
            diag(f"rmqdump: warning: record at {t.offset} (born {_iso(t.born_timestamp)}, stored "
                 f"{_iso(t.store_timestamp)}, skew {_skew(t.skew_ms)}): {t.note}", "yellow")
    if res.outside_window:
        lo, hi = res.outside_window[0].window
        diag(f"rmqdump: nothing stored between {when(lo)} and {when(hi)}, but {len(res.outside_window)} record(s) "
             "with this key lie outside that window:", "yellow")
        for t in res.outside_window:
            born_in = lo <= t.born_timestamp <= hi
            diag(f"  offset {t.offset}: born {_iso(t.born_timestamp)}{' (inside the window)' if born_in else ''}, "
                 f"stored {_iso(t.store_timestamp)} (skew {_skew(t.skew_ms)})"
                 + ("; the producer's clock and the broker's disagree: widen the window by the skew" if born_in
                    else ""), "yellow")
