"""The index side of a key lookup: which index files to trust (and the commitlog ranges they do not
cover), and the broker's ``selectPhyOffset`` walk of a key's hash chains, bounded and with its damage
reported."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from rmqdump.analysis.lookup.result import _iso
from rmqdump.errors import FormatError, RmqdumpError
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.geometry import StoreGeometry, check_index_file, geometry_hint
from rmqdump.store.root import Store

LONG_MAX = (1 << 63) - 1
#: the index keeps store time in whole seconds (truncated), relative to the file's begin time
INDEX_TIME_SLACK_MS = 1000


@dataclass
class _IndexPlan:
    """Index files to trust, and the commitlog ranges they do not cover."""

    files: list = field(default_factory=list)  # IndexFile, oldest first
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    ranges: list[tuple[int, int | None, int | None]] = field(default_factory=list)  # (start, end, already)


def _index_plan(store: Store, geo: StoreGeometry, use_index: bool = True) -> _IndexPlan:
    plan = _IndexPlan()
    cl = store.commitlog
    if not use_index:
        plan.reasons.append("--scan given: walking the commitlog")
        plan.ranges.append((cl.min_offset, None, None))
        return plan
    if store.root is None:
        plan.reasons.append("index missing: only commitlog files were given, not a store root")
        plan.ranges.append((cl.min_offset, None, None))
        return plan
    from rmqdump.store.indexfile import IndexFile, list_index_files

    paths = list_index_files(store.root)
    if not paths:
        what = "no index/ directory" if store.path("index") is None else "index/ holds no files"
        plan.reasons.append(f"index missing: {what}")
        plan.ranges.append((cl.min_offset, None, None))
        return plan
    if geo.index_hash_slot_num is None:
        plan.reasons.append(f"index unusable: geometry unknown ({'; '.join(geo.problems)}); {geometry_hint()}")
        plan.ranges.append((cl.min_offset, None, None))
        return plan
    doomed_cut = _recovery_cutoff(store, plan)
    for p in paths:
        try:
            f = IndexFile(p, geo.index_hash_slot_num, geo.index_num)
        except RmqdumpError as exc:
            plan.reasons.append(f"index file {p.name} unusable: {exc.message}; {geometry_hint()}")
            continue
        try:
            problems = check_index_file(f)
        except RmqdumpError as exc:
            problems = [exc.message]
        if problems:
            f.close()
            plan.reasons.append(f"index file {p.name} does not fit geometry {geo.index_hash_slot_num}/"
                                f"{geo.index_num} ({geo.sources.get('index')}): {problems[0]}; {geometry_hint()}")
            continue
        if doomed_cut is not None and f.header.end_timestamp > doomed_cut:
            plan.reasons.append(f"index deleted by recovery: abort present and {p.name} ends at "
                                f"{_iso(f.header.end_timestamp)} > checkpoint indexMsgTimestamp {doomed_cut} "
                                "(the broker's abnormal restart deletes it and re-indexes)")
            f.close()
            continue
        if f.index_count <= 1:
            f.close()
            continue  # an empty file covers nothing
        plan.files.append(f)
    _coverage(cl, plan)
    return plan


def _recovery_cutoff(store: Store, plan: _IndexPlan) -> int | None:
    """checkpoint indexMsgTimestamp when the next start would be an abnormal one, else None."""
    if not store.abort_present:
        return None
    from rmqdump.broker.lock import probe_lock

    try:
        pid = probe_lock(store.root)
    except RmqdumpError:
        pid = None
    if pid:
        plan.warnings.append(f"a broker (PID {pid}) holds the store's lock: abort is its live marker; "
                             "using the index as it is")
        return None
    cp_path = store.path("checkpoint")
    if cp_path is None:
        return 0
    from rmqdump.store.checkpoint import read_checkpoint

    try:
        return read_checkpoint(cp_path).index_msg_timestamp
    except RmqdumpError as exc:
        plan.warnings.append(f"checkpoint unreadable ({exc}); taking indexMsgTimestamp as 0")
        return 0


def _coverage(cl: CommitLog, plan: _IndexPlan) -> None:
    """Commitlog ranges outside the trusted files: (start, end or None, offset already indexed)."""
    if not plan.files:
        plan.ranges.append((cl.min_offset, None, None))
        return
    first = plan.files[0].header
    if first.begin_phy_offset > cl.min_offset:
        plan.ranges.append((cl.min_offset, first.begin_phy_offset, None))
    for a, b in zip(plan.files, plan.files[1:], strict=False):
        if b.header.begin_phy_offset > a.header.end_phy_offset:
            plan.ranges.append((a.header.end_phy_offset, b.header.begin_phy_offset, a.header.end_phy_offset))
    last = plan.files[-1].header.end_phy_offset
    plan.ranges.append((max(last, cl.min_offset), None, last))


def _time_covered(plan: _IndexPlan, begin: int, end: int) -> bool:
    if not plan.files:
        return False
    lo = min(f.header.begin_timestamp for f in plan.files)
    hi = max(f.header.end_timestamp for f in plan.files)
    return lo <= begin and end <= hi


def _chain_offsets(f, key_hash: int, lo: int, out: set[int], stop: _EarlyStop | None = None) -> str | None:
    """``selectPhyOffset`` for one keyHash in one file into ``out``; the first sign of damage in the chain.

    Same walk and stop rules as the broker (newest entry first; stop at a timeDiff < 0,
    at prevIndex 0, or once an entry reads older than ``lo``), except that what the broker
    silently stops at (or loops on) is reported: a slot or prevIndex outside the written
    entries, a prevIndex not below its entry's number (the broker only links to earlier
    entries, so this bounds the walk), an entry whose keyHash selects another slot, a
    negative timeDiff. With ``stop`` the walk ends once enough hits are confirmed in chain
    order (see :class:`_EarlyStop`).
    """
    from rmqdump.store.indexfile import _bad_prev

    S = f.geometry.hash_slot_num
    slot = key_hash % S
    count = f.index_count
    if count <= 1:
        return None
    begin_ts = f.header.begin_timestamp
    try:
        head = f.slot(slot)
        if head == 0:
            return None
        if head < 0 or head >= count:
            return f"slot {slot} value {head} outside [0, indexCount {count})"
        add = out.add
        for number, kh, phy, time_diff, prev in f.chain(head, count):
            if kh < 0 or kh % S != slot:
                return f"entry {number} in the chain of slot {slot} has keyHash {kh} (another slot's)"
            if time_diff < 0:
                return f"entry {number} in the chain of slot {slot} has a negative timeDiff {time_diff}"
            t = begin_ts + time_diff * 1000
            if t < lo:
                break
            if kh == key_hash:
                add(phy)
                if stop is not None and stop.enough(phy):
                    break
            if prev == 0:
                break
            if prev < 0 or prev >= number:
                return f"entry {number} prevIndex {prev} ({_bad_prev(prev, number, count)})"
    except FormatError as exc:
        return exc.message
    return None


class _EarlyStop:
    """Ends a key's chain walk (across its index files) once ``max_num`` + 1 hits are confirmed in chain order.

    The broker writes entries in commitlog order, so a chain read newest first lists
    offsets from high to low. While that holds, the hits seen so far are the highest ones
    and everything not yet read lies below them: the final newest-first confirmation
    (capped at ``max_num``, one more for ``truncated``) never reaches it. A chain out of
    order disables the stop for this key. Decoded records are kept for the confirmation.
    """

    def __init__(self, max_num: int, check: Callable[[int], bool]):
        self.need = max_num + 1
        self.check = check
        self.hits = 0
        self.last: int | None = None
        self.ordered = True

    def enough(self, off: int) -> bool:
        last = self.last
        if last is not None:
            if off == last:
                return False
            if off > last:
                self.ordered = False
        self.last = off
        if not self.ordered:
            return False
        if self.check(off):
            self.hits += 1
        return self.hits >= self.need


def _index_candidates(plan: _IndexPlan, topics: Iterable[str], key: str, begin: int,
                      stopper: Callable[[], _EarlyStop] | None = None) -> tuple[set[int], list]:
    """Offsets whose index entry hashes like ``topic#key`` (newest file first), and damaged files.

    Without ``stopper`` every chain is walked to its end; with it, each topic's walk ends
    early once its hits are confirmed (see :class:`_EarlyStop`). The window's end is not
    used here: a non-first file's first entry reads later than its real store time (§9.6),
    so the end is applied to the decoded records instead.
    """
    from rmqdump.codec.javahash import index_key, index_key_hash

    out: set[int] = set()
    damaged: dict[str, tuple] = {}
    lo = max(0, begin - INDEX_TIME_SLACK_MS) if begin > 0 else 0
    for topic in topics:
        key_hash = index_key_hash(index_key(topic, key))
        stop = stopper() if stopper is not None else None
        for f in reversed(plan.files):
            if f.header.is_time_matched(lo, LONG_MAX):
                damage = _chain_offsets(f, key_hash, lo, out, stop)
                if damage is not None and f.name not in damaged:
                    damaged[f.name] = (f, damage)
                if stop is not None and stop.ordered and stop.hits >= stop.need:
                    break
            if f.header.begin_timestamp < lo:
                break
    return out, list(damaged.values())
