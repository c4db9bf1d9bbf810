"""`rmqdump verify`: check a store, predict the broker's startup recovery, report what can be saved."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

from rmqdump.analysis.verify import verify_store
from rmqdump.broker.recovery.walk import ends_at_last_blank
from rmqdump.cli.options import access_options, report_output_options, verify_options
from rmqdump.cli.output import (
    Column,
    default_format,
    diag,
    emit_document,
    escape_control,
    preload_rich,
    print_table,
    progress_bar,
)
from rmqdump.codec.layout import record_size_limit
from rmqdump.findings import ERROR, INFO, WARNING
from rmqdump.store.root import Store

if TYPE_CHECKING:  # rich loads only for the table report
    from rich.console import Console
    from rich.text import Text

_STYLE = {ERROR: "bold red", WARNING: "yellow", INFO: "cyan"}
_TITLE = {ERROR: "Errors", WARNING: "Warnings", INFO: "Info"}
#: commitlog bytes from which verify imports rich on a second thread while it walks (smaller stores: no thread)
PRELOAD_BYTES = 64 << 20


@click.command()
@click.argument("path", type=click.Path(exists=True, path_type=str), metavar="PATH")
@verify_options
@report_output_options
@access_options
def verify(path, keep_going, broker_version, commitlog_only, delay_levels, list_limit, max_findings, fmt, quiet,
           no_mmap, max_message_size):
    """Verify the store at PATH (a store root, its commitlog/ directory or one segment file).

    Checks every record, the segments, consume queues, index files, checkpoint, config and
    lock; predicts what the broker's next start would do (recovery mode, where the
    commitlog would end, which records, consume-queue entries and index files it would
    drop); with --keep-going lists the intact records beyond damage. Exit 0 clean, 1 errors
    found, 2 could not run.
    """
    fmt = default_format(fmt, report=True)
    if fmt == "csv":
        raise click.BadParameter("verify prints one document: use table, json or jsonl", param_hint="--format")
    store = Store.open(path)
    total = sum(s.size for s in store.commitlog.segments)
    if fmt == "table" and total >= PRELOAD_BYTES:
        preload_rich()  # the report needs it at the end
    if not quiet and not no_mmap and _fast_needs_build(store):
        diag("verify: compiling the fast kernels once for this machine (10-30 s)")
    began = time.monotonic()
    with progress_bar(total, "verifying", not quiet) as update:
        report = verify_store(
            store, keep_going=keep_going, use_mmap=not no_mmap, version=broker_version,
            store_checks=not commitlog_only, delay_levels_ms=delay_levels, list_limit=list_limit,
            max_findings_per_kind=max_findings,
            max_record_size=record_size_limit(max_message_size),
            progress=lambda done, _total: update(done),
        )
    doc = report.to_dict()
    from rmqdump.broker.recovery.cost import next_start_after_walk

    doc["next_start"] = next_start_after_walk(report.recovery, store, total, time.monotonic() - began)
    emit_document(doc, fmt, render_report)
    if not quiet and fmt != "table":
        s = report.summary
        diag(f"verify: {s['status']}: {s['errors']} errors, {s['warnings']} warnings, {s['infos']} info; "
             f"predicted commitlog end {s['predicted_max_offset']}", "red" if s["errors"] else None)
    if report.exit_code:
        raise SystemExit(report.exit_code)
    return 0


def _fast_needs_build(store: Store) -> bool:
    """Whether this run takes the compiled path and its shared library is not built yet."""
    from rmqdump.fast import walk as fastwalk

    return any(fastwalk.use_fast(s.size) for s in store.commitlog.segments) and not fastwalk.library_ready()


def _safe(s) -> str:
    """Terminal-safe text: control characters escaped, newlines and tabs included."""
    return escape_control(str(s)).replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")


def _t(s) -> Text:
    from rich.text import Text

    return Text(_safe(s))


class _Rows:
    """Collects the two-column rows of the recovery prediction."""

    def __init__(self) -> None:
        self.rows: list[tuple] = []

    def add_row(self, *cells) -> None:
        self.rows.append(cells)


def _end_moves(summary: dict, rec: dict) -> bool:
    """Whether the broker's start would cut what the walk read: records dropped, or an end before the walk's
    other than a last file's BLANK (RocketMQ ends at that BLANK and its next write covers it)."""
    moved = rec["max_offset"] != summary["valid_end"] and not ends_at_last_blank(rec)
    return bool(rec["dropped_records"]["count"]) or moved


