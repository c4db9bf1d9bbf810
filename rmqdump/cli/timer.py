"""`rmqdump timer`: the 5.x timer store (timerlog units, wheel slots, checkpoint, metrics) and what it still owes."""

from __future__ import annotations

import time

import click

from rmqdump.cli.options import access_options, now_option, parse_time, report_output_options, store_argument
from rmqdump.cli.output import Column, default_format, diag, emit_document, print_table, utc_ms
from rmqdump.errors import RmqdumpError
from rmqdump.fast.recovery_walk import recovery_twins
from rmqdump.findings import ERROR, WARNING
from rmqdump.store.root import Store

DOC_EXAMPLES = [["timer", "fixtures/oracle/533-timer/store", "--all", "--now", "2026-11-26T16:00:00Z"]]

ENTRY_COLUMNS = [
    Column("state", "STATE", "fixed", 0), Column("due", "DUE (UTC)", "fixed", 0),
    Column("topic", "REAL TOPIC", "text", 0, 32, 10), Column("queue_id", "Q", "num", 5),
    Column("keys", "KEYS", "text", 3, 24, 8), Column("offset_py", "CL OFFSET", "num", 0),
    Column("record", "RECORD", "fixed", 0), Column("timerlog_pos", "TIMERLOG", "num", 2),
    Column("kind", "KIND", "fixed", 4),
]
BUCKET_COLUMNS = [
    Column("bucket", "BUCKET (UTC)", "fixed", 0), Column("slot", "SLOT", "num", 1), Column("count", "PENDING", "num", 0),
    Column("topics", "TOPICS", "wrap", 0, None, 20),
]

FINDING_COLUMNS = [
    Column("severity", "SEVERITY", "fixed", 0), Column("location", "LOCATION", "fixed", 0),
    Column("kind", "KIND", "fixed", 0), Column("detail", "DETAIL", "wrap", 0, None, 30),
]

_PRECISION = {"given": "--precision-ms", "wheel": "inferred from the wheel",
              "default": "RocketMQ's default; the wheel does not show it"}


def _render(console, doc: dict) -> None:
    from rich.text import Text

    s = doc["summary"]
    cp = s["checkpoint"]
    console.print(Text(f"timer store of {doc['store']}", style="bold"))
    lines = [
        ("precision", f"{s['precision_ms']} ms ({_PRECISION[s['precision_source']]})"),
        ("timerlog", "no files" if not s["timerlog_files"] else
         f"{s['timerlog_files']} file(s) of {s['timerlog_file_size']} bytes, units end at {s['timerlog_end']}; "
         f"{s['units']} unit(s)"),
        ("wheel", "absent: the broker creates an empty one, its recovery re-links slots from the timerlog"
         if s["wheel_size"] is None
         else f"{s['wheel_size']} bytes, {s['wheel_slots_used']} slot(s) used"),
        ("checkpoint", "absent" if cp is None else
         f"lastReadTimeMs {utc_ms(cp['last_read_time_ms'])}, lastTimerLogFlushPos {cp['last_timer_log_flush_pos']}, "
         f"lastTimerQueueOffset {cp['last_timer_queue_offset']}, masterTimerQueueOffset "
         f"{cp['master_timer_queue_offset']}"),
        ("read time", f"{utc_ms(s['read_time_ms'])} (the broker delivers slots from here on)"),
        ("metrics", "absent" if s["metrics"] is None else
         ", ".join(f"{t}: {c}" for t, c in sorted(s["metrics"].items())) or "empty"),
        ("commitlog end", "unknown" if s["commitlog_end"] is None else f"{s['commitlog_end']} (after recovery)"),
        ("units", ", ".join(f"{n} {k}" for k, n in s["states"].items() if n) or "none"),
        ("timer queue", "no consumequeue/rmq_sys_wheel_timer/0" if s["timer_queue_max_offset"] is None else
         f"max offset {s['timer_queue_max_offset']}" + ("" if s["not_enqueued"] is None else
                                                        f"; the enqueue resumes at {s['enqueue_from']}: "
                                                        f"{s['not_enqueued']} record(s) to file in the timerlog")
         + (f" ({s['enqueued_again']} of them already have a unit)" if s["enqueued_again"] else "")),
    ]
    print_table(console, [Column("what", "", "fixed", 0, style="dim"), Column("value", "", "wrap", 0, None, 30)],
                lines, show_header=False)
    if doc["buckets"]:
        console.print()
        rows = [(utc_ms(b["bucket_ms"]), b["slot"], b["count"], ", ".join(f"{t} {n}" for t, n in b["topics"].items()))
                for b in doc["buckets"]]
        print_table(console, BUCKET_COLUMNS, rows, title=f"pending per delivery-time bucket ({len(rows)})")
    if doc["entries"]:
        console.print()
        rows = [(e["state"], utc_ms(e["due_ms"] or e["bucket_ms"]), e["topic"] or "?", e["queue_id"], e["keys"] or "",
                 e["offset_py"], e["record"] or "-", e["timerlog_pos"], e["kind"]) for e in doc["entries"]]
        print_table(console, ENTRY_COLUMNS, rows, title=f"timer units ({len(rows)})")
    if doc["findings"]:
        console.print()
        rows = [(f["severity"], f["file"] + (f":{f['offset']}" if f["offset"] is not None else ""), f["kind"],
                 f["detail"]) for f in doc["findings"]]
        print_table(console, FINDING_COLUMNS, rows, title=Text(f"findings ({len(rows)})", style="bold"))


