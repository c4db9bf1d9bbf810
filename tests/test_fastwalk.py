"""The compiled fast path (rmqdump.fast.walk) against the pure path, record for record.

Every comparison runs the real pure walker (CommitLog.walk over a file on disk) and the fast
walker over the same bytes, and requires the same records (every Message slot), the same
Blank records and the same stop verdict (offset, file position, kind, detail, size).
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import sys
import zlib

import pytest

from conftest import FIXTURES, REAL
from rmqdump.codec.encoder import encode_blank, encode_fields, properties_bytes
from rmqdump.codec.layout import (
    BORNHOST_V6_FLAG,
    MESSAGE_MAGIC_CODE_V2,
    STOREHOSTADDRESS_V6_FLAG,
)
from rmqdump.codec.record import Blank, Message
from rmqdump.fast import abi
from rmqdump.fast import walk as fastwalk
from rmqdump.store.commitlog import CommitLog

pytestmark = pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")

SEG = "00000000000000000000"
REAL_STORES = ["clean", "corrupt_crc", "crash_kill9", "crash_torn", "crash_torn_props"]
MSG_SLOTS = [s for s in Message.__slots__ if not s.startswith("_")]


def _sig(rec) -> tuple:
    if isinstance(rec, Message):
        return ("M", *(getattr(rec, s) for s in MSG_SLOTS))
    assert isinstance(rec, Blank), rec
    return ("B", rec.offset, rec.file, rec.file_pos, rec.size, rec.bytes_to_end)


def _stop(inv) -> tuple:
    return (inv.offset, inv.file, inv.file_pos, inv.kind, inv.detail, inv.size)


def assert_same_walk(cl: CommitLog, **kw) -> tuple[list, object]:
    """Walk ``cl`` both ways with the same arguments; return (records, stop)."""
    pure = cl.walk(**kw)
    want = [_sig(r) for r in pure]
    fast = fastwalk.FastWalk(cl, strict=True, batch_records=kw.pop("batch_records", 5),
                             **{k: v for k, v in kw.items() if k != "use_mmap"})
    got = [_sig(r) for r in fast]
    assert got == want
    assert _stop(fast.stop) == _stop(pure.stop)
    assert (fast.end_offset, fast.records) == (pure.end_offset, pure.records)
    return want, pure.stop


def segment_file(tmp_path, data: bytes, name: str = SEG):
    d = tmp_path / "commitlog"
    d.mkdir(exist_ok=True)
    p = d / name
    p.write_bytes(bytes(data))
    return p


def assert_same_buffer(tmp_path, data: bytes, **kw):
    """Pure walk of ``data`` as a one-segment file vs. the fast walk of the same file."""
    return assert_same_walk(CommitLog.open(segment_file(tmp_path, data)), **kw)


# --- real stores and the fixture store ---------------------------------------------------------
@pytest.mark.parametrize("name", REAL_STORES)
@pytest.mark.parametrize("check_crc", [True, False])
def test_real_stores_identical(name, check_crc):
    path = REAL / name
    if not path.is_dir():
        pytest.skip("real stores are not beside the checkout")
    recs, stop = assert_same_walk(CommitLog.open(path), check_crc=check_crc, read_body=True)
    assert len(recs) > 50
    if name == "corrupt_crc" and check_crc:
        assert (stop.offset, stop.kind) == (15458, "body_crc")
    if name == "crash_torn":
        assert (stop.offset, stop.kind) == (396985, "length_mismatch")


@pytest.mark.parametrize("name", REAL_STORES)
def test_real_stores_from_every_offset_window(name):
    path = REAL / name
    if not path.is_dir():
        pytest.skip("real stores are not beside the checkout")
    cl = CommitLog.open(path)
    offsets = [r.offset for r in cl.walk(check_crc=False)]
    rnd = random.Random(7)
    for start in [0, 1, offsets[-1], *rnd.sample(offsets, 8)]:
        for end in (None, start, start + 1, start + 5000, offsets[len(offsets) // 2]):
            assert_same_walk(cl, start=start, end=end, read_body=False)


def test_fixture_store_identical():
    recs, stop = assert_same_walk(CommitLog.open(FIXTURES / "store"), read_body=True)
    recs5, _ = assert_same_walk(CommitLog.open(FIXTURES / "store-5x"), read_body=True)
    assert {r[0] for r in recs} == {"M", "B"}
    msgs = [r for r in recs + recs5 if r[0] == "M"]
    # the fixtures have V2, IPv6 hosts and SCHEDULE_TOPIC_XXXX records (the kernel defers those)
    assert {m[1 + MSG_SLOTS.index("magic")] for m in msgs} >= {0xDAA320A7, 0xDAA320AB}
    assert any(m[1 + MSG_SLOTS.index("sys_flag")] & BORNHOST_V6_FLAG for m in msgs)
    assert any(m[1 + MSG_SLOTS.index("sys_flag")] & STOREHOSTADDRESS_V6_FLAG for m in msgs)
    assert any(m[1 + MSG_SLOTS.index("topic_raw")] == b"SCHEDULE_TOPIC_XXXX" for m in msgs)


@pytest.mark.parametrize("name", ["corrupt_crc", "clean"])
def test_table_crc_walk_identical(monkeypatch, name):
    fastwalk.backend()
    monkeypatch.setenv("RMQDUMP_CRC", "table")  # crc_mode() -> the slice-by-8 table
    assert fastwalk.crc_mode() == abi.CRC_TABLE
    path = REAL / name
    if not path.is_dir():
        pytest.skip("real stores are not beside the checkout")
    assert_same_walk(CommitLog.open(path))
    assert_same_walk(CommitLog.open(FIXTURES / "store"))


FIXTURE_COMMITLOGS = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.rglob("commitlog") if p.is_dir())
FUZZ_INPUTS = sorted(str(p.relative_to(FIXTURES)) for p in FIXTURES.glob("bugs/fuzz*/*") if p.is_file())


@pytest.mark.parametrize("rel", FIXTURE_COMMITLOGS)
def test_every_fixture_commitlog_identical(rel):
    for check_crc in (True, False):
        assert_same_walk(CommitLog.open(FIXTURES / rel), check_crc=check_crc, read_body=True)


@pytest.mark.parametrize("rel", FUZZ_INPUTS)
def test_fuzz_inputs_identical(tmp_path, rel):
    assert_same_buffer(tmp_path, (FIXTURES / rel).read_bytes())


def test_fixture_batches_and_columns():
    cl = CommitLog.open(FIXTURES / "store")
    pure = [r for r in cl.walk() if isinstance(r, Message)]
    rows = []
    for item in fastwalk.FastWalk(cl, batch_records=3).batches():
        if isinstance(item, fastwalk.RecordBatch):
            for i in range(len(item)):
                rows.append((int(item.offsets[i]), int(item["queue_offset"][i]), item.topic_raw(i),
                             item.properties_raw(i), item.body(i), int(item["crc_ok"][i])))
    assert rows == [(m.offset, m.queue_offset, m.topic_raw, m.properties_raw, m.body, 1 if m.crc_ok else 0)
                    for m in pure]
    gathered = {"topic": [], "properties": [], "body": []}
    for item in fastwalk.FastWalk(cl, batch_records=5).batches():
        if isinstance(item, fastwalk.RecordBatch):
            for field, out in gathered.items():
                offsets, values = item.gather(field)
                assert len(offsets) == len(item) + 1 and offsets[0] == 0
                out += [values[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(item))]
    assert gathered == {"topic": [m.topic_raw for m in pure], "properties": [m.properties_raw for m in pure],
                        "body": [m.body for m in pure]}


# --- the compiled CRC -----------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["clmul", "table"])
def test_crc_matches_zlib(mode):
    b = fastwalk.backend()
    m = abi.CRC_CLMUL if mode == "clmul" else abi.CRC_TABLE
    if m == abi.CRC_CLMUL and not b.clmul:
        pytest.skip("no PCLMULQDQ on this host")
    rnd = random.Random(1)
    data = bytes(rnd.getrandbits(8) for _ in range(70000))
    mv = memoryview(data)
    for n in [*range(0, 300), 1000, 1023, 4096, 65537, 69000]:
        for s in (0, 1, 7, 13):
            assert fastwalk.crc32(mv[s:s + n], m) == zlib.crc32(mv[s:s + n]), (n, s)
    assert fastwalk.crc32(b"123456789") == 0xCBF43926


# --- hostile inputs -----------------------------------------------------------------------------------
def _rec(i: int, pos: int, *, body=b"body-%d", topic=b"TopicTest", props=None, **kw) -> bytes:
    body = body % i if b"%d" in body else body
    props = properties_bytes({"KEYS": f"k{i}", "TAGS": "t"}) if props is None else props
    return encode_fields(topic=topic, body=body, properties=props, queue_offset=i, physical_offset=pos,
                         store_timestamp=1_700_000_000_000 + i, born_timestamp=1_700_000_000_000, **kw)


def records_image(n: int = 6, size: int = 4096, **kw) -> tuple[bytearray, list[int]]:
    """A segment image of ``n`` records, then zeros; returns (image, record positions)."""
    data = bytearray(size)
    pos, starts = 0, []
    for i in range(n):
        r = _rec(i, pos, **kw)
        data[pos:pos + len(r)] = r
        starts.append(pos)
        pos += len(r)
    return data, starts


def _field_positions(data: bytes, p: int) -> dict[str, tuple[int, str]]:
    sysflag = struct.unpack_from(">i", data, p + 36)[0]
    bh = 20 if sysflag & BORNHOST_V6_FLAG else 8
    sh = 20 if sysflag & STOREHOSTADDRESS_V6_FLAG else 8
    magic = struct.unpack_from(">I", data, p + 4)[0]
    body_len = struct.unpack_from(">i", data, p + 68 + bh + sh)[0]
    q = p + 72 + bh + sh + body_len
    tl = 2 if magic == MESSAGE_MAGIC_CODE_V2 else 1
    topic_len = int.from_bytes(data[q:q + tl], "big", signed=True)
    return {
        "totalsize": (p, ">i"), "bodylen": (p + 68 + bh + sh, ">i"),
        "topiclen": (q, ">b" if tl == 1 else ">h"), "propslen": (q + tl + topic_len, ">h"),
    }


@pytest.mark.parametrize("field", ["totalsize", "bodylen", "topiclen", "propslen"])
@pytest.mark.parametrize("value", [0, -1, 7, 2**31 - 1, 127, -128, 32767, 90, 91])
@pytest.mark.parametrize("which", [0, 2])
def test_hostile_length_fields(tmp_path, field, value, which):
    data, starts = records_image()
    pos, fmt = _field_positions(data, starts[which])[field]
    if fmt == ">b":
        value = max(-128, min(127, value))
    elif fmt == ">h":
        value = max(-32768, min(32767, value))
    struct.pack_into(fmt, data, pos, value)
    for check_crc in (True, False):
        assert_same_buffer(tmp_path, data, check_crc=check_crc)


@pytest.mark.parametrize("variant", ["v2", "v6", "v6born", "v6store", "empty", "neg_bodylen"])
def test_record_variants(tmp_path, variant):
    kw: dict = {}
    if variant == "v2":
        kw = {"magic": MESSAGE_MAGIC_CODE_V2, "topic": b"%RETRY%" + b"g" * 200}
    elif variant.startswith("v6"):
        flags = {"v6": BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG, "v6born": BORNHOST_V6_FLAG,
                 "v6store": STOREHOSTADDRESS_V6_FLAG}[variant]
        kw = {"sys_flag": flags}
        if flags & BORNHOST_V6_FLAG:
            kw["born_addr"] = bytes(range(1, 17))
        if flags & STOREHOSTADDRESS_V6_FLAG:
            kw["store_addr"] = bytes(range(16, 32))
    elif variant == "empty":
        kw = {"body": b"", "props": b"", "topic": b""}
    data, starts = records_image(**kw)
    if variant == "neg_bodylen":  # BODYLEN -5 with no body bytes: tolerated when TOTALSIZE agrees
        r = encode_fields(topic=b"T", body=b"", properties=b"", body_length=-5, physical_offset=starts[-1])
        data[starts[-1]:starts[-1] + len(r)] = r
        data[starts[-1] + len(r):] = bytes(len(data) - starts[-1] - len(r))
    recs, _ = assert_same_buffer(tmp_path, data)
    assert recs and all(r[0] == "M" for r in recs)


def test_truncations_and_tails(tmp_path):
    data, starts = records_image(n=4, size=4096)
    end = starts[-1] + struct.unpack_from(">i", data, starts[-1])[0]
    for cut in range(end - 40, end + 12):  # the file ends inside / just after the last record
        assert_same_buffer(tmp_path, data[:cut])
    for cut in [1, 3, 4, 7, 8, 9, 91, 100]:
        assert_same_buffer(tmp_path, data[:cut])
    for tail in [b"\x00" * 5, b"\x00\x01", b"\x07" * 7, b"\x00" * 7 + b"\x01"]:  # < 8 bytes after the records
        assert_same_buffer(tmp_path, bytes(data[:end]) + tail)


def test_blank_rules(tmp_path):
    data, starts = records_image(n=3, size=2048)
    end = starts[-1] + struct.unpack_from(">i", data, starts[-1])[0]
    for value in (2048 - end, 2048 - end + 1, 2048 - end - 1, 8, 0, -1):
        d = bytearray(data)
        d[end:end + 8] = struct.pack(">iI", value, 0xCBD43194)
        recs, stop = assert_same_buffer(tmp_path, d)
    d = bytearray(data)
    d[end:end + 8] = encode_blank(2048 - end)
    recs, stop = assert_same_buffer(tmp_path, d)
    assert recs[-1][0] == "B"


def test_crc_damage_and_bad_fields(tmp_path):
    data, starts = records_image()
    d = bytearray(data)
    d[starts[2] + 90] ^= 0x40  # a body byte
    for check_crc in (True, False):
        assert_same_buffer(tmp_path, d, check_crc=check_crc)
    d = bytearray(data)
    struct.pack_into(">i", d, starts[1] + 8, -5)  # a negative stored CRC
    assert_same_buffer(tmp_path, d)
    d = bytearray(data)
    struct.pack_into(">I", d, starts[3] + 4, 0xDAA320A8)  # bad magic
    assert_same_buffer(tmp_path, d)
    # a V1 topic of 200 bytes: its length byte reads negative (RocketMQ's signed-byte bug)
    r = _rec(9, starts[1], topic=b"x" * 200)
    d = bytearray(data)
    d[starts[1]:starts[1] + len(r)] = r
    assert_same_buffer(tmp_path, d)
    # a record over max_record_size
    assert_same_buffer(tmp_path, data, max_record_size=150)


@pytest.mark.parametrize("delay", ["3", "x", "", "99999999999", "-2", "+4"])
def test_schedule_topic_delay_is_judged_like_the_pure_path(tmp_path, delay):
    data, starts = records_image(n=2)
    p = starts[-1] + struct.unpack_from(">i", data, starts[-1])[0]
    r = _rec(5, p, topic=b"SCHEDULE_TOPIC_XXXX", props=properties_bytes({"DELAY": delay, "REAL_TOPIC": "T"}))
    data[p:p + len(r)] = r
    r2 = _rec(6, p + len(r))
    data[p + len(r):p + len(r) + len(r2)] = r2
    recs, stop = assert_same_buffer(tmp_path, data)
    # an empty value is dropped by the properties parser (as RocketMQ's), so DELAY is absent
    assert len(recs) == (4 if delay in ("3", "-2", "+4", "") else 2)


def test_physical_offset_mismatch_is_counted_not_fatal(tmp_path):
    data, starts = records_image()
    struct.pack_into(">q", data, starts[2] + 28, 12345)
    struct.pack_into(">q", data, starts[4] + 28, 999)
    recs, _ = assert_same_buffer(tmp_path, data)
    assert len(recs) == 6
    with fastwalk.walk_buffer_fast(bytes(data), batch_records=2) as w:
        assert sum(len(b) for b in w) == 6
    assert (w.phys_mismatches, w.first_phys_mismatch) == (2, starts[2])


def test_random_bytes_and_random_damage(tmp_path):
    rnd = random.Random(42)
    for _ in range(40):
        assert_same_buffer(tmp_path, bytes(rnd.getrandbits(8) for _ in range(rnd.randrange(1, 600))))
    data, starts = records_image(n=10, size=4096)
    for _ in range(150):
        d = bytearray(data)
        for _ in range(rnd.randrange(1, 4)):
            d[rnd.randrange(0, starts[-1] + 100)] = rnd.getrandbits(8)
        assert_same_buffer(tmp_path, d, check_crc=rnd.random() < 0.7)
    # a plausible header over random bytes, at every record position
    for s in starts:
        d = bytearray(data)
        d[s + 8:s + 300] = bytes(rnd.getrandbits(8) for _ in range(292))
        assert_same_buffer(tmp_path, d)


def test_multi_segment_walk_with_limits(tmp_path):
    d = tmp_path / "commitlog"
    d.mkdir()
    # segment 0: records then a BLANK; segment 1: records ending exactly at its end; segment 2: zeros
    seg0, i = bytearray(1024), 0
    pos = 0
    while pos + len(_rec(i, pos)) + 8 <= 1024:
        r = _rec(i, pos)
        seg0[pos:pos + len(r)] = r
        pos += len(r)
        i += 1
    seg0[pos:pos + 8] = encode_blank(1024 - pos)
    seg1 = bytearray()
    base = len(_rec(i, 0, body=b""))
    while 1024 - len(seg1) - len(_rec(i, 0, body=b"x" * 40)) >= base + 5:
        seg1 += _rec(i, 1024 + len(seg1), body=b"x" * 40)
        i += 1
    base = len(_rec(i, 0, body=b""))
    seg1 += _rec(i, 1024 + len(seg1), body=b"y" * (1024 - len(seg1) - base))
    assert len(seg1) == 1024
    for n, blob in enumerate([seg0, seg1, bytes(1024)]):
        (d / f"{n * 1024:020d}").write_bytes(bytes(blob))
    cl = CommitLog.open(d)
    recs, stop = assert_same_walk(cl)
    assert recs[-1][0] == "M" and stop.offset == 2048 and stop.kind == "end_of_data"
    for start in (None, 0, 300, 1024, 1500, 2048, 3000):
        for stop_at in (None, 100, 1024, 1100, 2048, 2500):
            assert_same_walk(cl, start=start, end=stop_at)


# --- summaries, parallel helpers, laziness ----------------------------------------------------------------
def test_verify_segments_matches_the_pure_walk():
    path = REAL / "crash_kill9"
    if not path.is_dir():
        pytest.skip("real stores are not beside the checkout")
    cl = CommitLog.open(path)
    pure = cl.walk()
    n = sum(1 for r in pure if isinstance(r, Message))
    for jobs in (1, 2):
        sums = fastwalk.verify_segments(cl.segments, jobs=jobs)
        assert [s.file for s in sums] == [s.name for s in cl.segments]
        first_bad = next(s for s in sums if s.stop not in ("end", "blank", "limit"))
        assert (first_bad.stop_offset, first_bad.stop) == (pure.stop.offset, pure.stop.kind)
        upto = sums[:sums.index(first_bad) + 1]
        assert sum(s.records for s in upto) == n
        assert all(s.phys_mismatches == 0 for s in upto)


def test_parallel_segment_map_in_processes():
    cl = CommitLog.open(FIXTURES / "store")
    inline = fastwalk.parallel_segment_map(fastwalk.summarize_segment, cl.segments, 1)
    procs = fastwalk.parallel_segment_map(fastwalk.summarize_segment, cl.segments, 2)
    threads = fastwalk.parallel_segment_map(fastwalk.summarize_segment, cl.segments, 2, threads=True)
    assert inline == procs == threads
    assert [s.stop for s in inline][:3] == ["blank", "blank", "blank"]


def test_importing_rmqdump_does_not_import_numba():
    code = ("import sys, rmqdump, rmqdump.fast.walk, rmqdump.store.commitlog, rmqdump.cli, rmqdump.cli.scan\n"
            "assert 'numba' not in sys.modules and 'numpy' not in sys.modules, 'eager import'\n"
            "assert rmqdump.fast.walk.fast_available()\n"
            "assert not rmqdump.fast.walk.use_fast(1 << 20) and rmqdump.fast.walk.use_fast(1 << 30)\n")
    env = {k: v for k, v in os.environ.items() if k != "RMQDUMP_FAST"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr


_COMPARE_FIXTURE = """
import sys
from rmqdump.fast import walk as fastwalk
from rmqdump.store.commitlog import CommitLog
from rmqdump.codec.record import Message
cl = CommitLog.open(sys.argv[1])
slots = [s for s in Message.__slots__ if not s.startswith("_")]
sig = lambda r: tuple(getattr(r, s, None) for s in slots) if isinstance(r, Message) else repr(r)
pure, fast = cl.walk(), fastwalk.FastWalk(cl, strict=True, batch_records=4)
assert [sig(r) for r in pure] == [sig(r) for r in fast]
assert (pure.stop.offset, pure.stop.kind) == (fast.stop.offset, fast.stop.kind)
print(fastwalk.backend().kind.split(" (")[0], "numba" in sys.modules)
"""


def test_shared_library_backend_runs_without_numba():
    fastwalk.backend()  # builds the library once if needed
    env = {k: v for k, v in os.environ.items() if k not in ("RMQDUMP_FAST", "RMQDUMP_FAST_LIBRARY")}
    res = subprocess.run([sys.executable, "-c", _COMPARE_FIXTURE, str(FIXTURES / "store")], capture_output=True,
                         text=True, env=env)
    assert res.returncode == 0, res.stderr
    if not fastwalk.backend().kind.startswith("shared library"):
        pytest.skip(f"no shared library here: {fastwalk.backend().kind}")
    assert res.stdout.startswith("shared library") and res.stdout.split()[-1] == "False", res.stdout


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_library_builds_from_scratch(tmp_path):
    """A fresh cache directory: the library is built in a child process, then used without numba."""
    env = {**os.environ, "RMQDUMP_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("RMQDUMP_FAST_LIBRARY", None)
    res = subprocess.run([sys.executable, "-c", _COMPARE_FIXTURE, str(FIXTURES / "store")], capture_output=True,
                         text=True, env=env, timeout=1800)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("shared library") and res.stdout.split()[-1] == "False", res.stdout
    assert sorted(p.name.rsplit(".", 1)[-1] for p in (tmp_path / "cache").iterdir()) == ["lock", "so"]


def test_numba_jit_backend_is_identical():
    env = {**os.environ, "RMQDUMP_FAST_LIBRARY": "0"}
    res = subprocess.run([sys.executable, "-c", _COMPARE_FIXTURE, str(FIXTURES / "store")], capture_output=True,
                         text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("numba JIT") and res.stdout.split()[-1] == "True", res.stdout


def test_use_fast_environment_override(monkeypatch):
    monkeypatch.setenv("RMQDUMP_FAST", "0")
    assert not fastwalk.fast_available() and not fastwalk.use_fast(1 << 40)
    monkeypatch.setenv("RMQDUMP_FAST", "1")
    assert fastwalk.use_fast(10)
    monkeypatch.delenv("RMQDUMP_FAST")
    assert fastwalk.use_fast(fastwalk.FAST_THRESHOLD) and not fastwalk.use_fast(fastwalk.FAST_THRESHOLD - 1)


def test_default_jobs_keeps_to_a_spark_tasks_share(monkeypatch):
    """Spark sets OMP_NUM_THREADS to a task's CPUs: rmqdump's threads (export read-ahead, verify)
    must not use more, or two tasks on two cores run four busy threads."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cpus = fastwalk.default_jobs()
    assert cpus == len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert fastwalk.default_jobs() == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "64")
    assert fastwalk.default_jobs() == cpus
    monkeypatch.setenv("OMP_NUM_THREADS", "junk")
    assert fastwalk.default_jobs() == cpus
