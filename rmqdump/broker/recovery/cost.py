"""The broker's next start, quantified: what its recovery reads and an estimate of how long that takes.

From a :class:`~rmqdump.broker.recovery.prediction.RecoveryPrediction` (checked against 4.9.8 and 5.3.3):

* commitlog: ``CommitLog.recoverNormally`` (no ``abort``) walks from the third-last file (5.3.2+: the file
  holding the consume queues' maximum), ``recoverAbnormally`` from the newest file whose first record was
  stored at or before the checkpoint's ``getMinTimestamp()`` (min(physic, logics) - 3 s), else from the
  first file. Every record on the way is read whole: ``checkCRCOnRecover`` defaults to true in both
  versions (a ``broker.conf`` may turn it off: the same bytes are read, the CRC is skipped). The figures
  are the prediction's walk: its start file to ``processOffset`` (blank file tails are skipped, not read);
* consume queues: every file is mapped at ``load()``, ``ConsumeQueue.recover`` walks the last three files of
  each queue (both versions); abnormal recovery (and 5.3.3's normal one after the CQ maximum) hands the
  walked records to the dispatcher (consume queues and index), which writes the entries they lack;
* index: every file is mapped at load; after an abnormal exit those newer than the checkpoint go.

The time is an estimate: commitlog bytes at a rate, either measured by rmqdump on this store (passed in)
or :data:`DEFAULT_RATE` (a cold-cache disk read, not measured). Nothing here reads commitlog records
beyond the first record of a file.
"""

from __future__ import annotations

from dataclasses import dataclass

from rmqdump.broker.recovery.inputs import VERSION_49, first_record_store_timestamp
from rmqdump.broker.recovery.start import BEFORE, start_failures
from rmqdump.store.checkpoint import ms_to_iso
from rmqdump.store.root import Store

#: bytes per second assumed when rmqdump measured none: a disk read with a cold page cache
DEFAULT_RATE = 100 * 1024 * 1024
#: the smallest walk whose throughput is taken as a measured rate (smaller ones time the start-up)
MIN_MEASURED_BYTES = 64 * 1024 * 1024
#: ``ConsumeQueue.recover`` starts at the third-last file of each queue (4.9.8 and 5.3.3)
CQ_RECOVER_FILES = 3
CRC_NOTE = "checkCRCOnRecover defaults to true (4.9.8, 5.3.3): every record's body CRC is checked"


@dataclass(frozen=True)
class Rate:
    """A read rate and where it comes from (``measured`` or ``default``)."""

    bytes_per_second: float
    source: str
    detail: str


def default_rate() -> Rate:
    return Rate(DEFAULT_RATE, "default", f"{human_bytes(DEFAULT_RATE)}/s assumed (a cold-cache disk read); "
                                         "not measured on this store")


def measured_rate(nbytes: int, seconds: float, what: str = "verify's walk") -> Rate:
    """The throughput of a walk rmqdump just did on this store, or the default when it was too small to time."""
    if nbytes < MIN_MEASURED_BYTES or seconds <= 0:
        return default_rate()
    bps = nbytes / seconds
    return Rate(bps, "measured", f"{human_bytes(bps)}/s: {what} read {human_bytes(nbytes)} in {seconds:.1f} s "
                                 "here, its checks included (a low rate: the broker only reads and CRCs; the "
                                 "page cache may be warm now)")


def human_bytes(n: float) -> str:
    """1023 B, 1.5 KiB, 412 GiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return f"{n} TiB"  # pragma: no cover


def human_seconds(s: float) -> str:
    if s < 1:
        return "under 1 s"
    if s < 120:
        return f"~{s:.0f} s"
    if s < 7200:
        return f"~{s / 60:.0f} min"
    return f"~{s / 3600:.1f} h"


def _segment_index(segments, offset: int, lo: int) -> int:
    """Index of the segment (from ``lo``) holding ``offset``; an offset at a file's end belongs to that file."""
    for i in range(lo, len(segments)):
        if offset <= segments[i].end:
            return i
    return len(segments) - 1


