"""The segment loop of ``verify`` in two stages on two threads, when consume queues are checked.

A worker thread walks and checks the segments one after the other (the compiled walk and record checks
release the GIL); every record the consume-queue checker must see - the rows of the walk batches the record
checks cleared (``on_batch``) and the records they looked at (``on_message``) - is handed to the calling
thread through a bounded queue, in commitlog order, and the checker runs there. Memory stays bounded: at
most :data:`DEPTH` items are in flight, each a copy of the rows of one batch (the walk reuses its column
arrays) or a list of at most :data:`MESSAGES` records.

Results are those of the serial loop: the checker sees the same records in the same order, the segments'
results come back in segment order, and an :class:`~rmqdump.errors.RmqdumpError` ends a segment as it does
there - raised by the segment's walk (after the checker has seen what came before it) or by the checker
(the rest of that segment is not given to the checker, the segment's result is dropped). Any other exception,
from either thread, is raised in the caller, and the worker is stopped.
"""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rmqdump.errors import RmqdumpError

#: items in flight between the threads (batches of up to 65536 rows: about 13 MB each at most)
DEPTH = 3
#: records collected per ``on_message`` item
MESSAGES = 1024
_POLL = 0.05
#: bytes the caller's thread, when it waits, maps ahead of where the walk is (its page faults, taken off the
#: walking thread)
POPULATE_AHEAD = 16 << 20
#: the GIL switch interval while both threads run: a thread coming back from a kernel call (which released the
#: GIL) waits for the other to give it up, by default up to 5 ms each time
SWITCH_INTERVAL = 0.0002


class _Stopped(Exception):
    """The caller gave up: the worker unwinds."""


class _Sink:
    """The worker's side: ``on_message`` / ``on_batch`` as the segment verification calls them.

    The compiled segment check walks with page release off when it sees :attr:`defers_release` and hands its
    walks over (:meth:`start_walk`, :meth:`end_walk`): the caller's thread releases the mapped pages behind
    the batches it has joined, and unmaps the segment after its last batch.
    """

    defers_release = True

    def __init__(self, q: queue.Queue, stop: threading.Event):
        self.q, self.stop = q, stop
        self.k = 0
        self.msgs: list = []
        self.walk = None
        self.front: tuple = (None, 0)  # (walk, position) where the walk goes on from: read by the caller

    def start_walk(self, walk) -> None:
        self.walk = walk
        self.front = (walk, walk.start_pos)

    def end_walk(self, walk) -> None:
        """The walk is done: the caller's thread unmaps it once it has joined every batch before."""
        self.walk = None
        self.front = (None, 0)
        try:
            self.flush()
            self.put(("w", self.k, walk))
        except _Stopped:
            walk.close()

    def put(self, item: tuple) -> None:
        while True:
            if self.stop.is_set():
                raise _Stopped
            try:
                self.q.put(item, timeout=_POLL)
                return
            except queue.Full:
                continue

    def flush(self) -> None:
        if self.msgs:
            msgs, self.msgs = self.msgs, []
            self.put(("m", self.k, msgs))

    def on_message(self, rec) -> None:
        self.msgs.append(rec)
        if len(self.msgs) >= MESSAGES:
            self.flush()

    def on_batch(self, batch, lo: int, hi: int) -> None:
        if hi <= lo:
            return
        self.flush()
        cls = type(batch)
        own = cls(batch.buf, {k: v[lo:hi].copy() for k, v in batch.columns.items()}, hi - lo, batch.seg_start,
                  batch.file, batch.intern)
        self.front = (self.walk, int(batch["file_pos"][hi - 1]) + int(batch["size"][hi - 1]))
        self.put(("b", self.k, (own, self.walk, int(batch["file_pos"][lo]))))


class _Ahead:
    """The caller's thread, while it waits for the walk, maps the pages the walk reads next
    (:data:`POPULATE_AHEAD` bytes from where it goes on), a step at a time."""

    def __init__(self, sink: _Sink):
        self.sink = sink
        self.walk = None
        self.at = 0

    def step(self) -> bool:
        """Map one more step; False when there is nothing (more) to map now."""
        walk, pos = self.sink.front
        if walk is None:
            return False
        if walk is not self.walk:
            self.walk, self.at = walk, pos
        start = max(self.at, pos)
        if start >= pos + POPULATE_AHEAD:
            return False
        self.at = walk.populate(start, pos + POPULATE_AHEAD)
        return self.at > start


def wanted(segments: Sequence, use_mmap: bool) -> bool:
    """Whether verify's segment loop runs in two stages: two CPUs or more and every segment on the compiled
    path (a pure walk holds the GIL: nothing to gain)."""
    from rmqdump.fast.walk import backend, default_jobs, use_fast

    if not use_mmap or not segments or not all(use_fast(s.size, segments=(s,)) for s in segments):
        return False
    if default_jobs() < 2:
        return False
    backend()  # load (or build) the kernels once, before the thread starts
    return True


def verify_pipelined(segments: Sequence, verify_one: Callable[[Any, Callable, Callable], Any],
                     on_message: Callable, on_batch: Callable) -> Iterator[tuple[Any, Any]]:
    """``(segment, result or RmqdumpError)`` per segment, in order, as the serial loop would give them.

    ``verify_one(segment, on_message, on_batch)`` verifies one segment on the worker thread (raising
    RmqdumpError when it cannot); ``on_message`` / ``on_batch`` are the checker's, called on this thread.
    """
    q: queue.Queue = queue.Queue(maxsize=DEPTH)
    stop = threading.Event()
    sink = _Sink(q, stop)

    def work() -> None:
        try:
            for k, seg in enumerate(segments):
                sink.k = k
                try:
                    res = verify_one(seg, sink.on_message, sink.on_batch)
                except RmqdumpError as e:
                    res = e
                sink.flush()
                sink.put(("e", k, res))
        except _Stopped:
            return
        except BaseException as e:  # noqa: BLE001 - handed to the caller, raised there
            sink.msgs = []
            try:
                sink.put(("x", -1, e))
            except _Stopped:
                return

    worker = threading.Thread(target=work, name="rmqdump-verify-walk", daemon=True)
    switch = sys.getswitchinterval()
    sys.setswitchinterval(min(switch, SWITCH_INTERVAL))
    worker.start()
    failed: dict[int, RmqdumpError] = {}
    ahead = _Ahead(sink)
    try:
        done = 0
        while done < len(segments):
            try:
                kind, k, item = q.get_nowait()
            except queue.Empty:
                if ahead.step():
                    continue
                kind, k, item = q.get()
            if kind == "x":
                raise item
            if kind == "e":
                done += 1
                yield segments[k], failed.pop(k, item)
                continue
            if kind == "w":
                item.release_before(item.size)
                item.close()
                continue
            if k in failed:
                continue
            try:
                if kind == "b":
                    batch, walk, pos = item
                    on_batch(batch, 0, batch.n)
                    if walk is not None:
                        walk.release_before(pos)
                else:
                    for rec in item:
                        on_message(rec)
            except RmqdumpError as e:
                failed[k] = e
    finally:
        stop.set()
        worker.join()
        sys.setswitchinterval(switch)
