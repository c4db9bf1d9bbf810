"""`rmqdump export` by the compiled path against the pure path, byte for byte.

``export --to F.jsonl`` must write the same bytes (and the same stderr, exit code) with ``RMQDUMP_FAST=1``
(the compiled walk rendered by :class:`rmqdump.rows.exportjsonl.CompiledJsonl`) as with ``RMQDUMP_FAST=0``
(per-record rows through ``jsonl_lines``), and ``--to F.parquet`` the same table, over every fixture
store, the real broker stores, the awkward records of ``test_scan_fast`` (IPv6 hosts, the delay topic,
compressed bodies, invalid UTF-8, store times outside 1970-9999) and store times across the calendar.
"""

from __future__ import annotations

import shutil

import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from test_scan_fast import SEG_SIZE, STORES, awkward_store  # noqa: F401 (a fixture)

from rmqdump.cli import cli
from rmqdump.codec.encoder import encode_fields
from rmqdump.fast import walk as fastwalk
from rmqdump.rows import exportjsonl

pytestmark = pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")

IDS = {"ids": lambda p: "/".join(p.parts[-2:])}


@pytest.fixture
def compiled(monkeypatch):
    """Counts the splits the compiled JSONL writer wrote."""
    calls = {"splits": 0}
    orig = exportjsonl.CompiledJsonl.write_split

    def write_split(self, *a, **kw):
        calls["splits"] += 1
        return orig(self, *a, **kw)

    monkeypatch.setattr(exportjsonl.CompiledJsonl, "write_split", write_split)
    return calls


def _export(monkeypatch, tmp_path, fast: bool, store, suffix: str, args: list[str]):
    monkeypatch.setenv("RMQDUMP_FAST", "1" if fast else "0")
    out = tmp_path / f"out-{int(fast)}.{suffix}"
    res = CliRunner().invoke(cli, ["export", str(store), "--to", str(out), "--overwrite", *args])
    exc = None if res.exception is None or isinstance(res.exception, SystemExit) else repr(res.exception)
    stderr = res.stderr.replace(str(out), "OUT")
    stderr = "\n".join(line.split(" in ")[0] for line in stderr.splitlines())  # the summary's time and rate
    return res.exit_code, stderr, exc, out


def _same_jsonl(monkeypatch, tmp_path, compiled, store, args: list[str]) -> bytes:
    want = _export(monkeypatch, tmp_path, False, store, "jsonl", args)
    assert compiled["splits"] == 0
    got = _export(monkeypatch, tmp_path, True, store, "jsonl", args)
    assert got[:3] == want[:3]
    data = want[3].read_bytes()
    assert got[3].read_bytes() == data
    if data:
        assert compiled["splits"] > 0
    compiled["splits"] = 0
    return data


@pytest.mark.parametrize("body", [[], ["--body"]])
@pytest.mark.parametrize("store", STORES, **IDS)
def test_export_jsonl_identical(monkeypatch, tmp_path, compiled, store, body):
    _same_jsonl(monkeypatch, tmp_path, compiled, store, body)


@pytest.mark.parametrize("args", [[], ["--body"], ["--body", "--decompress", "--crc", "off"], ["--crc", "off"],
                                  ["--topic", "TopicA", "--topic", "SCHEDULE_TOPIC_XXXX"],
                                  ["--queue", "3", "--since", "1700000000050"]])
def test_export_jsonl_awkward(monkeypatch, tmp_path, compiled, awkward_store, args):  # noqa: F811
    fallbacks = []
    orig = exportjsonl.CompiledJsonl._render
    monkeypatch.setattr(exportjsonl.CompiledJsonl, "_render", lambda self, m: fallbacks.append(1) or orig(self, m))
    data = _same_jsonl(monkeypatch, tmp_path, compiled, awkward_store, args)
    if not any(a in ("--topic", "--queue") for a in args):
        assert data.count(b"\n") == 120
    if not args:
        assert fallbacks  # IPv6 hosts, the delay topic: rendered by the reference in their place


