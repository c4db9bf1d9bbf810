"""Compiled fast path for the commitlog walk, the header decode and the body CRC.

Results are identical to the pure path (:class:`rmqdump.store.commitlog.Walk` /
:func:`rmqdump.codec.record.decode_record`): same records, same fields, same stop verdict (offset and
kind); ``tests/test_fastwalk.py`` checks this on every real store, the fixtures and hostile
inputs. Importing this module is cheap: numpy and numba (``pip install 'rmqdump[fast]'``) load
only when a fast walk actually runs, so small jobs should ask :func:`use_fast` first.

Layers:

* :func:`walk_segment_fast` / :func:`walk_buffer_fast` -> :class:`FastSegmentWalk`: iterate
  one segment as :class:`RecordBatch` column batches (numpy arrays of every fixed header field
  plus positions of body, topic and properties), then read ``.stop`` (:class:`SegmentStop`)
  (:mod:`rmqdump.fast.segment_walk`; the batches: :mod:`rmqdump.fast.batch`).
* :class:`FastWalk` (this module): a drop-in for ``CommitLog.walk(...)`` (without ``keep_going``)
  yielding the same :class:`~rmqdump.codec.record.Message` / :class:`~rmqdump.codec.record.Blank` objects.
* :func:`summarize_segment`, :func:`verify_segments` (segments in parallel threads; the kernel
  releases the GIL) and :func:`parallel_segment_map` (any picklable function, in processes)
  (:mod:`rmqdump.fast.segment_jobs`).

This module re-exports the fast path's names (``fast.walk.X`` for all of them); the engine choice and the
backend (build, cache, load) are :mod:`rmqdump.fast.engine`.

Kernels: numba code in :mod:`rmqdump.fast._kernels`, compiled once per machine (in a child
process) into a shared library under :func:`cache_dir` and then loaded with ctypes, so a run
pays neither numba's import (~0.4 s, ~90 MB) nor compilation; without a C compiler the same
kernels run through numba's JIT (numba's own cache). The kernels release the GIL.

Environment: ``RMQDUMP_FAST=0`` disables the fast path, ``RMQDUMP_FAST=1`` forces it whatever
the size; ``RMQDUMP_CRC=table`` uses the slice-by-8 table CRC instead of PCLMULQDQ folding;
``RMQDUMP_FAST_LIBRARY=0`` skips the shared library (numba JIT); ``RMQDUMP_CACHE_DIR`` moves
the cache (default ``$XDG_CACHE_HOME/rmqdump`` or ``~/.cache/rmqdump``); ``CC`` the compiler.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.codec.record import END_OF_DATA, Blank, Invalid, Message
from rmqdump.fast.abi import COLUMNS  # noqa: F401 - the column order, re-exported for the callers
from rmqdump.fast.batch import BATCH_BYTES, BATCH_RECORDS, RecordBatch, _Columns  # noqa: F401 - re-exported
from rmqdump.fast.engine import (  # noqa: F401 - the engine's names, re-exported for the callers
    FAST_THRESHOLD,
    Backend,
    _abi,
    _as_array,
    _cpu_signature,
    _import_fastkernels,
    _np,
    _numpy,
    _toolchain_signature,
    backend,
    build_kernel_library,
    build_library,
    build_lock,
    cache_dir,
    crc32,
    crc_mode,
    fast_available,
    kernel_library_path,
    kernels,
    library_path,
    library_ready,
    use_fast,
)
from rmqdump.fast.segment_jobs import (  # noqa: F401 - re-exported for the callers
    SegmentSummary,
    default_jobs,
    parallel_segment_map,
    summarize_segment,
    verify_segments,
)
from rmqdump.fast.segment_walk import (  # noqa: F401 - re-exported for the callers
    FastSegmentWalk,
    SegmentStop,
    _map,
    walk_buffer_fast,
    walk_segment_fast,
)

if TYPE_CHECKING:
    from rmqdump.store.commitlog import CommitLog


class FastWalk:
    """Drop-in for :class:`rmqdump.store.commitlog.Walk` without ``keep_going``: same iteration
    (:class:`Message` and :class:`Blank`), same ``stop``, ``end_offset``, ``records``,
    ``bytes_done`` afterwards. ``use_mmap`` is implied (the kernel reads a mapping)."""

    def __init__(self, commitlog: CommitLog, *, start: int | None = None, end: int | None = None,
                 check_crc: bool = True, read_body: bool = True, max_record_size: int = MAX_RECORD_SIZE,
                 batch_records: int = BATCH_RECORDS, strict: bool = False):
        self.cl = commitlog
        self.start = commitlog.min_offset if start is None else start
        self.end = end
        self.check_crc = check_crc
        self.read_body = read_body
        self.max_record_size = max_record_size
        self.batch_records = batch_records
        self.strict = strict
        self.stop: Invalid | None = None
        self.end_offset = self.start
        self.records = 0
        self.bytes_done = 0

    def batches(self) -> Iterator[RecordBatch | Blank]:
        """The walk as column batches (and Blank records); sets ``stop`` like :meth:`__iter__`."""
        segs = [s for s in self.cl.segments if s.start + s.size > self.start]
        if not segs:
            self.stop = Invalid(self.start, "", 0, END_OF_DATA, f"offset {self.start} is past the end of the commitlog")
            return
        columns = None
        for seg in segs:
            w = FastSegmentWalk(segment=seg, start_pos=max(0, self.start - seg.start), check_crc=self.check_crc,
                                end_offset=self.end, max_record_size=self.max_record_size,
                                batch_records=self.batch_records, strict=self.strict, columns=columns)
            columns = w.cols
            try:
                for batch in w:
                    self.records += batch.n
                    self.end_offset = seg.start + int(batch["file_pos"][-1]) + int(batch["size"][-1])
                    yield batch
            finally:
                w.close()
            self.bytes_done += seg.size
            st = w.stop
            if st.kind == "blank":
                self.end_offset = seg.start + seg.size
                yield st.blank
            elif st.kind == "limit":
                self.stop = Invalid(st.offset, seg.name, st.pos, END_OF_DATA, f"reached --to-offset {self.end}")
                return
            elif st.kind == "invalid":
                self.stop = st.invalid
                return
        last = segs[-1]
        self.stop = Invalid(last.end, last.name, last.size, END_OF_DATA, "end of the last commitlog segment")

    def __iter__(self) -> Iterator[Message | Blank]:
        for item in self.batches():
            if isinstance(item, RecordBatch):
                yield from item.messages(self.read_body)
            else:
                yield item
