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

from rmqdump.fast import filewalk
from rmqdump.fast.engine import _numpy
from rmqdump.fast.filewalk import FileEnd, HandOver

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
    return filewalk.applies(cl, start, end, use_mmap)


def key_scan(cl: CommitLog, *, start: int, end: int | None, needle: bytes, max_record_size: int,
             count: bool = False, already: int | None = None,
             batch_records: int | None = None) -> Iterator[KeyBatch | HandOver]:
    """The records of [``start``, ``end``) whose properties hold ``needle``, batch by batch (a batch after a file
    that ends with a BLANK gives the walk's end there); a :class:`HandOver` last when the kernel could not walk
    it all. ``count``: also count the indexable records whose offset is past ``already`` (None: all)."""
    np = _numpy()
    keys = None
    if count:
        from rmqdump.fast.indexkeys import KeyHasher

        keys = KeyHasher()
    for item in filewalk.walk_files(cl, start=start, end=end, max_record_size=max_record_size,
                                    batch_records=batch_records):
        if isinstance(item, HandOver):
            yield item
        elif isinstance(item, FileEnd):
            if item.stop.kind == "blank":
                yield KeyBatch(end_offset=item.segment.start + item.segment.size)
        else:
            last = item.n - 1
            out = KeyBatch(end_offset=int(item.offsets[last]) + int(item["size"][last]))
            out.records = [item.message(i, read_body=False) for i in item.holding(np.arange(item.n), needle)]
            if keys is not None:
                out.indexable = _indexable(np, keys, item, already)
            yield out


def _indexable(np, keys, b, already: int | None) -> int:
    """Records of batch ``b`` past ``already`` that ``IndexService.buildIndex`` puts at least one key for."""
    got = keys.batch(b)
    if got is None:
        return 0
    offs = np.unique(got.offsets)
    return int((offs > already).sum()) if already is not None else int(offs.size)
