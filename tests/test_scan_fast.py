"""The compiled renderers (rmqdump.fast.render) against the pure path, byte for byte.

``rmqdump scan -f jsonl`` must print the same bytes (and the same stderr summary and exit
code) with ``RMQDUMP_FAST=1`` as with ``RMQDUMP_FAST=0`` in every body mode, and the Arrow
batches of the export must be equal, over every fixture store, the real broker stores and a
synthetic store of awkward records (non-ASCII and control characters, repeated property
names, IPv6 hosts, the delay topic, compressed bodies, invalid UTF-8, negative numbers).
"""

from __future__ import annotations

import random
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from conftest import FIXTURES, REAL
from rmqdump.cli import cli
from rmqdump.codec.encoder import encode_blank, encode_fields
from rmqdump.codec.layout import BORNHOST_V6_FLAG, MESSAGE_MAGIC_CODE_V2, STOREHOSTADDRESS_V6_FLAG
from rmqdump.errors import RmqdumpError
from rmqdump.fast import render as fastrender
from rmqdump.fast import walk as fastwalk
from rmqdump.rows.arrow import read_split, record_batches

pytestmark = pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")

REAL_STORES = ["clean", "corrupt_crc", "crash_kill9", "crash_torn", "crash_torn_props"]
MODES = ["base64", "none", "hex", "text", "text:utf-8"]
SEG_SIZE = 1 << 16


def _stores() -> list:
    out = [FIXTURES / "store", FIXTURES / "store-5x"]
    out += sorted(p for p in (FIXTURES / "bugs").glob("*/store") if (p / "commitlog").is_dir())
    out += [REAL / n for n in REAL_STORES if (REAL / n).is_dir()]
    return out


STORES = _stores()


@pytest.fixture(scope="module", autouse=True)
def _kernels():
    """Build/load the kernels first (a first build announces itself on stderr, which is compared)."""
    fastwalk.backend()
    fastrender.backend()


def _props(pairs) -> bytes:
    return b"\x02".join(k + b"\x01" + v for k, v in pairs)


def _awkward_records(rng: random.Random) -> list[dict]:
    """Record field sets exercising every rendering rule."""
    texts = [b"plain", "üñï €".encode(), "𝄞 clef".encode(), b'quo"te\\back', b"ctl\x00\x01\x07\x08\t\n\x0c\r\x1f\x7f",
             b"bad\xff\xfeutf8", b"\xed\xa0\x80surrogate", b"\xc0\xafoverlong", b"trunc\xe2\x82", b"",
             "\u2028sep\u202e".encode()]
    recs = []
    for i in range(120):
        topic = rng.choice([b"T", b"TopicA", "Tópico".encode(), b"SCHEDULE_TOPIC_XXXX", b"odd\xfftopic",
                            b'q"t', b"x" * 127])
        pairs = []
        for _ in range(rng.randrange(0, 6)):
            name = rng.choice([b"TAGS", b"KEYS", b"UNIQ_KEY", b"WAIT", b"DELAY", b"a", "ключ".encode(), b"n\x00"])
            value = rng.choice([b"v", b"1", b"3", b"k1 k2  k3 ", b" ", b"  a", *texts])
            if name == b"DELAY":  # a malformed DELAY on the delay topic is damage: keep it parseable
                value = rng.choice([b"1", b"3", b"0", b"-2", b"99"])
            pairs.append((name, value))
        props = _props(pairs)
        if rng.random() < 0.1:
            props = rng.choice([b"\x02\x02", b"A\x01", b"\x01B", b"AB", b"A\x01B\x02", b"A\x01\x01\x02C\x01D",
                                b"TAGS\x01x\x02TAGS\x01y\x02KEYS\x01p q\x02KEYS\x01r"])
        sys_flag = rng.choice([0, 0, 0, 0x4, 0x8, 0xC, 0x2, 0x80, BORNHOST_V6_FLAG, STOREHOSTADDRESS_V6_FLAG,
                               BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG, 0x1, 0x101, 0x201, 0x301, 0x401, 0x701])
        body = rng.choice([b"", b"x", b"xy", b"xyz", bytes(range(256)), *texts, b"{\"a\": 1}"])
        if sys_flag & 1 and rng.random() < 0.7 and (sys_flag & 0x700) in (0, 0x300):
            body = zlib.compress(body or b"hello")
        recs.append(dict(
            topic=topic, body=body, properties=props, queue_id=rng.choice([0, 3, -1, 2**31 - 1]),
            flag=rng.choice([0, -7, 123456]), queue_offset=rng.choice([0, i, -(2**63), 2**63 - 1]),
            sys_flag=sys_flag, born_timestamp=rng.choice([0, -1, 1_700_000_000_000, 2**62]),
            born_addr=bytes(rng.randrange(256) for _ in range(16 if sys_flag & BORNHOST_V6_FLAG else 4)),
            born_port=rng.choice([0, 65535, -1, 2**31 - 1]),
            store_timestamp=rng.choice([1_700_000_000_000 + i, -5, 253402300800000, 0]),
            store_addr=bytes(rng.randrange(256) for _ in range(16 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 4)),
            store_port=rng.choice([10911, -2, 0]), reconsume_times=rng.choice([0, 16, -3]),
            prepared_transaction_offset=rng.choice([0, 99, -(2**63)]),
            magic=rng.choice([MESSAGE_MAGIC_CODE_V2, 0xDAA320A7])))
    return recs