def render_report(console: Console, doc: dict) -> None:
    """The human report: summary, recovery prediction, salvage, findings grouped by severity."""
    from rich.text import Text

    s = doc["summary"]
    status = Text("DAMAGED" if s["errors"] else "CLEAN", style="bold red" if s["errors"] else "bold green")
    head = Text("rmqdump verify ")
    head.append(_safe(doc["store"]), style="bold")
    console.print(head)
    line = Text("Summary: ")
    line.append_text(status)
    line.append(f" — {s['errors']} errors, {s['warnings']} warnings, {s['infos']} info · {s['records']} records "
                 f"in {s['segments']} segment(s) · valid data ends at {s['valid_end']}")
    console.print(line)
    rec = doc.get("recovery")
    if rec:
        console.print()
        console.print(Text(f"Recovery prediction (broker {rec['version']}.x)", style="bold"))
        t = _Rows()
        if s.get("broker_model_reason"):
            t.add_row("model", _t(s["broker_model_reason"]))
        t.add_row("mode", _t(f"{rec['mode']} — {rec['reason']}"))
        if rec.get("start_failures"):
            from rmqdump.broker.recovery.start import describe

            t.add_row("broker start", Text(_safe(describe(rec["start_failures"])), style="bold red"))
        stop = rec.get("stop") or {}
        t.add_row("walk", _t(f"from {rec['start_file']} ({rec['records_walked']} records accepted); stops at "
                             f"{stop.get('offset')}: {stop.get('kind')}: {stop.get('detail')}"))
        end = Text(_safe(str(rec["max_offset"])), style="bold red" if _end_moves(s, rec) else "green")
        if rec["truncated_file"]:
            end.append(_safe(f"  ({rec['truncated_file']['file']} truncated at position "
                                      f"{rec['truncated_file']['position']})"))
        t.add_row("commitlog end", end)
        if rec["deleted_commitlog_files"]:
            t.add_row("deleted files", _t(", ".join(rec["deleted_commitlog_files"])))
        d = rec["dropped_records"]
        if d["count"]:
            topics = ", ".join(f"{k} {v}" for k, v in d["topics"].items())
            t.add_row("dropped records", Text(_safe(
                f"{d['count']} ({d['intact']} intact, {d['damaged']} damaged), first at "
                f"{d['first_offset'] if d['first_offset'] is not None else d['damaged_ranges'][0]['start']}"
                + (f"; topics: {topics}" if topics else "")), style="red"))
        else:
            t.add_row("dropped records", _t("none"))
        cq = rec["dropped_cq_entries"]
        if cq["count"]:
            qs = ", ".join(f"{k} {v['count']}" for k, v in sorted(cq["queues"].items()))
            t.add_row("dropped CQ entries", Text(_safe(f"{cq['count']}: {qs}"), style="red"))
        else:
            t.add_row("dropped CQ entries", _t("none"))
        kept = rec.get("invalid_cq_units_kept") or {}
        if kept:
            qs = ", ".join(f"{k} at {v['queue_offset']}" for k, v in sorted(kept.items()))
            t.add_row("invalid CQ units kept", Text(_safe(f"{len(kept)}: {qs}"), style="yellow"))
        rd = rec.get("redispatched_cq_entries") or {"count": 0}
        if rd["count"]:
            qs = ", ".join(f"{k} +{v['count']}" for k, v in sorted(rd["queues"].items()))
            t.add_row("re-dispatched CQ entries", _t(f"{rd['count']}: {qs}"))
        if rec["deleted_index_files"]:
            t.add_row("deleted index files", _t(", ".join(f"{f['file']} ({f['entries']} entries)"
                                                          for f in rec["deleted_index_files"])))
        else:
            t.add_row("deleted index files", _t("none"))
        if rec["accepted_damaged"]:
            t.add_row("accepted although damaged", Text(_safe(", ".join(
                f"{a['offset']} {a['kind']}" for a in rec["accepted_damaged"][:20])), style="yellow"))
        if rec["unchecked_damage"]:
            t.add_row("damage recovery never reads", Text(_safe(", ".join(
                f"{a['offset']} {a['kind']}" for a in rec["unchecked_damage"][:20])), style="yellow"))
        for n in rec["notes"]:
            t.add_row("note", _t(n))
        for n in rec["version_notes"]:
            t.add_row("other versions", _t(n))
        print_table(console, [Column("what", "", "fixed", 0, style="dim"), Column("value", "", "wrap", 0, None, 30)],
                    t.rows, show_header=False)
    if doc.get("next_start"):
        _render_next_start(console, doc["next_start"])
    sal = doc.get("salvage")
    if sal is not None:
        console.print()
        console.print(Text("Salvage (--keep-going)", style="bold"))
        if sal["first_damage"] is None:
            console.print(Text("  no damaged range: nothing to salvage"))
        else:
            console.print(_t(f"  {sal['intact_records_after_damage']} intact records after the first damage at "
                             f"{sal['first_damage']}; {len(sal['damaged_ranges'])} damaged range(s): "
                             + ", ".join(f"[{r['start']}, {r['end']}) {r['kind']}" for r in sal["damaged_ranges"][:10])))
            if sal["broker_would_drop_intact"]:
                console.print(Text(_safe(
                    f"  the broker would discard {sal['broker_would_drop_intact']} intact records: repair or "
                    "export them before starting it"), style="yellow"))
    for sev in (ERROR, WARNING, INFO):
        items = [f for f in doc["findings"] if f["severity"] == sev]
        if not items:
            continue
        console.print()
        rows = []
        for f in items:
            where = f["file"] or "-"
            if f["offset"] is not None:
                where += f":{f['offset']}"
            rows.append((_t(where), _t(f["kind"]), _t(f["detail"])))
        columns = [Column("location", "LOCATION", "fixed", 0), Column("kind", "KIND", "fixed", 0, style=_STYLE[sev]),
                   Column("detail", "DETAIL", "wrap", 0, None, 36)]
        print_table(console, columns, rows, title=Text(f"{_TITLE[sev]} ({len(items)})", style=_STYLE[sev]))


