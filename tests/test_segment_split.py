"""A segment walked as K ranges and joined with proof (rmqdump.fast.segment_split) against the serial
walk (summarize_segment): the same SegmentSummary, field for field, on the fixtures, the real stores and
synthesised segments whose split points land inside records (fake headers in bodies), in zeros, in a
torn tail and behind an end-of-file BLANK. Each hostile case also asserts that the join without its
proof (``prove=False``) gets it wrong, so the case really exercises the proof."""

from __future__ import annotations

import random
import struct

import pytest

from conftest import FIXTURES, REAL
from rmqdump.codec.encoder import encode_blank, encode_fields, properties_bytes
from rmqdump.fast import segment_split as ss
from rmqdump.fast import walk as fastwalk
from rmqdump.fast.segment_jobs import summarize_segment, summarize_split, verify_segments
from rmqdump.store.commitlog import CommitLog

pytestmark = pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")

KS = [2, 3, 7]
REAL_STORES = ["clean", "corrupt_crc", "crash_kill9", "crash_torn", "crash_torn_props"]
SEG = "00000000000000000000"


def _fake(pos: int = 0) -> bytes:
    """A complete, valid-looking record (to hide in a body) followed by 8 zero bytes."""
    return encode_fields(topic=b"Fake", body=b"fake-body", properties=b"", physical_offset=pos,
                         store_timestamp=5) + bytes(8)


def _rec(i: int, pos: int, body: bytes, **kw) -> bytes:
    kw.setdefault("physical_offset", pos)
    kw.setdefault("store_timestamp", 1_700_000_000_000 + (i * 7919) % 1000)
    return encode_fields(topic=b"TopicTest", body=body, properties=properties_bytes({"KEYS": f"k{i}"}),
                         queue_offset=i, born_timestamp=1_700_000_000_000, **kw)


def image(size: int, *, fill: float = 1.0, fake: bool = False, seed: int = 1,
          mismatch_every: int = 0) -> tuple[bytearray, list[int]]:
    """Records of varying size filling ``fill`` of a ``size``-byte image, then zeros. ``fake``: every body
    ends with a hidden valid-looking record, so a header scan from inside a body finds it first."""
    rnd = random.Random(seed)
    data = bytearray(size)
    pos, starts, i = 0, [], 0
    while True:
        body = bytes(rnd.randrange(256) for _ in range(rnd.randrange(50, 900)))
        if fake:
            body += _fake()
        kw = {"physical_offset": pos + 1} if mismatch_every and i % mismatch_every == 3 else {}
        r = _rec(i, pos, body, **kw)
        if pos + len(r) > size * fill:
            break
        data[pos:pos + len(r)] = r
        starts.append(pos)
        pos += len(r)
        i += 1
    return data, starts


def segment(tmp_path, data: bytes, name: str = SEG):
    d = tmp_path / "commitlog"
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(bytes(data))
    return CommitLog.open(d).segments[0]


def split(seg, k: int, *, prove: bool = True, **kw):
    return summarize_split(seg, k=k, min_bytes=1, prove=prove, **kw)


def assert_joins(seg, k: int, **kw) -> None:
    want = summarize_segment(seg, kw.get("start_pos", 0), kw.get("check_crc", True), kw.get("end_offset"))
    assert split(seg, k, **kw) == want


def plan(seg, k: int, **kw) -> list:
    return ss.split_plan(seg, kw.get("start_pos", 0), k, end_offset=kw.get("end_offset"), min_bytes=1)


# --- real bytes: fixtures and RocketMQ-written stores --------------------------------------------------
@pytest.mark.parametrize("k", KS)
def test_fixture_and_real_segments(k):
    stores = [FIXTURES / "store"] + [REAL / n for n in REAL_STORES if (REAL / n).is_dir()]
    seen = 0
    for store in stores:
        for seg in CommitLog.open(store / "commitlog").segments:
            for crc in (True, False):
                assert_joins(seg, k, check_crc=crc)
            seen += 1
    assert seen >= 4


