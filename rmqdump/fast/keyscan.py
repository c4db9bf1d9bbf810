"""Compiled twin of the walk behind a key lookup that scans the commitlog (``lookup --key`` without a usable
index, ``lookup --scan``): the records whose properties hold the key's bytes, decoded, from column batches.

The pure walk decodes every record and asks the lookup's matcher, which first drops records whose properties
bytes lack the key (its prefilter). Here each segment is walked by the compiled kernel (CRC off) and only the
records whose properties hold those bytes are decoded (searched in one pass over a batch's properties), so the
matcher sees the same candidates in the same order. With ``count``, a batch also says how many of its records
``IndexService.buildIndex`` would index (``record_keys``, :mod:`rmqdump.fast.indexkeys`). A file the kernel
cannot walk to its end hands the rest of the walk back to the pure loop (:class:`HandOver`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from rmqdump.errors import StoreError
from rmqdump.fast.cqrebuild import HandOver
from rmqdump.fast.engine import _numpy, use_fast
from rmqdump.fast.segment_walk import FastSegmentWalk

if TYPE_CHECKING:
    from rmqdump.codec.record import Message
    from rmqdump.store.commitlog import CommitLog

__all__ = ["HandOver", "KeyBatch", "applies", "key_scan"]


@dataclass
class KeyBatch:
    """One batch: the records holding the key's bytes (in commitlog order), how many records past ``already``
    are indexable (``count``), and the commitlog offset after the last record walked."""

    records: list[Message] = field(default_factory=list)
    indexable: int = 0
    end_offset: int = 0


def applies(cl: CommitLog, start: int, end: int | None, use_mmap: bool) -> bool:
    """Whether a key scan of [start, end) takes the compiled path."""
    segs = [s for s in cl.segments if s.start + s.size > start and (end is None or s.start < end)]
    return use_mmap and bool(segs) and use_fast(sum(s.size for s in segs), segments=segs)


def key_scan(cl: CommitLog, *, start: int, end: int | None, needle: bytes, max_record_size: int,
             count: bool = False, already: int | None = None,
             batch_records: int | None = None) -> Iterator[KeyBatch | HandOver]:
    """The records of [``start``, ``end``) whose properties hold ``needle``, batch by batch (a batch after the
    last of each file gives the walk's end there); a :class:`HandOver` last when the kernel could not walk it
    all. ``count``: also count the indexable records whose offset is past ``already`` (None: all)."""
    np = _numpy()
    keys = None
    if count:
        from rmqdump.fast.indexkeys import _Keys

        keys = _Keys()
    columns = None
    kw = {} if batch_records is None else {"batch_records": batch_records}
    for seg in cl.segments:
        if seg.start + seg.size <= start:
            continue
        if end is not None and seg.start >= end:
            return
        pos = max(0, start - seg.start)
        try:
            w = FastSegmentWalk(segment=seg, start_pos=pos, check_crc=False, end_offset=end,
                                max_record_size=max_record_size, columns=columns, **kw)
        except StoreError:
            w = None
        if w is None or w.size != seg.size:
            if w is not None:
                w.close()
            yield HandOver(seg.start + pos)
            return
        with w:
            for b in w:
                if not b.n:
                    continue
                out = KeyBatch()
                last = b.n - 1
                out.end_offset = int(b.offsets[last]) + int(b["size"][last])
                for i in b.holding(np.arange(b.n), needle):
                    out.records.append(b.message(i, read_body=False))
                if keys is not None:
                    out.indexable = _indexable(np, keys, b, already)
                yield out
            stop = w.stop
        columns = w.cols
        if stop.kind == "invalid":
            yield HandOver(seg.start + stop.pos)
            return
        if stop.kind == "blank":
            yield KeyBatch(end_offset=seg.start + seg.size)
        if stop.kind == "limit":
            return


def _indexable(np, keys, b, already: int | None) -> int:
    """Records of batch ``b`` past ``already`` that ``IndexService.buildIndex`` puts at least one key for."""
    got = keys.batch(b)
    if got is None:
        return 0
    offs = np.unique(got.offsets)
    return int((offs > already).sum()) if already is not None else int(offs.size)
