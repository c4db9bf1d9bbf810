"""`rmqdump consumers`: committed offsets, max offsets and lag per group; unconsumed messages."""

from __future__ import annotations

import click

from rmqdump.analysis.consumers import LAG_FIELDS, consumer_lag, iter_unconsumed
from rmqdump.broker.systopics import resolve
from rmqdump.cli.options import (
    access_options,
    body_decoder_options,
    crc_option,
    resolve_body_decoder,
    store_argument,
)
from rmqdump.cli.output import FORMATS, Column, RecordWriter, default_format, diag, report_body_errors, utc_ms
from rmqdump.codec.layout import record_size_limit
from rmqdump.codec.record import Message
from rmqdump.errors import StoreError
from rmqdump.rows.bodyfmt import message_to_row
from rmqdump.rows.schema import FIELDS
from rmqdump.store.root import Store

LAG_COLUMNS = [
    Column("group", "GROUP", "text", 0, 32, 12), Column("topic", "TOPIC", "text", 0, 32, 12),
    Column("queue_id", "Q", "num", 0), Column("committed", "COMMITTED", "num", 1), Column("min_offset", "MIN", "num", 2),
    Column("max_offset", "MAX", "num", 1), Column("lag", "LAG", "num", 0), Column("deleted", "DELETED", "num", 3),
    Column("at_risk", "AT RISK", "num", 4), Column("note", "NOTE", "wrap", 0, None, 30),
]
MSG_COLUMNS = [
    Column("group", "GROUP", "text", 2, 24, 10), Column("topic", "TOPIC", "text", 1, 32, 12),
    Column("queue_id", "Q", "num", 4), Column("queue_offset", "QOFF", "num", 3), Column("offset", "OFFSET", "num", 0),
    Column("store_time", "STORE TIME (UTC)", "fixed", 6),
    Column("tags", "TAGS", "text", 8, 16, 6), Column("keys", "KEYS", "text", 7, 32, 10),
]


@click.command()
@store_argument
@click.option("--group", "-g", "groups", multiple=True, help="Only this consumer group (repeatable).")
@click.option("--topic", "-t", "topics", multiple=True, help="Only this topic (repeatable).")
@click.option("--unconsumed", is_flag=True,
              help="Print the messages each group has not consumed (CQ entries from the committed offset to "
                   "the max offset, decoded from the commitlog) instead of the lag table.")
@click.option("--resolve", "do_resolve", is_flag=True,
              help="With --unconsumed: add the real destination of system-topic records (`resolved` field).")
@crc_option()
@click.option("--format", "-f", "fmt", type=click.Choice(FORMATS), default=None,
              help="Output format (default: table, plain text when piped; with --unconsumed jsonl when piped).")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary lines on stderr.")
