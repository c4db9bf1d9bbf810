"""`rmqdump cq`: consume queues — per-queue min/max offsets and gaps, or their entries."""

from __future__ import annotations

import click

from rmqdump.cli.geometry import broker_config_option, resolve
from rmqdump.cli.options import output_options, store_argument
from rmqdump.cli.output import Column

TABLE_COLUMNS = [
    Column("topic", "TOPIC", "text", 3, 32, 12), Column("queue_id", "Q", "num", 3), Column("queue_offset", "QOFF", "num", 0),
    Column("commit_log_offset", "OFFSET", "num", 0), Column("size", "SIZE", "num", 2),
    Column("tags_code", "TAGSCODE", "num", 4), Column("status", "STATUS", "fixed", 1), Column("file", "FILE", "fixed", 5),
]
SUMMARY_COLUMNS = [
    Column("topic", "topic", "text", 0, 32, 12), Column("queue", "queue", "num", 0, justify="right"),
    Column("files", "files", "num", 3, justify="right"), Column("min", "min offset", "num", 0, justify="right"),
    Column("max", "max offset", "num", 0, justify="right"), Column("entries", "entries", "num", 2, justify="right"),
    Column("maxphy", "max physic offset", "num", 1, justify="right"),
    Column("notes", "notes", "wrap", 0, None, 30, style="yellow"),
]


def _notes(q: dict) -> str:
    notes = []
    if q.get("holes"):
        notes.append(f"{q['holes']} invalid units (first at {q['hole_offsets'][:3]})")
    if q.get("pre_blank"):
        notes.append(f"{q['pre_blank']} pre-blank units")
    for m in q.get("missing_files", []):
        notes.append(f"missing {m['files']} file(s) for queue offsets {m['from_queue_offset']}..{m['to_queue_offset']}")
    if q.get("truncated_by_recovery"):
        notes.append(f"recovery would delete {', '.join(q['truncated_by_recovery'])}")
    notes.extend(q.get("problems", []))
    if q.get("stray_files"):
        notes.append(f"stray files: {', '.join(q['stray_files'])}")
    return "; ".join(notes)


def render(console, doc: dict) -> None:
    from rich.text import Text

    from rmqdump.cli.output import escape_control, print_table

    rows = [(q["topic"], q["queue_id"], len(q["files"]), q["min_offset"], q["max_offset"], q["entries"],
             q["max_physic_offset"], _notes(q)) for q in doc["queues"]]
    print_table(console, SUMMARY_COLUMNS, rows,
                title=f"consume queues (file size {doc['file_size']}, {doc['file_size_source']})")
    for e in doc["errors"]:
        console.print(Text(escape_control(e), style="red"))


def _has_findings(doc: dict) -> bool:
    return bool(doc["errors"]) or any(q.get("holes") or q.get("missing_files") or q.get("problems")
                                      or q.get("truncated_by_recovery") for q in doc["queues"])


@click.command()
@store_argument
@click.option("--topic", "-t", default=None, help="Only this topic's queues.")
@click.option("--queue", "queue_id", type=int, default=None, help="Only this queue id.")
@click.option("--entries", "mode", flag_value="entries", default=None,
              help="Print entries (default when both --topic and --queue are given).")
@click.option("--summary", "mode", flag_value="summary", help="Print the per-queue summary (the default otherwise).")
@click.option("--raw", is_flag=True,
              help="With entries: every non-zero unit of every file, also past the end the broker recovers to.")
@output_options
@broker_config_option
def cq(store, topic, queue_id, mode, raw, fmt, quiet, broker_config):
    """Dump the consume queues of STORE.

    Summary: per queue its files, min offset (first entry at or after the commitlog's min
    offset), max offset (after the broker's recovery scan), entry count, maxPhysicOffset,
    invalid units, missing files and files the recovery would delete; exit 1 if any.
    Entries: queue offset, commitlog offset, size, tagsCode and status (valid, invalid,
    pre_blank) of each unit in the broker's view [first file start, max offset).
    """
    from rmqdump.analysis.dumps import CQ_ENTRY_FIELDS, cq_entries, cq_summary
    from rmqdump.cli.output import RecordWriter, default_format, emit_document
    from rmqdump.errors import NotFoundError
    from rmqdump.store.root import Store

    if mode is None:
        mode = "entries" if topic is not None and queue_id is not None else "summary"
    if raw and mode != "entries":
        raise click.UsageError("--raw applies to entries")
    fmt = default_format(fmt)
    st = Store.open(store)
    if st.root is None:
        raise NotFoundError("cq needs a store root (only commitlog files were given)", store)
    geo = resolve(st, None, None, broker_config, None, ("consumequeue",))
    if mode == "entries":
        writer = RecordWriter(fmt, CQ_ENTRY_FIELDS, TABLE_COLUMNS)
        try:
            for row in cq_entries(st.root, topic, queue_id, geo, raw=raw):
                writer.write(row)
        finally:
            writer.close()
        if not quiet:
            from rmqdump.cli.output import diag

            diag(f"{writer.count} entries; consume queue file size {geo.cq_file_size} "
                 f"({geo.sources.get('consumequeue')})")
        return
    if fmt == "csv":
        raise click.BadParameter("the summary is a document: use table, json or jsonl (or --entries for csv)",
                                 param_hint="--format")
    doc = cq_summary(st.root, topic, queue_id, geo, st.commitlog.min_offset)
    doc["geometry_problems"] = geo.problems
    emit_document(doc, fmt, render)
    if _has_findings(doc):
        raise SystemExit(1)
