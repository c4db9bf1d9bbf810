"""verify's read-ahead (fast.readahead: each segment's compiled walk a few batches ahead on a
second thread, the checks and the consume-queue join on the caller's) gives the serial loop's document: on
damaged consume queues, with a segment that cannot be read, with the checker or the walk failing in a
segment, with the same progress calls; a bug on the walking thread surfaces in the caller, and the thread
has ended whenever the segment's walk is unmapped."""

from __future__ import annotations

import json
import threading

import pytest
from test_verify_cq_fast import _copy, _damage

import rmqdump.analysis.verify as V
from conftest import FIXTURES
from rmqdump.analysis.verify import queue_fast
from rmqdump.errors import StoreError
from rmqdump.fast import readahead
from rmqdump.fast import walk as fastwalk
from rmqdump.fast.segment_walk import FastSegmentWalk

pytestmark = pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")


def _walkers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "rmqdump-walk-ahead"]


def _doc(path, monkeypatch, ahead: bool, **kw) -> str:
    """The JSON document with the compiled walk, read ahead (checked to have run) or serial."""
    monkeypatch.setenv("RMQDUMP_FAST", "1")
    monkeypatch.setattr(readahead, "DEPTH", 1)  # the walk waits on the caller all the time
    ran = []
    real = readahead.ReadAhead.__iter__

    def spy(self):
        ran.append(1)
        yield from real(self)

    monkeypatch.setattr(readahead.ReadAhead, "__iter__", spy)
    monkeypatch.setattr(readahead, "wanted", lambda segments, use_mmap: ahead)
    doc = json.dumps(V.verify_store(path, **kw).to_dict(), sort_keys=True)
    assert bool(ran) == ahead
    assert not _walkers()
    return doc


def _small_batches(monkeypatch, n: int) -> None:
    real_init = FastSegmentWalk.__init__

    def init(self, *a, **kw):
        kw["batch_records"] = n
        real_init(self, *a, **kw)

    monkeypatch.setattr(FastSegmentWalk, "__init__", init)


def _same(path, monkeypatch, **kw) -> dict:
    serial = _doc(path, monkeypatch, False, **kw)
    assert _doc(path, monkeypatch, True, **kw) == serial
    return json.loads(serial)


@pytest.mark.parametrize("how", ["size", "swap", "extra_duplicate", "queue_range"])
@pytest.mark.parametrize("keep_going", [False, True])
def test_read_ahead_matches_serial_on_damaged_queues(tmp_path, monkeypatch, how, keep_going):
    store = _copy(tmp_path, FIXTURES / "store")
    kw = _damage(store, how)
    # tiny windows: the join's state moves with every few records, so any reordering shows; batches of 3
    # records: the walk refills its columns while the caller still checks the batch before
    monkeypatch.setattr(queue_fast, "WINDOW_BYTES", 700)
    _small_batches(monkeypatch, 3)
    doc = _same(store, monkeypatch, keep_going=keep_going, **kw)
    assert any(f["kind"].startswith(("cq_", "queue_id")) for f in doc["findings"]), how


def test_read_ahead_unreadable_segment(tmp_path, monkeypatch):
    """The checker fails inside segment 1, the walk of segment 2 fails after its first batch, segment 3 fails
    after its batches were checked: each becomes ``segment_unreadable`` and the checker goes on with the next
    segment, as in the serial loop."""
    store = _copy(tmp_path, FIXTURES / "store")
    _damage(store, "size")
    real_verify, real_batch = V.verify_segment, queue_fast.FastCqChecker.on_batch
    real_iter = FastSegmentWalk.__iter__

    def verify(seg, **kw):
        res = real_verify(seg, **kw)
        if seg.start == 12288:
            raise StoreError("cannot map: test", seg.path)
        return res

    def on_batch(self, batch, lo, hi):
        if batch.seg_start == 4096:
            raise StoreError("checker failed", str(batch.file))
        real_batch(self, batch, lo, hi)

    def walk_iter(self):
        for batch in real_iter(self):
            yield batch
            if self.seg_start == 8192:
                raise StoreError("read failed: test", str(self.name))

    monkeypatch.setattr(V, "verify_segment", verify)
    monkeypatch.setattr(queue_fast.FastCqChecker, "on_batch", on_batch)
    monkeypatch.setattr(FastSegmentWalk, "__iter__", walk_iter)
    doc = _same(store, monkeypatch)
    bad = [f for f in doc["findings"] if f["kind"] == "segment_unreadable"]
    assert [f["file"] for f in bad] == ["commitlog/00000000000000004096", "commitlog/00000000000000008192",
                                        "commitlog/00000000000000012288"]
    assert "checker failed" in bad[0]["detail"] and "read failed: test" in bad[1]["detail"]
    assert "cannot map: test" in bad[2]["detail"]
    assert any(f["kind"].startswith("cq_") for f in doc["findings"])