@body_decoder_options
@access_options
def consumers(store, groups, topics, unconsumed, do_resolve, crc, fmt, quiet, body_mode, decompress, no_mmap,
              max_message_size):
    """Consumer progress of STORE: for every topic@group in config/consumerOffset.json (fastjson,
    .bak fallback) and every queue of that topic, the committed offset, the ConsumeQueue's min
    and max offset and the lag (max - committed). With --unconsumed, the messages never
    consumed (the question after a disk is pulled from a dead broker), e.g. as JSONL with
    -f jsonl. Offsets are persisted every few seconds, so after a crash this is an upper bound.
    DELETED counts the messages deleted before the group consumed them (committed below the
    queue's min offset: forced deletion on a full disk, or expiry); -f json adds their queue and
    commitlog offsets and bounds of their store times. AT RISK counts the unconsumed messages in
    the oldest commitlog segment, the next one deletion removes.
    Exit 1 if a CQ entry in the unconsumed range points at a bad record."""
    fmt = default_format(fmt, report=not unconsumed)  # the lag table is a report, --unconsumed records
    st = Store.open(store)
    if st.root is None:
        raise StoreError("consumers needs a store root (with config/ and consumequeue/), not commitlog files",
                         store)
    report = consumer_lag(st.root, tuple(groups), tuple(topics), st.commitlog.min_offset,
                          commitlog=None if unconsumed else st.commitlog)
    if report.offsets_file is None:
        raise StoreError("no config/consumerOffset.json (nor .bak): no consumer offsets to compare",
                         st.root / "config" / "consumerOffset.json")
    if not quiet:
        if report.used_backup:
            diag(f"using {report.offsets_file} (the main file is missing, empty or unreadable)", "yellow")
        for p in report.problems:
            diag(p, "yellow")
    if not unconsumed:
        w = RecordWriter(fmt, LAG_FIELDS, LAG_COLUMNS)
        try:
            for r in report.rows:
                w.write(r.to_dict())
        finally:
            w.close()
        if not quiet:
            lags = report.total_lag()
            diag(f"{len(report.rows)} queues of {len(lags)} groups from {report.offsets_file}; total lag: "
                 + (", ".join(f"{g} {n}" for g, n in sorted(lags.items())) or "none"))
            for line in _deletion_summary(report, st.commitlog):
                diag(line, "yellow")
        return 0
    decoder = resolve_body_decoder(body_mode, fmt)
    columns = ["group", *FIELDS] + (["resolved"] if do_resolve else [])
    from rmqdump.cli.scan import BODY_COLUMN

    w = RecordWriter(fmt, columns, MSG_COLUMNS + ([BODY_COLUMN] if decoder.needs_body else []))
    problems = 0
    try:
        for u in iter_unconsumed(report, st.root, st.commitlog, read_body=decoder.needs_body, check_crc=crc != "off",
                                 use_mmap=not no_mmap,
                                 max_record_size=record_size_limit(max_message_size)):
            if u.problem:
                problems += 1
                diag(f"{u.lag.group}: {u.problem}", "red")
            if not isinstance(u.message, Message):
                continue
            row = {"group": u.lag.group,
                   **message_to_row(u.message, decoder, decompress, as_text=fmt in ("table", "csv"))}
            if do_resolve:
                row["resolved"] = resolve(u.message)
            if fmt == "table":
                row["store_time"] = utc_ms(u.message.store_timestamp)
            w.write(row)
    finally:
        w.close()
        report_body_errors(decoder, quiet)
    if not quiet:
        diag(f"{w.count} unconsumed messages in {sum(1 for r in report.rows if r.unconsumed_range)} queues"
             + (f"; {problems} bad CQ entries" if problems else ""))
    if problems:
        raise SystemExit(1)
    return 0


def _deletion_summary(report, commitlog) -> list[str]:
    """Per group: what was deleted before consumption (with its time bounds) and what is at risk next."""
    out = []
    groups = sorted({r.group for r in report.rows})
    oldest = commitlog.segments[0].name if commitlog.segments else None
    for g in groups:
        rows = [r for r in report.rows if r.group == g]
        dels = [r.deleted for r in rows if r.deleted is not None]
        if dels:
            n = sum(d.count for d in dels)
            after = {d.stored_not_after for d in dels} - {None}
            before = [d.stored_not_before for d in dels]
            when = f"stored no later than {utc_ms(max(after))} (the oldest remaining record: a bound)" if after \
                else "store times unknown"
            if all(b is not None for b in before):
                when += f" and no earlier than {utc_ms(min(before))} (an index file's begin: a bound)"
            out.append(f"{g}: {n} messages deleted before consumption in {len(dels)} queues ("
                       + ", ".join(f"{r.topic}/{r.queue_id} [{r.deleted.queue_offsets[0]}, "
                                   f"{r.deleted.queue_offsets[1]})" for r in rows if r.deleted is not None)
                       + f"); {when}")
        risk = sum(r.at_risk or 0 for r in rows)
        if risk:
            size = sum(r.at_risk_bytes or 0 for r in rows)
            lag = sum(max(r.lag or 0, 0) for r in rows)
            out.append(f"{g}: {risk} of its {lag} unconsumed messages ({size} bytes) are in the oldest commitlog "
                       f"segment {oldest}, the next one forced deletion or expiry removes")
    return out
