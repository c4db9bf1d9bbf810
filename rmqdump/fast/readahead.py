"""A compiled walk of one segment run a batch ahead on a second thread, for a caller that is busy with each
batch (``verify``'s checks and consume-queue join, the recovery prediction's re-dispatch).

:class:`ReadAhead` iterates a :class:`~rmqdump.fast.segment_walk.FastSegmentWalk` on a worker thread (the walk
kernel releases the GIL) and hands its batches to the calling thread through a bounded queue, in order.
Whatever the caller does with a batch runs on its own thread exactly as in a serial ``for batch in walk`` loop,
so results are the serial loop's by construction. The walk fills a ring of ``DEPTH + 2`` column sets in turn
(the batch being used, :data:`DEPTH` waiting, the one being walked): a set is filled again only once the caller
has asked for the batch after the one it held, as a serial loop's reused arrays are, and no batch is copied.
Memory stays bounded by those batches.

The walk runs with its own page release off: it releases the mapped pages behind the batches the caller is
done with (the caller reads the records' bytes after the walk moved on), and the caller, while it waits
for the next batch, maps the pages the walk reads next (:data:`POPULATE_AHEAD` bytes ahead of it), taking
the walk's page faults off the walking thread. An exception of the walk (an
:class:`~rmqdump.errors.RmqdumpError` included) is raised in the caller where the serial loop would have
raised it; a caller that stops early stops and joins the worker before the walk can be unmapped.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: batches waiting between the threads (each up to 65536 rows, ~13 MB of columns, and 16 MiB of mapped pages).
#: The checks are the slower side: one waiting batch keeps them busy, and more would only hold more pages.
DEPTH = 1
_POLL = 0.05
#: bytes the caller's thread, when it waits, maps ahead of where the walk is
POPULATE_AHEAD = 16 << 20
#: the GIL switch interval while both threads run: a thread coming back from a kernel call (which released the
#: GIL) waits for the other to give it up, by default up to 5 ms each time
SWITCH_INTERVAL = 0.0002

_END = object()


class _Stopped(Exception):
    """The caller gave up: the worker unwinds."""


def wanted(segments, use_mmap: bool) -> bool:
    """Whether to walk ahead: two CPUs or more and every segment on the compiled path (a pure walk holds the
    GIL: nothing to gain)."""
    from rmqdump.fast.walk import backend, default_jobs, use_fast

    if not use_mmap or not segments or not all(use_fast(s.size, segments=(s,)) for s in segments):
        return False
    if default_jobs() < 2:
        return False
    backend()  # load (or build) the kernels once, before a thread starts
    return True


@contextmanager
def switch_interval(seconds: float = SWITCH_INTERVAL):
    """A short GIL switch interval while a read-ahead walk runs (restored after)."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(min(old, seconds))
    try:
        yield
    finally:
        sys.setswitchinterval(old)


class ReadAhead:
    """``for batch in ReadAhead(walk)``: the batches of ``walk`` (built with ``release_pages=False``), each
    intact until the next one is asked for."""

    def __init__(self, walk: Any, depth: int = DEPTH, spares: list | None = None):
        self.walk = walk
        self.depth = depth
        self.ring: list[Any] = []  # the column sets the walk fills in turn
        #: column sets to fill besides the walk's own, given back at the end: a caller walking segment after
        #: segment keeps one list, so the sets are made once (the C allocator keeps what it frees)
        self.spares = [] if spares is None else spares
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.front = walk.start_pos  # where the walk goes on from (read by the caller to map ahead)
        self.mapped = walk.start_pos  # how far the caller has mapped
        self.checked = walk.start_pos  # where the batches the caller is done with end (read by the walk)

    def _put(self, item: Any) -> None:
        while True:
            if self.stop.is_set():
                raise _Stopped
            try:
                self.q.put(item, timeout=_POLL)
                return
            except queue.Full:
                continue

    def _work(self) -> None:
        try:
            for i, batch in enumerate(self.walk, 1):
                self.front = int(batch["file_pos"][-1]) + int(batch["size"][-1])
                self._put(batch)
                self.walk.use_columns(self.ring[i % len(self.ring)])  # the walk waits at its yield
                self.walk.release_before(self.checked)  # here: the caller's thread is the busier one
            self._put(_END)
        except _Stopped:
            return
        except BaseException as e:  # noqa: BLE001 - handed to the caller, raised there
            try:
                self._put(e)
            except _Stopped:
                return

    def _map_ahead(self) -> bool:
        """Map one more step ahead of the walk; False when there is nothing (more) to map now."""
        pos = self.front
        start = max(self.mapped, pos)
        if start >= pos + POPULATE_AHEAD:
            return False
        self.mapped = self.walk.populate(start, pos + POPULATE_AHEAD)
        return self.mapped > start

    def _take_spare(self) -> Any:
        """A spare column set the walk can fill beside its own (a new one when none fits)."""
        for k, cols in enumerate(self.spares):
            if self.walk.fits(cols):
                return self.spares.pop(k)
        return self.walk.cols.like()

    def __iter__(self) -> Iterator[Any]:
        own = self.walk.cols
        self.spares[:] = [cols for cols in self.spares if cols is not own]  # the walk's own set is no spare
        self.ring = [own] + [self._take_spare() for _ in range(self.depth + 1)]
        worker = threading.Thread(target=self._work, name="rmqdump-walk-ahead", daemon=True)
        worker.start()
        try:
            while True:
                try:
                    item = self.q.get_nowait()
                except queue.Empty:
                    if self._map_ahead():
                        continue
                    item = self.q.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
                self.checked = int(item["file_pos"][-1]) + int(item["size"][-1])
        finally:
            self.stop.set()
            worker.join()
            self.spares.extend(cols for cols in self.ring if cols is not self.walk.cols)