@pytest.fixture(scope="module")
def awkward_store(tmp_path_factory):
    """Two segments of awkward records (the first ends with a BLANK), then zeros."""
    root = tmp_path_factory.mktemp("awkward")
    cl = root / "commitlog"
    cl.mkdir()
    recs = _awkward_records(random.Random(7))
    seg, pos, base, k = bytearray(SEG_SIZE), 0, 0, 0
    for fields in recs:
        r = encode_fields(physical_offset=base + pos, **fields)
        if pos + len(r) + 8 > SEG_SIZE:
            seg[pos:] = encode_blank(SEG_SIZE - pos)
            (cl / f"{base:020d}").write_bytes(seg)
            base += SEG_SIZE
            seg, pos, k = bytearray(SEG_SIZE), 0, k + 1
            r = encode_fields(physical_offset=base + pos, **fields)
        seg[pos:pos + len(r)] = r
        pos += len(r)
    (cl / f"{base:020d}").write_bytes(seg)
    return root


def _scan(monkeypatch, fast: bool, args: list[str]):
    monkeypatch.setenv("RMQDUMP_FAST", "1" if fast else "0")
    res = CliRunner().invoke(cli, ["scan", "-f", "jsonl", *args])
    exc = None if res.exception is None or isinstance(res.exception, SystemExit) else repr(res.exception)
    return res.exit_code, res.stdout_bytes, res.stderr_bytes, exc


@pytest.fixture
def spy(monkeypatch):
    """Counts the records the compiled renderer handled (batches and fallbacks)."""
    calls = {"batches": 0}
    orig = fastrender.JsonlRenderer.write_batch

    def write_batch(self, *a, **kw):
        calls["batches"] += 1
        return orig(self, *a, **kw)

    monkeypatch.setattr(fastrender.JsonlRenderer, "write_batch", write_batch)
    return calls


def _same_scan(monkeypatch, spy, args: list[str], expect_fast: bool = True) -> bytes:
    want = _scan(monkeypatch, False, args)
    assert spy["batches"] == 0
    got = _scan(monkeypatch, True, args)
    assert got[0] == want[0]
    assert got[1] == want[1]
    assert got[2] == want[2]
    assert got[3] == want[3]
    if expect_fast and want[1]:
        assert spy["batches"] > 0
    spy["batches"] = 0
    return want[1]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("store", STORES, ids=lambda p: "/".join(p.parts[-2:]))
def test_scan_jsonl_identical(monkeypatch, spy, store, mode):
    _same_scan(monkeypatch, spy, ["--body", mode, str(store)])


