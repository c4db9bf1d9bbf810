"""verify's two-stage segment loop (analysis.verify.pipeline: walk + record checks on a worker thread, the
consume-queue join on the caller's) gives the serial loop's document: on damaged consume queues, with a
segment that cannot be read, with the checker failing in a segment, with the same progress calls; a bug in
the worker surfaces in the caller and the worker ends."""

from __future__ import annotations

import json
import threading

import pytest
from test_verify_cq_fast import _copy, _damage

import rmqdump.analysis.verify as V
from conftest import FIXTURES
from rmqdump.analysis.verify import pipeline, queue_fast
from rmqdump.errors import StoreError
from rmqdump.fast import walk as fastwalk

pytestmark = pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")


def _doc(path, monkeypatch, piped: bool, **kw) -> str:
    """The JSON document with the compiled walk, two-stage (checked to have run) or serial."""
    monkeypatch.setenv("RMQDUMP_FAST", "1")
    monkeypatch.setattr(pipeline, "DEPTH", 1)  # the worker waits on the caller all the time
    ran = []
    real = pipeline.verify_pipelined

    def spy(*a, **k):
        ran.append(1)
        yield from real(*a, **k)

    monkeypatch.setattr(pipeline, "verify_pipelined", spy)
    monkeypatch.setattr(pipeline, "wanted", lambda segments, use_mmap: piped)
    doc = json.dumps(V.verify_store(path, **kw).to_dict(), sort_keys=True)
    assert bool(ran) == piped
    return doc


def _same(path, monkeypatch, **kw) -> dict:
    serial = _doc(path, monkeypatch, False, **kw)
    assert _doc(path, monkeypatch, True, **kw) == serial
    return json.loads(serial)


@pytest.mark.parametrize("how", ["size", "swap", "extra_duplicate", "queue_range"])
@pytest.mark.parametrize("keep_going", [False, True])
def test_pipeline_matches_serial_on_damaged_queues(tmp_path, monkeypatch, how, keep_going):
    store = _copy(tmp_path, FIXTURES / "store")
    kw = _damage(store, how)
    # tiny windows: the join's state moves with every few records, so any reordering shows
    monkeypatch.setattr(queue_fast, "WINDOW_BYTES", 700)
    doc = _same(store, monkeypatch, keep_going=keep_going, **kw)
    assert any(f["kind"].startswith(("cq_", "queue_id")) for f in doc["findings"]), how


def test_pipeline_unreadable_segment(tmp_path, monkeypatch):
    """Segment 2 fails after its batches were checked; the checker fails inside segment 1: both become
    ``segment_unreadable`` and the checker goes on with the next segment, as in the serial loop."""
    store = _copy(tmp_path, FIXTURES / "store")
    _damage(store, "size")
    real_verify, real_batch = V.verify_segment, queue_fast.FastCqChecker.on_batch

    def verify(seg, **kw):
        res = real_verify(seg, **kw)
        if seg.start == 8192:
            raise StoreError("cannot map: test", seg.path)
        return res

    def on_batch(self, batch, lo, hi):
        if batch.seg_start == 4096:
            raise StoreError("checker failed", str(batch.file))
        real_batch(self, batch, lo, hi)

    monkeypatch.setattr(V, "verify_segment", verify)
    monkeypatch.setattr(queue_fast.FastCqChecker, "on_batch", on_batch)
    doc = _same(store, monkeypatch)
    bad = [f for f in doc["findings"] if f["kind"] == "segment_unreadable"]
    assert [f["file"] for f in bad] == ["commitlog/00000000000000004096", "commitlog/00000000000000008192"]
    assert "checker failed" in bad[0]["detail"] and "cannot map: test" in bad[1]["detail"]
    assert any(f["kind"].startswith("cq_") for f in doc["findings"])


def test_pipeline_progress_calls_match(tmp_path, monkeypatch):
    calls: dict[bool, list] = {False: [], True: []}
    for piped in (False, True):
        monkeypatch.setenv("RMQDUMP_FAST", "1")
        monkeypatch.setattr(pipeline, "wanted", lambda segments, use_mmap, p=piped: p)
        V.verify_store(FIXTURES / "store", progress=lambda d, t, p=piped: calls[p].append((d, t)))
    assert calls[True] == calls[False] and calls[True][-1] == (4 * 4096, 4 * 4096)


def test_pipeline_worker_bug_surfaces(monkeypatch):
    real_verify = V.verify_segment

    def verify(seg, **kw):
        if seg.start == 4096:
            raise ZeroDivisionError("bug in segment 1")
        return real_verify(seg, **kw)

    monkeypatch.setattr(V, "verify_segment", verify)
    for piped in (False, True):
        monkeypatch.setenv("RMQDUMP_FAST", "1")
        monkeypatch.setattr(pipeline, "wanted", lambda segments, use_mmap, p=piped: p)
        with pytest.raises(ZeroDivisionError, match="bug in segment 1"):
            V.verify_store(FIXTURES / "store")
        assert not [t for t in threading.enumerate() if t.name == "rmqdump-verify-walk"]


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
    monkeypatch.setattr(pipeline, "POPULATE_AHEAD", 10)
    calls = []

    class Walk:
        def populate(self, start, upto):
            calls.append((start, upto))
            return min(upto, start + 4)

    sink = pipeline._Sink(None, threading.Event())
    ahead = pipeline._Ahead(sink)
    assert not ahead.step()  # no walk yet
    w = Walk()
    sink.front = (w, 100)
    while ahead.step():
        pass
    assert calls == [(100, 110), (104, 110), (108, 110)]
    calls.clear()
    sink.front = (w, 106)  # the walk moved on: from where it is or what is mapped, up to 10 past it
    while ahead.step():
        pass
    assert calls == [(110, 116), (114, 116)]
    calls.clear()
    sink.front = (Walk(), 0)  # the next segment's walk: from its start
    ahead.step()
    assert calls == [(0, 10)]
