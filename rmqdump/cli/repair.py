"""`rmqdump repair`: plan (default) or apply the repair of a damaged store; undo a repair."""

from __future__ import annotations

import click

from rmqdump.cli.output import default_format, diag, emit_document
from rmqdump.errors import LockError, StoreError


def _render_plan(console, doc) -> None:
    from rich.text import Text

    def line(text: str, style: str = "") -> None:
        console.print(Text(text, style=style))

    line(f"repair plan for {doc['store']}", "bold")
    line(f"  broker recovery: {doc['mode']} ({doc['reason']})")
    if doc.get("blocked") and not doc.get("salvage_needed"):
        line(f"  cannot repair: {doc['blocked']}", "red")
        return
    if doc["broker_end"] is not None:
        line(f"  the broker's recovery would end the commitlog at {doc['broker_end']}"
             + (f" and delete {doc['broker_would_lose']} intact records after the damage"
                if doc["broker_would_lose"] else ""))
    for s in doc["steps"]:
        g, a = s["group"], s["action"]
        if a == "end":
            line(f"  commitlog: end of valid data at {s['offset']}" + (f" — {s['detail']}" if s.get("detail") else ""))
        elif a in ("neutralise", "recrc"):
            line(f"  - commitlog: {s['detail']} at {s['offset']}")
        elif a == "truncate":
            line(f"  - commitlog: truncate at {s['offset']} ({s['file']} position {s['position']}): "
                 f"zero {s['zero_bytes']} bytes from {s['zero_from']}")
        elif a == "delete" and g == "commitlog":
            line(f"  - commitlog: delete {s['file']}" + ("" if s["has_data"] else " (all zeros)"))
        elif a == "delete" and g == "consumequeue":
            line(f"  - consumequeue {s['queue']}: delete {', '.join(s['files'])} ({s['detail']})")
        elif a == "drop":
            line(f"  - consumequeue {s['queue']}: drop {s['entries']} entries at or after the end")
        elif a == "dispatch":
            line(f"  - consumequeue {s['queue']}: add {s['entries']} entries ({s['detail']})")
        elif a == "rebuild" and g == "index":
            line(f"  - index: rebuild {s['file']} ({s['entries_after']} entries, was {s['entries_before']}): "
                 + "; ".join(s["reasons"]))
        elif a == "fix":
            b, af = s["before"], s["after"]
            diffs = [f"{k} {b[k]} -> {af[k]}" for k in ("physicMsgTimestamp", "logicsMsgTimestamp",
                                                         "indexMsgTimestamp") if b[k] != af[k]]
            line(f"  - checkpoint: {', '.join(diffs)}")
        elif a == "delete" and g == "compaction":
            line(f"  - {s['file']}: delete ({s['detail']})")
        elif a == "restore" and g == "config":
            line(f"  - {s['file']}: restore from its .bak ({s['size']} bytes; it is {s['detail']})")
        elif a == "remove":
            line(f"  - abort: remove ({s['detail']})")
        else:
            line(f"  - {g}: {a} " + " ".join(f"{k}={v}" for k, v in s.items() if k not in ("group", "action")))
    if doc["salvage_needed"]:
        line("  salvage choices (intact records lie after the damage):", "yellow")
        for c in doc["choices"]:
            mark = "*" if c["name"] == doc.get("salvage") else " "
            line(f"   {mark} --salvage {c['name']}: end {c['end']}, keeps {c['keeps_after_damage']} of the records "
                 f"after the damage, loses {c['loses']} — {c['detail']}")
    for w in doc["warnings"]:
        line(f"  warning: {w}", "yellow")
    start = (doc.get("broker_recovery") or {}).get("start_offset")
    written = doc.get("records_written") or 0
    line(f"  outcome: commitlog end {doc['end']}; {doc['records_kept']} messages"
         + (f" and {written} filler/tombstone record(s) over the damage" if written else "")
         + f" from offset {start} (where the broker's recovery walk starts); {len(doc['changes'])} changes, "
         f"{doc['bytes_changed']} bytes")


@click.command()
@click.argument("store", type=click.Path(path_type=str), metavar="[STORE]", required=False)
@click.option("--apply", "do_apply", is_flag=True, help="Perform the repair (under the broker's lock, after a backup).")
@click.option("--salvage", type=click.Choice(("truncate", "filler", "recrc")), default=None,
              help="When intact records follow damage: truncate (as the broker would), filler (neutralise the "
                   "damage with filler records and keep what follows) or recrc (filler, but keep records whose only "
                   "fault is the body CRC by rewriting it).")
@click.option("--backup-dir", type=click.Path(path_type=str), default=None,
              help="Where --apply copies what it changes (default: STORE.rmqdump-backup-<time> beside the store).")
@click.option("--undo", "undo", type=click.Path(exists=True, file_okay=False, path_type=str), default=None,
              metavar="BACKUP", help="Restore the store from a repair backup (byte-identical, sha256-verified).")