@pytest.mark.parametrize("k", KS)
def test_verify_segments_split_equals_serial(k):
    """verify_segments with more jobs than segments splits them; the summaries stay the serial ones."""
    for store in [FIXTURES / "store"] + [REAL / n for n in REAL_STORES if (REAL / n).is_dir()]:
        segs = CommitLog.open(store / "commitlog").segments[:1]
        want = verify_segments(segs, jobs=1)
        assert verify_segments(segs, jobs=k, split_min_bytes=1, store_root=store) == want
        assert verify_segments(segs, jobs=k, split_min_bytes=1) == want
    segs = CommitLog.open(FIXTURES / "store" / "commitlog").segments  # 4 segments, jobs up to 7
    for start, end in [(None, None), (1500, None), (None, 9000), (5000, 13000)]:
        want = verify_segments(segs, jobs=1, start=start, end=end)
        assert verify_segments(segs, jobs=k * 3, start=start, end=end, split_min_bytes=1) == want


@pytest.mark.parametrize("store", [FIXTURES / "store", REAL / "clean"], ids=["fixture", "real-clean"])
def test_consumequeue_hints_are_record_starts(store):
    if not store.is_dir():
        pytest.skip("real store missing")
    cl = CommitLog.open(store / "commitlog")
    starts = {r.offset for r in cl.walk() if hasattr(r, "topic")}
    seg = cl.segments[0]
    hints = ss.cq_hints(store, seg.start, seg.end, [seg.start + seg.size * i // 4 for i in (1, 2, 3)])
    found = [h for h in hints if h >= 0]
    assert found and set(found) <= starts


# --- synthesised segments ------------------------------------------------------------------------------
@pytest.mark.parametrize("k", KS)
def test_clean(tmp_path, k):
    data, starts = image(96 * 1024, fill=0.7, mismatch_every=5)
    seg = segment(tmp_path, data)
    assert len(plan(seg, k)) == k and {s for s, _ in plan(seg, k)} <= set(starts)  # true boundaries
    assert_joins(seg, k)
    assert_joins(seg, k, check_crc=False)
    assert_joins(seg, k, start_pos=starts[5])
    assert_joins(seg, k, end_offset=starts[len(starts) // 2])
    assert_joins(seg, k, end_offset=starts[len(starts) // 2] + 3)
    full, fstarts = image(64 * 1024, fill=1.0, seed=3)
    last = fstarts[-1] + struct.unpack_from(">i", full, fstarts[-1])[0]
    assert_joins(segment(tmp_path / "f", full[:last]), k)  # the last record ends the file exactly


@pytest.mark.parametrize("k", KS)
def test_split_inside_body_with_fake_header(tmp_path, k):
    for seed in range(30):  # images until the header scan lands on a hidden header (most do)
        data, starts = image(128 * 1024, fake=True, fill=0.95, seed=seed)
        seg = segment(tmp_path / str(seed), data)
        if {s for s, _ in plan(seg, k)[1:]} - set(starts):
            break
    else:
        pytest.fail("the scan was never fooled by a hidden header")
    assert_joins(seg, k)
    assert_joins(seg, k, check_crc=False)
    assert split(seg, k, prove=False) != summarize_segment(seg)


@pytest.mark.parametrize("k", KS)
def test_wrong_consumequeue_hints(tmp_path, k):
    """Hints (as a damaged ConsumeQueue would give) pointing at hidden headers: the proof catches them."""
    data, starts = image(128 * 1024, fake=True, fill=0.95)
    seg = segment(tmp_path, data)
    fakes = [data.find(_fake()[:8], s + 8) for s in starts]
    ranges = ss.plan_ranges(memoryview(bytes(data)), 0, 0, k, hints=fakes)
    assert len(ranges) == k and not {s for s, _ in ranges[1:]} & set(starts)
    res = [summarize_segment(seg, s, True, e) for s, e in ranges]
    rewalk = lambda p, e: summarize_segment(seg, p, True, e)  # noqa: E731
    assert ss.join_ranges(ranges, res, rewalk) == summarize_segment(seg)
    assert ss.join_ranges(ranges, res, rewalk, prove=False) != summarize_segment(seg)


@pytest.mark.parametrize("k", KS)
@pytest.mark.parametrize("mid_record", [False, True])
def test_zeroed_range(tmp_path, k, mid_record):
    data, starts = image(128 * 1024, fill=0.95)
    a = starts[len(starts) // 5] + (37 if mid_record else 0)
    b = starts[len(starts) // 3] + 11
    data[a:b] = bytes(b - a)  # the serial walk stops in here; records after it must not count
    seg = segment(tmp_path, data)
    want = summarize_segment(seg)
    assert want.stop != "end" and want.stop_pos < b
    assert_joins(seg, k)
    assert split(seg, k, prove=False) != want


@pytest.mark.parametrize("k", KS)
def test_torn_tail(tmp_path, k):
    """The last record is cut by the end of the file; its body (most of the file) hides headers."""
    data, starts = image(32 * 1024, fill=1.0)
    pos = starts[-1]
    body = (bytes(300) + _fake()) * 200
    big = _rec(len(starts), pos, body)
    data = data[:pos] + big[:len(big) - 500]
    seg = segment(tmp_path, data)
    want = summarize_segment(seg)
    assert want.stop == "truncated" and want.stop_pos == pos
    assert_joins(seg, k)
    assert split(seg, k, prove=False) != want


@pytest.mark.parametrize("k", KS)
def test_blank_end_of_file(tmp_path, k):
    """A BLANK ends the file's data; stale records behind it (inside the blank) must not count."""
    data, starts = image(128 * 1024, fill=0.3)
    stale, _ = image(128 * 1024, fill=1.0, seed=9)
    p = starts[-1] + struct.unpack_from(">i", data, starts[-1])[0]
    data[p + 8:] = stale[p + 8:]
    data[p:p + 8] = encode_blank(len(data) - p)
    seg = segment(tmp_path, data)
    want = summarize_segment(seg)
    assert want.stop == "blank" and want.end_pos == len(data)
    assert_joins(seg, k)
    assert split(seg, k, prove=False) != want


def test_small_segment_not_split(tmp_path):
    data, _ = image(64 * 1024, fill=0.5)
    seg = segment(tmp_path, data)
    assert len(ss.split_plan(seg, 0, 4, min_bytes=len(data) + 1)) == 1
    assert len(ss.split_plan(seg, 0, 4, min_bytes=1)) == 4
    assert ss.SPLIT_MIN_BYTES >= 64 << 20


def test_record_spanning_several_split_points(tmp_path):
    """One long record holds three split points (hidden headers): the walk that starts before it passes all
    three, and the join re-walks on from where that record really ends."""
    data, starts = image(32 * 1024, fill=0.3)
    pos = starts[-1] + struct.unpack_from(">i", data, starts[-1])[0]
    big = _rec(len(starts), pos, (bytes(200) + _fake()) * 40)
    tail, _ = image(16 * 1024, fill=1.0, seed=5)
    data = data[:pos] + big + tail  # the tail's records are valid (their PHYSICALOFFSET fields mismatch)
    seg = segment(tmp_path, data)
    hidden = [data.find(_fake()[:8], pos + 8 + n * 4000) for n in (1, 2, 3)]
    assert len(set(hidden)) == 3 and all(pos < h < pos + len(big) for h in hidden)
    ranges = list(zip([0, *hidden], [*hidden, None], strict=True))
    res = [summarize_segment(seg, s, True, e) for s, e in ranges]
    rewalk = lambda p, e: summarize_segment(seg, p, True, e)  # noqa: E731
    want = summarize_segment(seg)
    assert want.records > len(starts) + 1  # the walk got past the long record
    assert ss.join_ranges(ranges, res, rewalk) == want
    assert ss.join_ranges(ranges, res, rewalk, prove=False) != want