@pytest.mark.parametrize("mode", MODES)
def test_scan_jsonl_awkward(monkeypatch, spy, awkward_store, mode):
    out = _same_scan(monkeypatch, spy, ["--body", mode, str(awkward_store)])
    assert out.count(b"\n") == 120
    # the kernel rendered most lines itself (only the special records went through Python)
    r = fastrender.JsonlRenderer(lambda b: None, lambda m: b"", fastrender.BODY_MODES.get(mode.split(":")[0], 1))
    from rmqdump.store.commitlog import CommitLog

    walk = fastwalk.FastWalk(CommitLog.open(awkward_store))
    for item in walk.batches():
        if isinstance(item, fastwalk.RecordBatch):
            r.write_batch(item)
    assert r.count == 120 and r.fallbacks < (110 if mode.startswith("text") else 80)


def test_scan_jsonl_decompress(monkeypatch, spy, awkward_store):
    monkeypatch.setenv("RMQDUMP_FAST", "0")
    _same_scan(monkeypatch, spy, ["--body", "base64", "--decompress", "--no-crc", str(awkward_store)])


@pytest.mark.parametrize("extra", [
    ["--limit", "1"], ["--limit", "7"], ["--limit", "500"], ["--topic", "TopicA"], ["--topic", "T", "--topic", "q\"t"],
    ["--queue", "3"], ["--since", "1700000000005"], ["--until", "1700000000050"], ["--from-offset", "0",
                                                                                    "--max-bytes", "3000"],
    ["--no-crc"], ["--topic", "Tópico", "--limit", "2"],
])
def test_scan_jsonl_options(monkeypatch, spy, awkward_store, extra):
    _same_scan(monkeypatch, spy, ["--body", "base64", *extra, str(awkward_store)])


def test_scan_jsonl_options_real(monkeypatch, spy):
    store = REAL / "clean"
    if not store.is_dir():
        pytest.skip("real store missing")
    for extra in (["--limit", "3"], ["--queue", "1"], ["--tag", "TagA"], ["--max-bytes", "5000"]):
        _same_scan(monkeypatch, spy, [*extra, str(store)], expect_fast="--tag" not in extra)


def test_small_buffer_and_batches(awkward_store, monkeypatch):
    """Output buffer overflows, single-record batches and worker threads give the same bytes as
    one big buffer on one thread."""
    from rmqdump.store.commitlog import CommitLog

    def run(buffer_size: int, batch_records: int, jobs: int = 1) -> bytes:
        chunks: list[bytes] = []
        r = fastrender.JsonlRenderer(lambda b: chunks.append(bytes(b)), _pure_line, fastrender.MODE_BASE64,
                                     buffer_size=buffer_size, jobs=jobs)
        walk = fastwalk.FastWalk(CommitLog.open(awkward_store), batch_records=batch_records)
        try:
            for item in walk.batches():
                if isinstance(item, fastwalk.RecordBatch):
                    r.write_batch(item)
        finally:
            r.close()
        assert r.count == 120
        return b"".join(chunks)

    big = run(fastrender.OUT_BUFFER, 65536)
    assert big.count(b"\n") == 120
    assert run(3000, 5) == big
    assert run(100, 1) == big  # every record too big for the buffer: all rendered by the callback
    monkeypatch.setattr(fastrender, "MIN_RANGE_ROWS", 3)
    for jobs in (2, 3):
        assert run(fastrender.OUT_BUFFER, 65536, jobs) == big
        assert run(5000, 65536, jobs) == big  # workers stop at a full buffer: finished on the caller's thread
        assert run(5000, 7, jobs) == big
    from rmqdump.store.commitlog import CommitLog as CL

    assert big == b"".join(_pure_line(m) for m in CL.open(awkward_store).walk() if hasattr(m, "topic_raw"))


def _pure_line(msg) -> bytes:
    from rmqdump.cli.output import _dumps
    from rmqdump.rows.bodyfmt import BodyDecoder, message_to_row

    return (_dumps(message_to_row(msg, BodyDecoder("base64", "base64"))) + "\n").encode()


# --- Arrow / Parquet ---------------------------------------------------------------------------------
def _table(source, fast: bool, **kw) -> pa.Table:
    batches = []
    from rmqdump.rows.arrow import iter_splits

    for split in iter_splits(source):
        batches.extend(read_split(split, fast=fast, **kw))
    from rmqdump.rows.arrow import RECORD_SCHEMA

    return pa.Table.from_batches(batches, schema=RECORD_SCHEMA)


