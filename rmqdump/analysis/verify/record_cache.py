"""Random access to commitlog records for the store checks (:class:`RecordCache`: one open reader per
segment)."""

from __future__ import annotations

from pathlib import Path

from rmqdump.codec.record import Invalid, Message
from rmqdump.store.commitlog import CommitLog, read_record


class RecordCache:
    """Random access to commitlog records through one open reader per segment."""

    def __init__(self, cl: CommitLog, use_mmap: bool = True):
        self.cl, self.use_mmap, self.readers = cl, use_mmap, {}

    def decode(self, offset: int, check_crc: bool = True) -> Message | Invalid:
        seg = self.cl.segment_for(offset)
        if seg is None:
            return Invalid(offset, "", 0, "end_of_data", f"offset {offset} is outside every commitlog segment")
        r = self.readers.get(seg.start)
        if r is None:
            r = self.readers[seg.start] = seg.open(self.use_mmap)
        rec = read_record(r, offset - seg.start, check_crc=check_crc, read_body=False)
        if not isinstance(rec, Message):
            if isinstance(rec, Invalid):
                return rec
            return Invalid(offset, seg.name, offset - seg.start, "blank", "a BLANK (end-of-file) record")
        return rec

    def close(self) -> None:
        for r in self.readers.values():
            r.close()
        self.readers.clear()


def _rel(root: Path | None, p: Path | str) -> str:
    p = Path(p)
    if root is not None:
        try:
            return str(p.relative_to(root))
        except ValueError:
            pass
    return str(p)
