"""What recovery removes past ``processOffset``: the commitlog files it truncates and deletes, the
records they held (intact and damaged), and the index files an abnormal restart deletes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rmqdump.codec.record import END_OF_DATA, Invalid, Message
from rmqdump.errors import RmqdumpError
from rmqdump.store.checkpoint import Checkpoint
from rmqdump.store.commitlog import CommitLog, Skipped
from rmqdump.store.root import Store

#: ``DEFAULT_LIST_LIMIT`` offsets at most are listed per category (counts are always complete)
DEFAULT_LIST_LIMIT = 10000


def commitlog_truncation(cl: CommitLog, process_offset: int) -> tuple[tuple[str, int] | None, list[str]]:
    """``truncateDirtyFiles``: (file holding the new end, its new write position) and deleted files."""
    held = None
    deleted = []
    fs = cl.file_size
    for s in cl.segments:
        tail = s.start + fs
        if tail > process_offset:
            if process_offset >= s.start:
                held = (s.name, process_offset - s.start)
            else:
                deleted.append(s.name)
    return held, deleted


def index_deletions(store: Store, checkpoint: Checkpoint, abnormal: bool) -> tuple[list[dict], list[str]]:
    """``IndexService.load``: after an abnormal exit, files with endTimestamp > indexMsgTimestamp go."""
    out: list[dict] = []
    notes: list[str] = []
    if not abnormal or store.root is None:
        return out, notes
    try:
        from rmqdump.store.indexfile import IndexFile, list_index_files
    except ImportError:  # pragma: no cover
        return out, ["index reader unavailable"]
    try:
        paths = list_index_files(store.root)
    except RmqdumpError as e:
        return out, [str(e)]
    for p in paths:
        try:
            with IndexFile(p, strict=False) as f:
                h = f.header
        except RmqdumpError as e:
            notes.append(f"index/{p.name}: {e.message}")
            continue
        if h.end_timestamp > checkpoint.index_msg_timestamp:
            out.append({"file": p.name, "end_timestamp": h.end_timestamp, "begin_phy_offset": h.begin_phy_offset,
                        "end_phy_offset": h.end_phy_offset, "entries": h.entry_count})
    return out, notes


@dataclass
class DroppedRecords:
    """Records at or after ``processOffset``: intact ones (listed) and damaged ranges."""

    intact: int = 0
    damaged_records: int = 0
    bytes: int = 0
    offsets: list[int] = field(default_factory=list)
    topics: Counter = field(default_factory=Counter)
    damaged_ranges: list[tuple[int, int, str]] = field(default_factory=list)
    offsets_truncated: bool = False

    @property
    def count(self) -> int:
        return self.intact + self.damaged_records

    def to_dict(self) -> dict:
        return {
            "count": self.count, "intact": self.intact, "damaged": self.damaged_records, "bytes": self.bytes,
            "first_offset": min([*self.offsets[:1], *(s for s, _, _ in self.damaged_ranges)], default=None),
            "offsets": self.offsets, "offsets_truncated": self.offsets_truncated,
            "topics": dict(sorted(self.topics.items())),
            "damaged_ranges": [{"start": s, "end": e, "kind": k} for s, e, k in self.damaged_ranges],
        }


def dropped_records(cl: CommitLog, process_offset: int, *, use_mmap: bool = True,
                    list_limit: int = DEFAULT_LIST_LIMIT) -> DroppedRecords:
    """Every valid-looking record the truncation discards (keep-going walk from ``processOffset``)."""
    out = DroppedRecords()
    if not cl.segments or process_offset >= cl.segments[-1].end:
        return out
    walk = cl.walk(start=process_offset, check_crc=True, read_body=False, keep_going=True, use_mmap=use_mmap)
    for rec in walk:
        if isinstance(rec, Message):
            out.intact += 1
            out.bytes += rec.size
            out.topics[rec.topic] += 1
            if len(out.offsets) < list_limit:
                out.offsets.append(rec.offset)
            else:
                out.offsets_truncated = True
        elif isinstance(rec, Skipped):
            _add_damage(out, rec.start, rec.end, rec.reason)
    stop = walk.stop
    if stop is not None and stop.kind != END_OF_DATA:
        seg = cl.segment_for(stop.offset)
        end = seg.end if seg else stop.offset
        _add_damage(out, stop.offset, end, stop)
    return out


def _add_damage(out: DroppedRecords, start: int, end: int, reason: Invalid) -> None:
    out.damaged_ranges.append((start, end, reason.kind))
    if reason.kind != END_OF_DATA and reason.size > 0:
        out.damaged_records += 1  # a record whose TOTALSIZE is readable
        out.bytes += min(reason.size, end - start)
