"""The units of work over commitlog segments: one :class:`SegmentSplit` per segment of a store (or per range
of one, :func:`range_splits`), and the :class:`SegmentReport` of how its walk ended."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from rmqdump.codec.layout import STORE_COMMITLOG_DIR
from rmqdump.disk.segment import Segment
from rmqdump.errors import RmqdumpError, StoreError
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.root import Store


@dataclass(frozen=True)
class SegmentSplit:
    """One commitlog segment of one store: the unit of parallel work (picklable, paths as str)."""

    store: str  # the path the user gave for the store
    broker: str
    path: str  # segment file
    start: int
    size: int
    index: int  # position in the global split list (stable output file names)
    range_start: int = 0  # a range of the segment: the position its walk starts at ...
    range_end: int | None = None  # ... and the absolute offset it stops at (the next range's start); None: the end

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def segment(self) -> Segment:
        return Segment(Path(self.path), self.start, self.size)


@dataclass
class SegmentReport:
    """How the walk of one segment ended."""

    segment: str
    records: int  # valid records walked (before filtering)
    rows: int  # rows produced (after filtering)
    stop_kind: str  # end_of_data, blank (clean BLANK end), limit (a range's end), or the invalid kind that stopped it
    stop_offset: int
    stop_detail: str
    skipped: int  # damaged ranges stepped over (keep_going)
    body_errors: int = 0  # bodies that would not decompress (exported as stored)
    body_error_first: tuple[tuple[int, str], ...] = ()  # the first few: (offset, detail)
    skipped_ranges: tuple[tuple[int, int, str, str], ...] = ()  # keep_going: (start, end, kind, detail) each


def _broker_dir(path: str | os.PathLike) -> Path:
    p = Path(os.path.abspath(path))
    if p.is_file():
        p = p.parent
    if p.name == STORE_COMMITLOG_DIR:
        p = p.parent
    if p.name == "store" and p.parent.name:
        p = p.parent
    return p


def broker_name(path: str | os.PathLike) -> str:
    """A default broker name for a store path: its directory name (the parent's for ``store``/``commitlog``
    directories and segment files)."""
    p = _broker_dir(path)
    return p.name or str(p)


def broker_names(paths: Iterable[str | os.PathLike]) -> dict[str, str]:
    """Unique default broker names of several stores: :func:`broker_name`, and where two stores share it,
    the shortest tail of their directory paths that tells them apart (``host1/root``, ``host2/root`` for
    ``/x/host1/root/store`` and ``/x/host2/root/store``). The same stores always get the same names."""
    keys = list(dict.fromkeys(os.fspath(p) for p in paths))
    names = {k: broker_name(k) for k in keys}
    groups: dict[str, list[str]] = {}
    for k, n in names.items():
        groups.setdefault(n, []).append(k)
    for _name, members in groups.items():
        if len(members) < 2:
            continue
        dirs = {k: _broker_dir(k).parts for k in members}
        for n in range(2, max(len(d) for d in dirs.values()) + 1):
            tails = {k: "/".join(d[-n:]) for k, d in dirs.items()}
            if len(set(tails.values())) == len(members):
                names.update(tails)
                break
        else:
            names.update({k: os.path.abspath(k) for k in members})
    return names


def segment_splits(paths: Iterable[str | os.PathLike], brokers: dict[str, str] | None = None) -> list[SegmentSplit]:
    """Every segment of every store in ``paths`` as a split (stores in the given order); default broker
    names from :func:`broker_names`."""
    out: list[SegmentSplit] = []
    paths = [os.fspath(p) for p in paths]
    defaults = broker_names(paths)
    for key in paths:
        cl = Store.open(key).commitlog
        broker = (brokers or {}).get(key) or defaults[key]
        for seg in cl.segments:
            out.append(SegmentSplit(key, broker, str(seg.path), seg.start, seg.size, len(out)))
    return out


def iter_splits(source: str | os.PathLike | Store | CommitLog | Segment | SegmentSplit,
                broker: str | None = None) -> list[SegmentSplit]:
    """The splits of any commitlog source (a path, Store, CommitLog, Segment or SegmentSplit)."""
    if isinstance(source, SegmentSplit):
        return [source]
    if isinstance(source, Segment):
        return [SegmentSplit(str(source.path), broker or broker_name(source.path), str(source.path),
                             source.start, source.size, 0)]
    if isinstance(source, Store):
        label = str(source.root) if source.root is not None else str(source.commitlog.location)
        segs = source.commitlog.segments
    elif isinstance(source, CommitLog):
        label = str(source.location)
        segs = source.segments
    elif isinstance(source, (str, os.PathLike)):
        label = os.fspath(source)
        segs = Store.open(label).commitlog.segments
    else:
        raise StoreError(f"not a commitlog source: {type(source).__name__}")
    name = broker or broker_name(label)
    return [SegmentSplit(label, name, str(s.path), s.start, s.size, i) for i, s in enumerate(segs)]


def range_splits(split: SegmentSplit, k: int, *, max_record_size: int, min_bytes: int | None = None
                 ) -> list[SegmentSplit]:
    """``split``'s segment as up to ``k`` ranges (:func:`rmqdump.fast.segment_split.split_plan`: split points
    from the store's ConsumeQueue, else a header scan), each walked up to the next one's start. The points are
    guesses: whoever walks the ranges joins them with proof (a range's result stands only when the walk of the
    one before it stopped exactly at its start). One split, unchanged, for a small or unmappable segment."""
    from rmqdump.fast.segment_split import split_plan

    try:
        plan = split_plan(split.segment(), 0, k, max_record_size=max_record_size, store_root=split.store,
                          min_bytes=min_bytes)
    except (OSError, ValueError, RmqdumpError):
        return [split]
    if len(plan) < 2:
        return [split]
    return [replace(split, range_start=start, range_end=end) for start, end in plan]