def _render_next_start(console: Console, ns: dict) -> None:
    """The short "next start" block: what recovery reads, why it starts there, the estimate, what shortens it."""
    from rich.text import Text

    from rmqdump.broker.recovery.cost import human_bytes, human_seconds, start_gate

    console.print()
    console.print(Text("Next start (an estimate)", style="bold"))
    t = _Rows()
    if not ns.get("estimated"):
        t.add_row("not estimated", _t(ns.get("why_not")))
    else:
        gate, stop = start_gate(ns)
        head = f"once {gate}: " if gate else ""
        t.add_row("commitlog", _t(f"{head}{ns['mode']} recovery reads {ns['commitlog_files']} of "
                                  f"{ns['commitlog_files_total']} file(s), {human_bytes(ns['commitlog_bytes'])} "
                                  f"from {ns['start_file']} ({ns['records']} records, CRC checked)"))
        t.add_row("why", _t(ns["start_reason"]))
        if stop:
            t.add_row("then", Text(_safe(f"the broker stops: {stop}"), style="red"))
        cq, idx, rd = ns["consume_queues"], ns["index_files"], ns["redispatch"]
        t.add_row("consume queues", _t(f"{cq['files_loaded']} file(s) of {cq['queues']} queue(s) loaded, "
                                       f"{cq['files_recovered']} walked; re-dispatch of {rd['records']} record(s) "
                                       f"writes {rd['cq_entries_written']} entries"))
        t.add_row("index files", _t(f"{idx['loaded']} loaded, {idx['deleted']} deleted"))
        t.add_row("time", _t(f"{human_seconds(ns['estimated_seconds'])} at {ns['rate']['detail']}"))
        for s in ns["shorter"]:
            t.add_row("shorter", _t(s["detail"]))
    print_table(console, [Column("what", "", "fixed", 0, style="dim"), Column("value", "", "wrap", 0, None, 30)],
                t.rows, show_header=False)
