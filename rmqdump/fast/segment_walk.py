"""One segment (or an in-memory image) walked by the compiled kernel: :class:`FastSegmentWalk` yields
:class:`~rmqdump.fast.batch.RecordBatch` batches, hands the kernel's deferred and invalid stops to the pure
decoder, and ends with a :class:`SegmentStop`; :func:`walk_segment_fast`, :func:`walk_buffer_fast`."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rmqdump.codec.layout import (
    BODY_LENGTH_BASE,
    MAX_RECORD_SIZE,
    host_lengths,
    topic_length_size,
)
from rmqdump.codec.record import (
    END_OF_DATA,
    Blank,
    Invalid,
    Message,
    decode_record,
)
from rmqdump.disk.fileio import open_read
from rmqdump.errors import StoreError
from rmqdump.fast.abi import (
    A_BUF,
    A_BYTE_LIMIT,
    A_CHECK_CRC,
    A_COLUMNS,
    A_CRC_MODE,
    A_D_COLUMNS,
    A_LIMIT,
    A_MAX_N,
    A_MAX_RECORD_SIZE,
    A_N,
    A_OUT_CODE,
    A_OUT_N,
    A_OUT_POS,
    A_POS,
    A_SEG_START,
    A_SIZE,
    A_STATS,
    ARG_BLOCK_SIZE,
    BLANK,
    COLUMNS,
    CRC_TABLE,
    DEFER,
    DERIVED_COLUMNS,
    FULL,
    INVALID,
    KINDS,
    LIMIT,
)
from rmqdump.fast.batch import BATCH_BYTES, BATCH_RECORDS, RecordBatch, _Columns
from rmqdump.fast.engine import _as_array, _numpy, backend, crc_mode

_MADV_POPULATE_READ = 22  # Linux 5.14: fault pages in (EINVAL before)
#: bytes one :meth:`FastSegmentWalk.populate` call maps at most (~0.1 ms here)
POPULATE_STEP = 1 << 20

if TYPE_CHECKING:
    from rmqdump.disk.segment import Segment
    from rmqdump.fast.intern import TopicIntern


@dataclass
class SegmentStop:
    """Why a segment walk ended.

    ``kind``: ``"end"`` (a record ended exactly at the end of the segment), ``"blank"`` (a valid
    end-of-file BLANK at ``pos``: ``blank`` holds it), ``"limit"`` (reached ``end_offset``) or
    ``"invalid"`` (``invalid`` holds the pure decoder's verdict at ``pos``).
    """

    kind: str
    pos: int
    offset: int
    invalid: Invalid | None = None
    blank: Blank | None = None

    @property
    def damaged(self) -> bool:
        """An invalid record other than unwritten (zero) space."""
        return self.invalid is not None and self.invalid.kind != END_OF_DATA


class FastSegmentWalk:
    """Walk one segment (or a buffer) with the compiled kernel; iterate for :class:`RecordBatch`.

    After iteration: ``stop`` (:class:`SegmentStop`), ``records``, ``end_pos`` (segment position
    after the last valid record; the segment size after a BLANK), ``phys_mismatches`` and
    ``first_phys_mismatch`` (records whose PHYSICALOFFSET field is not their offset; the broker
    does not check it, so neither does the walk - it only counts). With ``intern`` (a
    :class:`~rmqdump.fast.intern.TopicIntern`) the batches also hold ``abi.DERIVED_COLUMNS`` and carry it.
    """

    def __init__(self, *, segment: Segment | None = None, buf=None, seg_start: int = 0, name: str = "",
                 start_pos: int = 0, check_crc: bool = True, end_offset: int | None = None,
                 max_record_size: int = MAX_RECORD_SIZE, batch_records: int = BATCH_RECORDS,
                 batch_bytes: int = BATCH_BYTES, release_pages: bool = True, strict: bool = False,
                 columns: _Columns | None = None, intern: TopicIntern | None = None):
        self.k = backend()
        self.segment = segment
        self._mm = None
        if segment is not None:
            self.seg_start, self.name = segment.start, segment.name
            self._mm, self.buf = _map(segment)
        else:
            self.seg_start, self.name = seg_start, name
            self.buf = _as_array(buf)
        self.size = int(self.buf.size)
        self.start_pos = start_pos
        self.check_crc = check_crc
        self.limit = self.size + 1 if end_offset is None else max(end_offset - self.seg_start, -1)
        self.max_record_size = max_record_size
        self.batch_records = batch_records
        self.batch_bytes = batch_bytes
        self._can_release = self._mm is not None and hasattr(self._mm, "madvise")
        self.release_pages = release_pages and self._can_release
        self.strict = strict
        derive = intern is not None
        self.intern = intern
        np = _numpy()
        self.stats = np.array([0, -1], dtype=np.int64)
        a = self.block = np.zeros(ARG_BLOCK_SIZE, dtype=np.int64)
        a[A_BUF] = self.buf.ctypes.data if self.size else 0
        a[A_SIZE] = self.size
        a[A_LIMIT] = self.limit
        a[A_MAX_RECORD_SIZE] = max_record_size
        a[A_CHECK_CRC] = 1 if check_crc else 0
        a[A_CRC_MODE] = crc_mode() if check_crc else CRC_TABLE
        a[A_MAX_N] = batch_records
        a[A_SEG_START] = self.seg_start
        a[A_STATS] = self.stats.ctypes.data
        if intern is not None:
            intern.fill(a)
        self.use_columns(columns if columns is not None and self.fits(columns) else _Columns(batch_records, derive))
        self.stop: SegmentStop | None = None
        self.records = 0
        self.end_pos = start_pos
        self.kernel_kind: str | None = None  # the kernel's own verdict at an invalid stop
        self._released = 0
        self._can_populate = self._can_release  # a mapping that takes advice

    @property
    def phys_mismatches(self) -> int:
        return int(self.stats[0])

    @property
    def first_phys_mismatch(self) -> int | None:
        return None if self.stats[0] == 0 else int(self.stats[1])

    def __iter__(self) -> Iterator[RecordBatch]:
        walk = self.k.walk
        a = self.block
        addr = a.ctypes.data
        buf, size = self.buf, self.size
        pos = self.start_pos
        try:
            while True:
                n = 0
                batch_start = pos
                a[A_BYTE_LIMIT] = pos + self.batch_bytes
                while True:
                    a[A_POS] = pos
                    a[A_N] = n
                    walk(addr)
                    n, pos, code = int(a[A_OUT_N]), int(a[A_OUT_POS]), int(a[A_OUT_CODE])
                    if code == DEFER or code >= INVALID:
                        rec = self._pure(pos)
                        if code >= INVALID:
                            self.kernel_kind = KINDS[code - INVALID]
                            if self.strict and (not isinstance(rec, Invalid) or rec.kind != self.kernel_kind):
                                raise AssertionError(f"fast walk verdict {self.kernel_kind} at {pos} differs from "
                                                     f"the pure decoder's {rec!r}")
                        if isinstance(rec, Message):
                            self._take(rec, n, pos)
                            n += 1
                            pos += rec.size
                            continue
                        self._finish(n, pos)
                        if n:
                            yield RecordBatch(buf, self.cols.arrays, n, self.seg_start, self.name, self.intern)
                        if isinstance(rec, Blank):
                            self.end_pos = size
                            self.stop = SegmentStop("blank", pos, self.seg_start + pos, blank=rec)
                        else:
                            self.stop = SegmentStop("invalid", pos, self.seg_start + pos, invalid=rec)
                        return
                    break
                self._finish(n, pos)
                if n:
                    yield RecordBatch(buf, self.cols.arrays, n, self.seg_start, self.name, self.intern)
                if code == FULL:
                    self._release(batch_start)
                    continue
                if code == BLANK:
                    self.end_pos = size
                    self.stop = SegmentStop("blank", pos, self.seg_start + pos,
                                            blank=Blank(self.seg_start + pos, self.name, pos, size - pos, size - pos))
                elif code == LIMIT:
                    self.stop = SegmentStop("limit", pos, self.seg_start + pos)
                else:
                    self.stop = SegmentStop("end", pos, self.seg_start + pos)
                return
        finally:
            self._release(size)

    def fits(self, cols: _Columns) -> bool:
        """Whether this walk can fill ``cols``: room for a batch, and the derived columns when it interns."""
        return cols.capacity >= self.batch_records and cols.derived == (self.intern is not None)

    def use_columns(self, cols: _Columns) -> None:
        """Fill ``cols`` from the next batch on; called between batches (while the walk waits at a yield). A
        walk run on another thread rotates sets, so that a batch it handed over stays intact while read."""
        if not self.fits(cols):
            raise ValueError("columns of another shape")
        self.cols = cols
        a = self.block
        a[A_COLUMNS:A_COLUMNS + len(COLUMNS)] = cols.pointers
        if self.intern is not None:
            a[A_D_COLUMNS:A_D_COLUMNS + len(DERIVED_COLUMNS)] = cols.derived_pointers

    def _finish(self, n: int, pos: int) -> None:
        self.records += n
        if n:
            self.end_pos = pos

    def _pure(self, pos: int) -> Message | Blank | Invalid:
        """The pure decoder's verdict at ``pos`` (for kernel stops: DEFER or invalid)."""
        to_end = self.size - pos
        with memoryview(self.buf) as mv:
            return decode_record(mv, pos, to_end, pos, self.seg_start, self.name, to_end=to_end,
                                 check_crc=self.check_crc, read_body=False, max_record_size=self.max_record_size)

    def _take(self, msg: Message, n: int, pos: int) -> None:
        """Store a record the Python decoder accepted as row ``n``."""
        bh, sh = host_lengths(msg.sys_flag)
        body_start = pos + BODY_LENGTH_BASE + 4 + bh + sh
        topic_start = body_start + max(msg.body_length, 0) + topic_length_size(msg.magic)
        self.cols.set_row(n, msg, body_start, topic_start, topic_start + len(msg.topic_raw) + 2)
        if msg.physical_offset != self.seg_start + pos:
            if self.stats[0] == 0:
                self.stats[1] = pos
            self.stats[0] += 1

    def _release(self, upto: int) -> None:
        """The walk's own release, behind itself, when ``release_pages``."""
        if self.release_pages:
            self.release_before(upto)

    def release_before(self, upto: int) -> None:
        """Drop mapped pages before ``upto`` from our RSS (they stay in the page cache; a later read faults
        them back). A caller that reads a batch's bytes after the walk has moved on (a walk on another
        thread) walks with ``release_pages=False`` and calls this once it is done with them."""
        if not self._can_release:
            return
        end = upto & ~(mmap.PAGESIZE - 1)
        if end - self._released >= (1 << 20) or (upto >= self.size and end > self._released):
            try:
                self._mm.madvise(mmap.MADV_DONTNEED, self._released, end - self._released)
            except (OSError, ValueError):
                self.release_pages = self._can_release = False
            self._released = end

    def populate(self, start: int, upto: int) -> int:
        """Map the pages of ``[start, upto)`` (whole pages, at most :data:`POPULATE_STEP` bytes) into the
        process now, as the walk's reads would fault them in: another thread that would otherwise wait does
        it ahead of the walk. Returns where it stopped (``start`` when it cannot: no mapping, an old kernel)."""
        if not self._can_populate or self._mm is None:
            return start
        lo = start & ~(mmap.PAGESIZE - 1)
        hi = min(upto, self.size, lo + POPULATE_STEP)
        if hi <= lo or lo < self._released:
            return start
        try:
            self._mm.madvise(_MADV_POPULATE_READ, lo, hi - lo)
        except (OSError, ValueError):
            self._can_populate = False
            return start
        return hi

    def close(self) -> None:
        """Unmap the segment (views still held elsewhere keep the mapping alive)."""
        self.buf = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:
                pass
            self._mm = None

    def __enter__(self) -> FastSegmentWalk:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _map(segment: Segment):
    """Read-only mapping of a segment file and a uint8 array over it (no copy)."""
    try:
        fd = open_read(segment.path, nonblock=False)
    except OSError as e:
        raise StoreError(f"cannot open: {e.strerror}", segment.path) from None
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return None, _as_array(b"")
        mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:
        raise StoreError(f"cannot map: {e}", segment.path) from None
    finally:
        os.close(fd)
    if hasattr(mm, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
        try:
            mm.madvise(mmap.MADV_SEQUENTIAL)
        except OSError:
            pass
    return mm, _as_array(mm)


def walk_segment_fast(segment: Segment, start_pos: int = 0, check_crc: bool = True, *,
                      end_offset: int | None = None, max_record_size: int = MAX_RECORD_SIZE,
                      batch_records: int = BATCH_RECORDS, batch_bytes: int = BATCH_BYTES,
                      release_pages: bool = True, strict: bool = False) -> FastSegmentWalk:
    """Walk ``segment`` from ``start_pos`` like ``Walk._walk_segment`` (no ``keep_going``).

    Iterate the result for :class:`RecordBatch` column batches; afterwards ``.stop`` says why
    it ended (a pure-path :class:`Invalid` for damage), ``.end_pos`` where valid data ended.
    ``end_offset`` is the absolute ``--to-offset`` bound. ``strict`` raises AssertionError if
    the kernel's verdict ever differs from the pure decoder's (tests).
    """
    return FastSegmentWalk(segment=segment, start_pos=start_pos, check_crc=check_crc, end_offset=end_offset,
                           max_record_size=max_record_size, batch_records=batch_records, batch_bytes=batch_bytes,
                           release_pages=release_pages, strict=strict)


def walk_buffer_fast(buf, *, seg_start: int = 0, name: str = "", start_pos: int = 0, check_crc: bool = True,
                     end_offset: int | None = None, max_record_size: int = MAX_RECORD_SIZE,
                     batch_records: int = BATCH_RECORDS, strict: bool = False) -> FastSegmentWalk:
    """Like :func:`walk_segment_fast` over an in-memory segment image (bytes, mmap, array)."""
    return FastSegmentWalk(buf=buf, seg_start=seg_start, name=name, start_pos=start_pos, check_crc=check_crc,
                           end_offset=end_offset, max_record_size=max_record_size, batch_records=batch_records,
                           strict=strict)