@click.command()
@store_argument
@click.option("--all", "show_all", is_flag=True,
              help="List every timerlog unit with its state (delivered, expired, orphaned, dropped), not only "
                   "the pending and orphaned ones.")
@click.option("--precision-ms", type=click.IntRange(1, 86_400_000), default=None,
              help="The broker's timerPrecisionMs (default: inferred from the wheel, else 1000).")
@now_option
@report_output_options
@access_options
def timer(store, show_all, precision_ms, now, fmt, quiet, no_mmap, max_message_size):  # noqa: ARG001
    """The 5.x timer store of STORE (timerlog/, timerwheel, config/timercheck, config/timermetrics):
    every timerlog unit decoded and judged as the broker's TimerMessageStore would at its next start
    (re-linking the wheel from the log, reading from the checkpoint's read time): pending deliveries
    per delivery-time bucket with their real topic, keys, due time and commitlog record, and the
    checks verify reports (units past the commitlog end, apache/rocketmq #10668; wheel chains vs the
    log; checkpoint and metrics vs the log). Exit 1 on an error or warning finding; a store without a timer store is reported as such (exit 0)."""
    fmt = default_format(fmt, report=True)
    if fmt == "csv":
        raise click.BadParameter("timer prints one document: use table, json or jsonl", param_hint="--format")
    now_ms = parse_time(now, "--now") if now is not None else int(time.time() * 1000)
    st = Store.open(store)
    from rmqdump.analysis.timer import ORPHANED, PENDING, has_timer_store, predicted_queue_end, read_timer_state
    from rmqdump.analysis.verify.record_cache import RecordCache
    from rmqdump.analysis.verify.timer_checks import check_timer
    from rmqdump.broker.recovery import predict_recovery_auto

    if not has_timer_store(st.root):
        if not quiet:
            diag("no timer store here (no timerlog/, timerwheel or config/timercheck: timerWheelEnable was false, "
                 "or a 4.x broker)")
        if fmt in ("json", "jsonl"):
            emit_document({"store": str(st.root or store), "summary": None, "buckets": [], "entries": [],
                           "findings": []}, fmt, _render)
        return
    commitlog_end = queue_end = None
    try:
        pred, _ = predict_recovery_auto(st, check_crc=True, use_mmap=not no_mmap, list_limit=0, list_dropped=False,
                                       **recovery_twins(st.commitlog, not no_mmap))
        commitlog_end, queue_end = pred.max_offset, predicted_queue_end(pred)
    except RmqdumpError as e:  # the records are then judged where they lie
        if not quiet:
            diag(f"commitlog end after recovery unknown ({e}): records are judged where they lie", "yellow")
    cache = RecordCache(st.commitlog, not no_mmap)
    try:
        ts = read_timer_state(st.root, now_ms=now_ms, precision_ms=precision_ms,
                              decode=lambda off: cache.decode(off, check_crc=True), commitlog_end=commitlog_end, decode_all=show_all,
                              queue_end=queue_end)
        findings = check_timer(ts)
    finally:
        cache.close()
    shown = ts.entries if show_all else [e for e in ts.entries if e.state in (PENDING, ORPHANED)]
    doc = {"store": str(st.root), "summary": ts.summary(), "buckets": ts.buckets(),
           "entries": [e.to_dict() for e in shown], "findings": [f.to_dict() for f in findings]}
    emit_document(doc, fmt, _render)
    if any(f.severity in (ERROR, WARNING) for f in findings):
        raise SystemExit(1)


def report_timer_state(st: Store, hits, now_ms: int | None = None) -> None:
    """For ``lookup``: on stderr, the timer state of each found record of the timer topic (its timerlog unit)."""
    from rmqdump.analysis.timer import has_timer_store, read_timer_state
    from rmqdump.codec.layout import TIMER_TOPIC

    timer_hits = [h for h in hits if getattr(h, "topic", None) == TIMER_TOPIC]
    if not timer_hits or not has_timer_store(st.root):
        return
    ts = read_timer_state(st.root, now_ms=now_ms if now_ms is not None else int(time.time() * 1000))
    by_offset = {e.unit.offset_py: e for e in ts.entries}
    for h in timer_hits:
        e = by_offset.get(h.offset)
        if e is None:
            behind = ts.not_enqueued
            diag(f"timer: the record at {h.offset} has no timerlog unit"
                 + (f" ({behind} timer-topic record(s) are to be enqueued when the broker starts)" if behind else ""))
        else:
            diag(f"timer: the record at {h.offset} is {e.state} ({e.kind}), due {utc_ms(e.bucket_ms)}, wheel slot "
                 f"{e.slot}, timerlog/{e.file}@{e.unit.pos} (rmqdump timer for the whole store)")