def test_read_ahead_progress_calls_match(tmp_path, monkeypatch):
    calls: dict[bool, list] = {False: [], True: []}
    for ahead in (False, True):
        monkeypatch.setenv("RMQDUMP_FAST", "1")
        monkeypatch.setattr(readahead, "wanted", lambda segments, use_mmap, p=ahead: p)
        V.verify_store(FIXTURES / "store", progress=lambda d, t, p=ahead: calls[p].append((d, t)))
    assert calls[True] == calls[False] and calls[True][-1] == (4 * 4096, 4 * 4096)


def test_a_bug_on_the_walking_thread_surfaces(monkeypatch):
    real_use = FastSegmentWalk.use_columns

    def use_columns(self, cols):  # called on the walking thread only, once a walk has begun
        if self.seg_start == 4096 and getattr(self, "records", 0):
            raise ZeroDivisionError("bug in segment 1")
        real_use(self, cols)

    monkeypatch.setattr(FastSegmentWalk, "use_columns", use_columns)
    monkeypatch.setenv("RMQDUMP_FAST", "1")
    monkeypatch.setattr(readahead, "wanted", lambda segments, use_mmap: True)
    with pytest.raises(ZeroDivisionError, match="bug in segment 1"):
        V.verify_store(FIXTURES / "store")
    assert not _walkers()


def _rss_kb(path) -> int:
    """Resident kB of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, mine = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
                mine = line.rstrip().endswith(str(path))
            elif mine and line.startswith("Rss:"):
                total += int(head[1])
    return total


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="no /proc/self/smaps here")
def test_populate_maps_the_pages_the_walk_reads_next(tmp_path):
    import mmap

    from rmqdump.disk.segment import Segment
    from rmqdump.fast.segment_walk import _MADV_POPULATE_READ, POPULATE_STEP, FastSegmentWalk

    path = tmp_path / "00000000000000000000"
    path.write_bytes(b"\0" * (4 << 20))
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 4096, access=mmap.ACCESS_READ) as probe:
        try:
            probe.madvise(_MADV_POPULATE_READ, 0, 4096)
        except OSError:
            pytest.skip("this kernel has no MADV_POPULATE_READ (Linux < 5.14)")
    w = FastSegmentWalk(segment=Segment(path, 0, 4 << 20), release_pages=False)
    try:
        assert _rss_kb(path) == 0
        assert w.populate(4096, 3 << 20) == POPULATE_STEP + 4096  # one step at a time
        assert POPULATE_STEP // 1024 <= _rss_kb(path) < 4096  # (a large folio maps a little more)
        assert w.populate(3 << 20, 8 << 20) == 4 << 20  # never past the segment
        w.release_before(2 << 20)
        assert w.populate(4096, 1 << 20) == 4096  # nor behind what was released
    finally:
        w.close()
    assert w.populate(0, 1 << 20) == 0  # unmapped: nothing


def test_ahead_maps_a_bounded_window_from_where_the_walk_goes_on(monkeypatch):
    monkeypatch.setattr(readahead, "POPULATE_AHEAD", 10)
    calls = []

    class Walk:
        start_pos = 100

        def populate(self, start, upto):
            calls.append((start, upto))
            return min(upto, start + 4)

    ahead = readahead.ReadAhead(Walk())
    while ahead._map_ahead():
        pass
    assert calls == [(100, 110), (104, 110), (108, 110)]
    calls.clear()
    ahead.front = 106  # the walk moved on: from where it is or what is mapped, up to 10 past it
    while ahead._map_ahead():
        pass
    assert calls == [(110, 116), (114, 116)]


def test_stopping_early_ends_the_walking_thread_before_the_walk_is_unmapped():
    from rmqdump.disk.segment import Segment

    path = FIXTURES / "store" / "commitlog" / "00000000000000000000"
    w = FastSegmentWalk(segment=Segment(path, 0, path.stat().st_size), release_pages=False, batch_records=1)
    try:
        it = iter(readahead.ReadAhead(w, depth=1))
        first = next(it)
        assert first.n == 1
        it.close()  # the caller stops (an error in its checks): the walking thread is gone when close returns
        assert not _walkers()
    finally:
        w.close()


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/smaps"), reason="no /proc/self/smaps here")
def test_the_pages_behind_each_checked_batch_are_released(tmp_path, monkeypatch):
    """Mapped pages stay bounded by the batches in flight (checked, waiting, walked) plus what is mapped
    ahead, whatever the segment's size: the walk releases the pages of each batch the caller is done with."""
    from rmqdump.disk.segment import Segment
    from rmqdump.write.writer import MessageSpec, StoreWriter

    mib = 1 << 20
    with StoreWriter(tmp_path / "s", commitlog_file_size=24 * mib) as w:
        for i in range(20 * 1024):
            w.append(MessageSpec("T", bytes([i % 251]) * 1000, queue_id=i % 2))
        w.sync()
    path = tmp_path / "s" / "commitlog" / "00000000000000000000"
    monkeypatch.setattr(readahead, "POPULATE_AHEAD", mib)
    walk = FastSegmentWalk(segment=Segment(path, 0, path.stat().st_size), release_pages=False, batch_bytes=mib)
    peak = batches = 0
    try:
        for batch in readahead.ReadAhead(walk, depth=1):
            batches += 1
            peak = max(peak, _rss_kb(path))
            assert batch.n
    finally:
        walk.close()
    assert batches >= 18
    assert peak <= 6 * 1024, f"{peak} kB of the segment mapped at once"