def _queue_files(root) -> tuple[int, int, int]:
    """(queues, consume-queue files mapped at load, files ``ConsumeQueue.recover`` walks)."""
    from itertools import chain

    from rmqdump.store.consumequeue import discover_queues, mapped_file_count

    queues = loaded = walked = 0
    for ref in chain(discover_queues(root), discover_queues(root, batch=True)):
        n = mapped_file_count(ref.path)
        queues += 1
        loaded += n
        walked += min(CQ_RECOVER_FILES, n)
    return queues, loaded, walked


def _index_files(root) -> int:
    from rmqdump.store.indexfile import list_index_files

    return len(list_index_files(root))


def _start_reason(pred, store: Store, start: int, abnormal: bool) -> str:
    cl = store.commitlog
    n = len(cl.segments)
    if not abnormal:
        if pred.version == VERSION_49:
            if n >= 3:
                return f"normal recovery (no abort file) starts at the third-last of {n} file(s)"
            return (f"normal recovery (no abort file) starts at the first of {n} file(s) (at the third-last "
                    "when there are more)")
        return (f"normal recovery (no abort file, 5.3 model) starts at the file holding the consume queues' "
                f"maximum commitlog offset {pred.max_phy_offset_of_consume_queue}")
    cp = pred.checkpoint
    zero = [name for name, v in (("physicMsgTimestamp", cp.physic_msg_timestamp),
                                 ("logicsMsgTimestamp", cp.logics_msg_timestamp)) if v == 0] if cp else []
    if zero:
        return (f"abort file present; checkpoint {' and '.join(zero)} = 0 → min timestamp 0 selects no file → "
                f"every file from the first: {human_bytes(pred.max_offset - pred.start_offset)}")
    mt = cp.min_timestamp if cp else 0
    if start == 0:
        first = first_record_store_timestamp(cl.segments[0], pred.version)
        if n > 1 or (first is not None and first > mt):
            return (f"abort file present; checkpoint min timestamp {ms_to_iso(mt) if mt > 0 else 0} is before "
                    "the first record of every file → every file from the first")
    return (f"abort file present; checkpoint min timestamp {ms_to_iso(mt) if mt > 0 else 0} (min(physic, logics) "
            f"- 3 s) selects file {start + 1} of {n}")


def _shorter(pred, store: Store, start: int, end_index: int, abnormal: bool, exact: bool) -> list[dict]:
    """What would make the next start read less (a checkpoint the broker can trust; an existing repair)."""
    cl = store.commitlog
    segs = cl.segments
    out: list[dict] = []
    if not abnormal:
        return out
    cp = pred.checkpoint
    # a checkpoint flushed as the broker flushes it: its timestamps at the newest record the consume
    # queues hold, and not past the first record whose entry the re-dispatch has to write
    held = min(pred.max_phy_offset_of_consume_queue, pred.max_offset) if exact else -1  # re-dispatch unknown
    for q in pred.redispatched:
        if q.count:
            held = min(held, q.commitlog_offsets[0]) if q.commitlog_offsets else -1  # not listed: unknown
    if held > segs[start].start:
        trusted = _segment_index(segs, held - 1, start)
        if trusted > start:
            saved = segs[trusted].start - segs[start].start
            zero = cp is not None and (cp.physic_msg_timestamp == 0 or cp.logics_msg_timestamp == 0)
            why = ("a checkpoint timestamp is 0" if zero else
                   "the checkpoint selects an earlier file than the consume queues need")
            out.append({"how": "checkpoint", "start_file": segs[trusted].name, "bytes_saved": saved,
                        "detail": f"{why}: a checkpoint the broker can trust (flushed at the newest record with a "
                                  f"consume-queue entry) would start at {segs[trusted].name} (or the file before, "
                                  f"within its 3-s margin): {human_bytes(saved)} less",
                        "repair": None})
    if store.root is not None and not pred.load_errors:
        kept = _segment_index(segs, pred.max_offset, 0) + 1  # repair deletes the files after the end
        after = max(0, kept - 3) if pred.version == VERSION_49 else end_index
        if after > start:
            saved = segs[after].start - segs[start].start
            out.append({"how": "repair", "start_file": segs[after].name, "bytes_saved": saved,
                        "detail": f"`rmqdump repair` (a plan; --apply backs up, --undo restores) brings consume "
                                  f"queues and index in line and removes abort: normal recovery from "
                                  f"{segs[after].name}, {human_bytes(saved)} less",
                        "repair": "rmqdump repair STORE --apply"})
    return out


