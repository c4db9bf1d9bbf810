"""The commitlog side of a key lookup: walk a range for records whose topic, store time and key match,
counting the indexable records the index should have held."""

from __future__ import annotations

from collections.abc import Callable

from rmqdump.analysis.lookup.result import LookupResult, _key_matches
from rmqdump.codec.layout import TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK
from rmqdump.codec.record import Message
from rmqdump.store.commitlog import CommitLog, Skipped


def _indexable(msg: Message) -> bool:
    """Whether ``IndexService.buildIndex`` puts entries for this record."""
    if msg.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
        return False
    return msg.uniq_key is not None or bool(msg.keys)


def _scan(cl: CommitLog, start: int, end: int | None, match: Callable[[Message], bool], res: LookupResult,
          *, keep_going: bool, use_mmap: bool, max_record_size: int, already: int | None = None,
          count: bool = False, progress: Callable[[int], None] | None = None) -> tuple[list[int], int]:
    """Walk [start, end); offsets of matching records and (``count``) how many indexable ones lay past ``already``."""
    walk = cl.walk(start=start, end=end, check_crc=False, read_body=False, keep_going=keep_going,
                   use_mmap=use_mmap, max_record_size=max_record_size)
    found: list[int] = []
    unindexed = 0
    skipped = 0
    for n, rec in enumerate(walk):
        if progress is not None and n & 1023 == 0:
            progress(walk.end_offset)
        if isinstance(rec, Message):
            if count and (already is None or rec.offset > already) and _indexable(rec):
                unindexed += 1
            if match(rec):
                found.append(rec.offset)
        elif isinstance(rec, Skipped):
            skipped += 1
            res.warnings.append(f"scan skipped damaged bytes [{rec.start}, {rec.end}) in {rec.file}: "
                                f"{rec.reason.kind}: {rec.reason.detail}")
    stop = walk.stop
    stop_at = walk.end_offset
    if stop is not None and stop.kind != "end_of_data" and not keep_going:
        res.warnings.append(f"scan stopped at damage at offset {stop.offset}: {stop.kind}: {stop.detail}")
    res.scanned.append((start, stop_at if end is None else min(end, max(stop_at, start))))
    return found, unindexed


def _matcher(topics: set[str] | None, key: str, begin: int, end: int) -> Callable[[Message], bool]:
    raw = {t.encode("utf-8") for t in topics} if topics is not None else None
    kb = key.encode("utf-8", "surrogatepass")
    prefilter = "\ufffd" not in key  # U+FFFD may stand for undecodable bytes

    def match(m: Message) -> bool:
        if raw is not None and m.topic_raw not in raw:
            return False
        if not begin <= m.store_timestamp <= end:
            return False
        if prefilter and kb not in m.properties_raw:  # cheap: the key must appear in the properties bytes
            return False
        return _key_matches(m, key)

    return match
