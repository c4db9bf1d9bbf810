"""The commitlog side of a key lookup: walk a range for records whose topic, store time and key match,
counting the indexable records the index should have held."""

from __future__ import annotations

import os
from collections.abc import Callable

from rmqdump.analysis.lookup.result import LookupResult, _key_matches
from rmqdump.codec.layout import TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK
from rmqdump.codec.record import Message
from rmqdump.store.commitlog import CommitLog, Skipped

#: commitlog bytes from which a key scan loads the compiled walk (the engine's own threshold, 64 MiB)
KERNEL_MIN_BYTES = 64 << 20


def _indexable(msg: Message) -> bool:
    """Whether ``IndexService.buildIndex`` puts entries for this record."""
    if msg.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
        return False
    return msg.uniq_key is not None or bool(msg.keys)


def _scan(cl: CommitLog, start: int, end: int | None, match: _KeyMatch, res: LookupResult,
          *, keep_going: bool, use_mmap: bool, max_record_size: int, already: int | None = None,
          count: bool = False, progress: Callable[[int], None] | None = None) -> tuple[list[int], int]:
    """Walk [start, end); offsets of matching records and (``count``) how many indexable ones lay past ``already``.

    The compiled walk (:mod:`rmqdump.fast.keyscan`) hands over only the records whose properties hold the key's
    bytes (the matcher's prefilter) and the indexable counts; a file it cannot walk is left to the pure walk."""
    pure = dict(keep_going=keep_going, use_mmap=use_mmap, max_record_size=max_record_size, already=already,
                count=count, progress=progress)
    if match.needle is None or not _kernels_worth_loading(cl, start, end):
        return _scan_pure(cl, start, end, match, res, **pure)
    from rmqdump.fast import keyscan

    if not keyscan.applies(cl, start, end, use_mmap):
        return _scan_pure(cl, start, end, match, res, **pure)
    found: list[int] = []
    unindexed = 0
    stop_at = start
    for item in keyscan.key_scan(cl, start=start, end=end, needle=match.needle, max_record_size=max_record_size,
                                 count=count, already=already):
        if isinstance(item, keyscan.HandOver):
            more, n = _scan_pure(cl, item.offset, end, match, res, **pure)
            _, z = res.scanned.pop()
            res.scanned.append((start, z))
            return found + more, unindexed + n
        found += [rec.offset for rec in item.records if match(rec)]
        unindexed += item.indexable
        stop_at = max(stop_at, item.end_offset)
        if progress is not None:
            progress(stop_at)
    res.scanned.append((start, stop_at if end is None else min(end, max(stop_at, start))))
    return found, unindexed


def _kernels_worth_loading(cl: CommitLog, start: int, end: int | None) -> bool:
    """Whether the walk is long enough to load the compiled path (``RMQDUMP_FAST=1``: always): a lookup through a
    fresh index walks only the records after the index's end, and its start-up stays free of numpy."""
    flag = os.environ.get("RMQDUMP_FAST", "")
    if flag in ("0", "1"):
        return flag == "1"
    if not cl.segments:
        return False
    stop = cl.segments[-1].end if end is None else end
    return stop - start >= KERNEL_MIN_BYTES


def _scan_pure(cl: CommitLog, start: int, end: int | None, match: Callable[[Message], bool], res: LookupResult,
               *, keep_going: bool, use_mmap: bool, max_record_size: int, already: int | None = None,
               count: bool = False, progress: Callable[[int], None] | None = None) -> tuple[list[int], int]:
    """:func:`_scan` by the pure walk, every record decoded (the reference)."""
    walk = cl.walk(start=start, end=end, check_crc=False, read_body=False, keep_going=keep_going,
                   use_mmap=use_mmap, max_record_size=max_record_size)
    found: list[int] = []
    unindexed = 0
    for n, rec in enumerate(walk):
        if progress is not None and n & 1023 == 0:
            progress(walk.end_offset)
        if isinstance(rec, Message):
            if count and (already is None or rec.offset > already) and _indexable(rec):
                unindexed += 1
            if match(rec):
                found.append(rec.offset)
        elif isinstance(rec, Skipped):
            res.warnings.append(f"scan skipped damaged bytes [{rec.start}, {rec.end}) in {rec.file}: "
                                f"{rec.reason.kind}: {rec.reason.detail}")
    stop = walk.stop
    stop_at = walk.end_offset
    if stop is not None and stop.kind != "end_of_data" and not keep_going:
        res.warnings.append(f"scan stopped at damage at offset {stop.offset}: {stop.kind}: {stop.detail}")
    res.scanned.append((start, stop_at if end is None else min(end, max(stop_at, start))))
    return found, unindexed


class _KeyMatch:
    """Whether a record matches a key lookup (topic, store-time window, KEYS element or UNIQ_KEY); ``needle``:
    bytes every match's properties hold (None: no such prefilter: a key with U+FFFD may stand for undecodable
    bytes)."""

    def __init__(self, topics: set[str] | None, key: str, begin: int, end: int):
        self.raw = {t.encode("utf-8") for t in topics} if topics is not None else None
        self.key, self.begin, self.end = key, begin, end
        self.needle = key.encode("utf-8", "surrogatepass") if "\ufffd" not in key else None

    def __call__(self, m: Message) -> bool:
        if self.raw is not None and m.topic_raw not in self.raw:
            return False
        if not self.begin <= m.store_timestamp <= self.end:
            return False
        if self.needle is not None and self.needle not in m.properties_raw:  # cheap: the key's bytes must be there
            return False
        return _key_matches(m, self.key)


def _matcher(topics: set[str] | None, key: str, begin: int, end: int) -> _KeyMatch:
    return _KeyMatch(topics, key, begin, end)