def test_export_jsonl_lineage_names(monkeypatch, tmp_path, compiled, awkward_store):  # noqa: F811
    """Quotes, backslashes and non-ASCII in the store path and broker name are escaped alike."""
    store = tmp_path / 'st\u00f6re "q" \\ \u2028'
    shutil.copytree(awkward_store, store)
    data = _same_jsonl(monkeypatch, tmp_path, compiled, store, ["--body"])
    assert '"st\u00f6re \\"q\\" \\\\ \u2028'.encode() in data


def test_export_jsonl_store_times(monkeypatch, tmp_path, compiled):
    """store_time across the calendar (leap days, centuries, the last millisecond of 9999, before 1970)."""
    times = [0, 1, 999, 86_399_999, 86_400_000, 951_782_400_000, 951_868_799_999, 4_107_542_399_999,
             4_107_542_400_000, 1_709_164_800_123, 253_402_300_799_999, 253_402_300_800_000, -1, -86_400_001]
    times += [i * 77_777_777_777 % 253_402_300_800_000 for i in range(1, 60)]
    root = tmp_path / "times"
    (root / "commitlog").mkdir(parents=True)
    seg = bytearray()
    for i, ts in enumerate(times):
        seg += encode_fields(topic=b"T", body=b"b", properties=b"", queue_offset=i, physical_offset=len(seg),
                             store_timestamp=ts, born_timestamp=ts)
    (root / "commitlog" / f"{0:020d}").write_bytes(bytes(seg) + bytes(SEG_SIZE - len(seg)))
    data = _same_jsonl(monkeypatch, tmp_path, compiled, root, [])
    assert data.count(b"\n") == len(times)
    assert b'"store_time": "2000-02-29T23:59:59.999+00:00"}' in data
    assert b'"store_time": "9999-12-31T23:59:59.999+00:00"}' in data
    assert data.count(b'"store_time": null}') == 3


def test_export_jsonl_read_ahead(monkeypatch, tmp_path, compiled, awkward_store):  # noqa: F811
    """The walk on a helper thread (big segments) and the renderer's worker threads write the same lines."""
    from rmqdump.rows import arrow

    monkeypatch.setattr(fastwalk, "default_jobs", lambda: 2)
    monkeypatch.setattr(arrow, "READ_AHEAD_BYTES", 0)
    for store in (awkward_store, *STORES[:2]):
        _same_jsonl(monkeypatch, tmp_path, compiled, store, ["--body"])


@pytest.mark.parametrize("body", [[], ["--body"]])
@pytest.mark.parametrize("store", STORES, **IDS)
def test_export_parquet_identical(monkeypatch, tmp_path, store, body):
    want = _export(monkeypatch, tmp_path, False, store, "parquet", body)
    got = _export(monkeypatch, tmp_path, True, store, "parquet", body)
    assert got[:3] == want[:3]
    assert pq.read_table(got[3]).equals(pq.read_table(want[3]))


@pytest.mark.parametrize("args", [["--body", "--decompress", "--crc", "off"], ["--topic", "TopicA"]])
def test_export_parquet_awkward(monkeypatch, tmp_path, awkward_store, args):  # noqa: F811
    want = _export(monkeypatch, tmp_path, False, awkward_store, "parquet", args)
    got = _export(monkeypatch, tmp_path, True, awkward_store, "parquet", args)
    assert got[:3] == want[:3]
    assert pq.read_table(got[3]).equals(pq.read_table(want[3]))


def test_export_never_replaces_a_device_or_fifo(tmp_path, monkeypatch):
    """--overwrite replaces a file, never a FIFO or a device (the finished file is renamed over the output:
    `--to /dev/null --overwrite` as root replaced /dev/null with a regular file)."""
    import os
    import stat

    fifo = tmp_path / "out.jsonl"
    os.mkfifo(fifo)
    for fast in ("0", "1"):
        monkeypatch.setenv("RMQDUMP_FAST", fast)
        res = CliRunner().invoke(cli, ["export", str(STORES[0]), "--to", str(fifo), "--overwrite", "-q"])
        assert res.exit_code == 2 and isinstance(res.exception, SystemExit), res.output
        assert "not a regular file" in res.stderr
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