def test_a_batch_stays_intact_while_the_caller_holds_it():
    """The walk fills a ring of column sets and runs ahead while the caller holds a batch: the batch
    still reads as the serial walk's when the caller is done with it (no copy is made)."""
    import time

    from rmqdump.disk.segment import Segment

    path = FIXTURES / "store" / "commitlog" / "00000000000000000000"
    seg = Segment(path, 0, path.stat().st_size)

    def walk():
        return FastSegmentWalk(segment=seg, release_pages=False, batch_records=1)

    with walk() as w:
        serial = [{k: v.tolist() for k, v in b.copy().columns.items()} for b in w]
    held = []
    with walk() as w:
        for batch in readahead.ReadAhead(w, depth=1):
            time.sleep(0.02)  # the walk fills every set it may meanwhile
            held.append({k: v.tolist() for k, v in batch.columns.items()})
    assert len(serial) > 4 and held == serial


@pytest.mark.parametrize("batch_records", [1, 2])
@pytest.mark.parametrize("next_own", ["last_filled", "first"])
def test_walks_one_after_another_share_one_ring_of_column_sets(next_own, batch_records):
    """A caller walking segment after segment hands each read-ahead the same spare list: the ring's extra
    column sets are made once, not once per segment (the C allocator keeps what it frees), when the next
    walk begins with the set the last one filled last. Whichever set it begins with (also the one the last
    walk began with, which is back in the spare list), a ring never holds a set twice."""
    from rmqdump.disk.segment import Segment

    spares: list = []
    columns = None
    rings = []
    for name in ("00000000000000000000", "00000000000000004096", "00000000000000008192"):
        path = FIXTURES / "store" / "commitlog" / name
        with FastSegmentWalk(segment=Segment(path, int(name), path.stat().st_size), release_pages=False,
                             batch_records=batch_records, columns=columns) as w:
            ahead = readahead.ReadAhead(w, depth=1, spares=spares)
            assert sum(1 for _ in ahead) >= 1
            columns = w.cols if next_own == "last_filled" else ahead.ring[0]
            rings.append([id(c) for c in ahead.ring])
        assert len({id(c) for c in spares}) == len(spares) >= 2
    assert all(len(set(r)) == 3 for r in rings)
    if next_own == "last_filled":  # as verify and the re-dispatch do: no set is made after the first ring
        assert len({i for r in rings for i in r}) == 3