@pytest.mark.parametrize("body", [False, True])
@pytest.mark.parametrize("store", STORES, ids=lambda p: "/".join(p.parts[-2:]))
def test_arrow_identical(store, body):
    want = _table(str(store), False, include_body=body)
    got = _table(str(store), True, include_body=body)
    assert got.equals(want)


@pytest.mark.parametrize("kw", [{}, {"include_body": True}, {"include_body": True, "decompress": True, "crc": "off"},
                                {"crc": "off"}, {"batch_size": 7}])
def test_arrow_awkward(awkward_store, kw):
    def run(fast: bool):
        try:
            return _table(str(awkward_store), fast, **kw)
        except RmqdumpError as e:  # a "compressed" body that is not: both paths refuse it alike
            return repr(e)

    want, got = run(False), run(True)
    if isinstance(want, str):
        assert got == want and kw.get("decompress")
        return
    assert got.num_rows == 120
    assert got.equals(want)


def test_parquet_export_identical(tmp_path, monkeypatch, awkward_store):
    from rmqdump.rows.export import export

    tables = []
    for flag in ("0", "1"):
        monkeypatch.setenv("RMQDUMP_FAST", flag)
        out = tmp_path / f"e{flag}.parquet"
        export(str(awkward_store), out, fmt="parquet")
        tables.append(pq.read_table(out))
    assert tables[0].num_rows == 120
    assert tables[1].equals(tables[0])


def test_record_batches_fast_flag(awkward_store):
    a = pa.Table.from_batches(list(record_batches(str(awkward_store), fast=True)))
    b = pa.Table.from_batches(list(record_batches(str(awkward_store), fast=False)))
    assert a.equals(b)


def test_numba_jit_fallback(awkward_store, tmp_path):
    """Without the shared library (RMQDUMP_FAST_LIBRARY=0) numba's JIT runs the same kernels."""
    import os
    import subprocess
    import sys

    code = ("import sys; sys.argv = ['rmqdump', 'scan', '-f', 'jsonl', '-q', '--body', 'hex', sys.argv[1]]\n"
            "from rmqdump.cli import main\nmain()\n")
    outs = []
    for env in ({"RMQDUMP_FAST": "0"}, {"RMQDUMP_FAST": "1", "RMQDUMP_FAST_LIBRARY": "0",
                                        "NUMBA_CACHE_DIR": str(tmp_path / "numba")}):
        res = subprocess.run([sys.executable, "-c", code, str(awkward_store)], capture_output=True, timeout=900,
                             env={**os.environ, **env})
        assert res.returncode == 0, res.stderr[-2000:]
        outs.append(res.stdout)
    assert outs[0].count(b"\n") == 120
    assert outs[1] == outs[0]
    probe = ("from rmqdump.fast import render as fastrender; import sys; b = fastrender.backend(); "
             "sys.stdout.write(b.kind)")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=900,
                         env={**os.environ, "RMQDUMP_FAST_LIBRARY": "0", "NUMBA_CACHE_DIR": str(tmp_path / "numba")})
    assert res.stdout.startswith("numba JIT"), res.stderr[-2000:]


def test_arrow_read_ahead(monkeypatch, awkward_store):
    """The walk on a helper thread (big segments) gives the same batches; closing early joins it."""
    from rmqdump.rows import arrow

    monkeypatch.setattr(fastwalk, "default_jobs", lambda: 2)
    want = _table(str(awkward_store), True, include_body=True)
    monkeypatch.setattr(arrow, "READ_AHEAD_BYTES", 0)
    for store in [awkward_store, *STORES]:
        assert _table(str(store), True, include_body=True).equals(_table(str(store), False, include_body=True))
    assert _table(str(awkward_store), True, include_body=True).equals(want)
    split = arrow.iter_splits(str(awkward_store))[0]
    it = read_split(split, fast=True, batch_size=1)
    next(it)
    it.close()  # must not hang on the walking thread
    import threading

    assert not [t for t in threading.enumerate() if t.name == "rmqdump-walk"]