def next_start(pred, store: Store, rate: Rate | None = None, exact: bool = True) -> dict:
    """The ``next_start`` document: the work of the broker's next start and an estimate of its time.
    ``exact=False``: ``pred`` is a :func:`quick_prediction` (no recovery walk: records and re-dispatch unknown)."""
    rate = rate or default_rate()
    if pred.mode == "dledger":
        return {"estimated": False, "why_not": "not estimated for DLedger stores (DLedger's own recovery)"}
    cl = store.commitlog
    if not cl.segments or pred.walk is None or pred.start_offset is None:
        return {"estimated": False, "why_not": "no commitlog files: nothing to recover"}
    abnormal = store.abort_present
    segs = cl.segments
    start = pred.walk.start_index
    end = pred.max_offset
    end_index = _segment_index(segs, end, start)
    nbytes = end - pred.start_offset
    doc: dict = {"estimated": True, "why_not": None, "mode": "abnormal" if abnormal else "normal",
                 "starts": pred.mode != "refuses_to_start" and not pred.start_failures,
                 "store_loads": pred.mode != "refuses_to_start", "load_errors": list(pred.load_errors),
                 "start_failures": [f.to_dict() for f in pred.start_failures],
                 "start_file": pred.start_file, "start_offset": pred.start_offset, "end_offset": end,
                 "start_reason": _start_reason(pred, store, start, abnormal),
                 "commitlog_files": end_index - start + 1, "commitlog_files_total": len(segs),
                 "commitlog_bytes": nbytes, "commitlog_bytes_total": segs[-1].end - segs[0].start,
                 "records": pred.walk.records if exact else None, "exact": exact,
                 "crc_checked": True, "crc_note": CRC_NOTE}
    queues = cq_loaded = cq_walked = idx = 0
    if store.root is not None:
        from rmqdump.errors import RmqdumpError

        try:
            queues, cq_loaded, cq_walked = _queue_files(store.root)
        except (RmqdumpError, OSError):
            pass
        try:
            idx = _index_files(store.root)
        except (RmqdumpError, OSError):
            pass
    # abnormal: every walked record goes to the dispatcher; 5.3.3 normal: those after the CQ maximum
    dispatched = pred.walk.records if abnormal else pred.redispatched_cq_entries
    doc["consume_queues"] = {"queues": queues, "files_loaded": cq_loaded, "files_recovered": cq_walked}
    doc["redispatch"] = {"records": dispatched, "cq_entries_written": pred.redispatched_cq_entries} if exact else None
    doc["index_files"] = {"loaded": idx, "deleted": len(pred.deleted_index_files)}
    doc["rate"] = {"bytes_per_second": round(rate.bytes_per_second), "source": rate.source, "detail": rate.detail}
    doc["estimated_seconds"] = round(nbytes / rate.bytes_per_second, 3)
    doc["shorter"] = _shorter(pred, store, start, end_index, abnormal, exact)
    return doc


def next_start_after_walk(pred, store: Store, nbytes: int, seconds: float) -> dict | None:
    """The ``next_start`` object ``verify -f json`` (and ``report``) give: the next start's work at the rate a
    walk of ``nbytes`` in ``seconds`` just ran on this store; None without a prediction."""
    from rmqdump.errors import RmqdumpError

    if pred is None:
        return None
    try:
        return next_start(pred, store, measured_rate(nbytes, seconds))
    except RmqdumpError as e:
        return {"estimated": False, "why_not": str(e)}


def start_gate(doc: dict) -> tuple[str | None, str | None]:
    """From :func:`next_start`'s document: what the next start's recovery waits for (``load() succeeds``,
    ``<file> loads``; None: nothing), and what stops the broker once it ran (None: nothing)."""
    stops = doc.get("start_failures") or []
    if stops and stops[0]["stage"] == BEFORE:
        return f"{stops[0]['file']} loads", None
    errors = doc.get("load_errors") or []
    why = f" (it fails: {errors[0]}" + (f"; {len(errors) - 1} more" if len(errors) > 1 else "") + ")" if errors else ""
    gate = None if doc["store_loads"] else f"load() succeeds{why}"
    return gate, (f"{stops[0]['file']}: {stops[0]['reason']}" if stops else None)