@click.option("--force", is_flag=True, help="--undo: restore even if the store changed since the repair.")
@click.option("--rebuild-cq", is_flag=True,
              help="Regenerate every consume queue from the commitlog (a queue's units into files retention "
                   "deleted are kept as they are: no record is left to regenerate them from).")
@click.option("--rebuild-index", is_flag=True, help="Regenerate every index file from the commitlog.")
@click.option("--to", "to_dir", type=click.Path(path_type=str), default=None,
              help="With --rebuild-cq/--rebuild-index: write into this directory; the store is not touched.")
@click.option("--cq-file-size", type=click.IntRange(min=20), default=None,
              help="The broker's mappedFileSizeConsumeQueue, when no ConsumeQueue file of the store tells it.")
@click.option("--commitlog-file-size", type=click.IntRange(min=64), default=None,
              help="The broker's mappedFileSizeCommitLog, when the store's only commitlog file was cut short.")
@click.option("--restore-config", is_flag=True,
              help="Restore every corrupt, empty or missing config/*.json from its .bak (only a .bak the broker's "
                   "loader accepts; a file whose .bak is bad too is refused).")
@click.option("--format", "-f", "fmt", type=click.Choice(("table", "json", "jsonl")), default=None,
              help="Output format (default: table, plain text when piped; json or jsonl for programs).")
@click.option("--quiet", "-q", is_flag=True, help="No summary lines on stderr.")
def repair(store, do_apply, salvage, backup_dir, undo, force, rebuild_cq, rebuild_index, to_dir, cq_file_size,
           commitlog_file_size, restore_config, fmt, quiet):
    """Plan the repair of STORE (dry run), or perform it with --apply.

    The plan reaches the outcome of the broker's own recovery (truncate the commitlog at the
    first bad record, drop the ConsumeQueue entries past it, fix the index and checkpoint)
    without the broker's extra losses: damage in the middle offers --salvage choices, and
    the index is rebuilt instead of deleted. --apply backs up every byte it changes;
    `rmqdump repair --undo BACKUP` puts them back. Exit: 0 nothing to do / applied,
    1 repair needed (dry run), 2 error.
    """
    from rmqdump.write.repair import apply_plan, plan_repair, rebuild_to, undo_backup

    fmt = default_format(fmt, report=True)
    if fmt == "csv":
        fmt = "json"
    if undo:
        res = undo_backup(undo, store=store, force=force)
        doc = {"store": str(res.store), "restored": res.restored, "verified": res.verified,
               "changed_since_repair": res.mismatched_before}
        if fmt == "table":
            click.echo(f"restored {res.restored} changes in {res.store}; sha256 verified for {res.verified}")
        else:
            emit_document(doc, fmt, lambda c, d: None)
        return
    if not store:
        raise click.UsageError("STORE is required (unless --undo BACKUP)")
    if to_dir:
        if not (rebuild_cq or rebuild_index):
            raise click.UsageError("--to needs --rebuild-cq and/or --rebuild-index")
        doc = rebuild_to(store, to_dir, cq=rebuild_cq, index=rebuild_index)
        emit_document(doc, "json" if fmt == "table" else fmt, lambda c, d: None)
        return
    if do_apply:
        plan, res = apply_plan(store, salvage=salvage, rebuild_cq=rebuild_cq, rebuild_index=rebuild_index,
                               backup_dir=backup_dir, cq_file_size=cq_file_size,
                               commitlog_file_size=commitlog_file_size, restore_config=restore_config)
        doc = plan.to_dict()
        if res is not None:
            doc["backup"] = str(res.backup)
        emit_document(doc, fmt, _render_plan)
        if not quiet:
            if res is None:
                diag("nothing to repair")
            else:
                diag(f"applied {res.changes} changes in {res.seconds:.2f} s; backup ({res.bytes_backed_up} bytes) in "
                     f"{res.backup}; undo with: rmqdump repair --undo {res.backup}")
        return
    from rmqdump.broker.lock import probe_lock

    pid = probe_lock(store)
    if pid is not None:
        raise LockError(f"store is locked by process {pid} (a running broker?); a repair plan of a live store "
                        "is meaningless", store, pid=pid)
    plan = plan_repair(store, salvage=salvage, rebuild_cq=rebuild_cq, rebuild_index=rebuild_index,
                       cq_file_size=cq_file_size, commitlog_file_size=commitlog_file_size,
                       restore_config=restore_config)
    try:
        doc = plan.to_dict()
        emit_document(doc, fmt, _render_plan)
    finally:
        plan.cleanup()
    if plan.blocked and not plan.salvage_needed:
        raise StoreError(f"cannot repair: {plan.blocked}", store)
    if plan.needs_repair:
        if not quiet:
            diag("dry run: nothing was changed; run again with --apply to perform this plan"
                 + (" (and choose --salvage)" if plan.salvage_needed and not salvage else ""))
        raise SystemExit(1)
    if not quiet:
        diag("the store needs no repair")