def summary_lines(doc: dict) -> list[str]:
    """The next start in two or three short lines (verify's block, info)."""
    if not doc.get("estimated"):
        return [doc.get("why_not") or "not estimated"]
    gate, stop = start_gate(doc)
    head = f"the broker does not start until {gate}; then " if gate else ""
    lines = [f"{head}{doc['mode']} recovery reads {doc['commitlog_files']} of {doc['commitlog_files_total']} "
             f"commitlog file(s), {human_bytes(doc['commitlog_bytes'])} from {doc['start_file']} "
             + (f"({doc['records']} records, CRC checked): " if doc["exact"] else "(CRC checked): ")
             + f"{human_seconds(doc['estimated_seconds'])} "
             f"at {human_bytes(doc['rate']['bytes_per_second'])}/s ({doc['rate']['source']} rate, an estimate)"]
    if stop:
        lines[0] += f"; then the broker stops: {stop}"
    lines.append(doc["start_reason"])
    for s in doc["shorter"]:
        lines.append("shorter: " + s["detail"])
    return lines



def quick_prediction(store: Store, end: int, max_phy_cq: int = -1, cq_problems: list | None = None,
                     walker=None):
    """A :class:`~rmqdump.broker.recovery.prediction.RecoveryPrediction` without the recovery walk (``info``):
    the start file as the broker picks it, ``end`` (the end of data a cheap walk found) for ``processOffset``;
    the store's ``load()`` refusals from its commitlog folder and ``cq_problems`` (the consume-queue folders'
    :class:`~rmqdump.broker.recovery.queues.CqProblem`, as :func:`consume_queue_states` finds them), and a lone
    commitlog file cut short (:func:`~rmqdump.broker.recovery.walk.cut_short`: the recovery walk, by ``walker``
    — a drop-in for ``broker_walk`` —, runs only when the file's last bytes are data). None for a DLedger store."""
    from rmqdump.broker.recovery.inputs import (
        VERSION_53,
        abnormal_start_index,
        load_problems,
        normal_start_index,
        read_checkpoint_for_recovery,
    )
    from rmqdump.broker.recovery.prediction import (
        MODE_ABNORMAL,
        MODE_NORMAL,
        MODE_REFUSES,
        RecoveryPrediction,
        refusal_reason,
    )
    from rmqdump.broker.recovery.walk import BrokerWalk, broker_walk, cut_short, tail_is_data
    from rmqdump.broker.version import five_x_files
    from rmqdump.store.checkpoint import Checkpoint

    if store.dledger is not None:
        return None
    cl = store.commitlog
    version = VERSION_53 if five_x_files(store.root) else VERSION_49
    abnormal = store.abort_present
    cp = read_checkpoint_for_recovery(store)[0] if store.root is not None else Checkpoint()
    pred = RecoveryPrediction(version, MODE_ABNORMAL if abnormal else MODE_NORMAL, "", checkpoint=cp,
                              max_phy_offset_of_consume_queue=max_phy_cq)
    if store.root is not None:
        pred.start_failures = start_failures(store.root, version)
    pred.load_errors = load_problems(store, version) + [str(p) for p in cq_problems or () if p.refuses(version)]
    if not pred.load_errors and store.root is not None and len(cl.segments) == 1 and tail_is_data(cl.segments[0]):
        short = cut_short(store, (walker or broker_walk)(cl, 0, version=version))
        pred.load_errors += [short] if short else []
    if pred.load_errors:
        pred.mode, pred.reason = MODE_REFUSES, refusal_reason(pred.load_errors[0], pred.mode)
    if not cl.segments:
        return pred
    start = abnormal_start_index(cl, cp.min_timestamp, version)[0] if abnormal else \
        normal_start_index(cl, version, max_phy_cq)
    seg = cl.segments[start]
    pred.walk = BrokerWalk(start, seg.start, max(end, seg.start))
    pred.start_file, pred.start_offset, pred.max_offset = seg.name, seg.start, pred.walk.process_offset
    return pred
