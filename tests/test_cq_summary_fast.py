"""``rmqdump cq``'s queue summary counts the units of a queue's broker view with numpy (``fast.cqcount``) exactly
as the per-unit loop does: the ``fillPreBlank`` placeholders, the invalid units and the queue offsets of the first
``MAX_LISTED`` of them, on every bundled store and on a queue written to hold each kind across reads of any size,
a missing file included."""

from __future__ import annotations

import struct

import pytest
from twins import STORES, store_id

from rmqdump.analysis import dumps
from rmqdump.codec.layout import CQ_PRE_BLANK_SIZE
from rmqdump.fast import cqcount
from rmqdump.fast.engine import fast_available
from rmqdump.write.message import MessageSpec
from rmqdump.write.writer import StoreWriter

pytestmark = pytest.mark.skipif(not fast_available(), reason="numba/numpy not installed")


def _summary(store, monkeypatch, flag: str, chunk_units: int | None = None) -> tuple[dict, int]:
    monkeypatch.setenv("RMQDUMP_FAST", flag)
    monkeypatch.setattr(dumps, "FAST_CHUNK_UNITS", chunk_units or dumps.FAST_CHUNK_UNITS)
    real = cqcount.unit_counts
    calls = []

    def counted(chunks, listed):
        calls.append(listed)
        return real(chunks, listed)

    monkeypatch.setattr(cqcount, "unit_counts", counted)
    doc = dumps.cq_summary(store)
    monkeypatch.setattr(cqcount, "unit_counts", real)
    return doc, len(calls)


def _same(store, monkeypatch, chunk_units: int | None = None) -> dict:
    pure, pure_calls = _summary(store, monkeypatch, "0")
    fast, fast_calls = _summary(store, monkeypatch, "1", chunk_units)
    assert pure_calls == 0 and fast_calls == len(fast["queues"]) > 0, "each engine counted"
    assert fast == pure
    return pure


@pytest.mark.parametrize("store", [s for s in STORES if (s / "consumequeue").is_dir()], ids=store_id)
def test_bundled_stores_summarised_alike(store, monkeypatch):
    _same(store, monkeypatch)
    _same(store, monkeypatch, 1)


def test_placeholders_and_invalid_units_across_reads(tmp_path, monkeypatch):
    root = tmp_path / "s"
    per_file = 8
    with StoreWriter(root, commitlog_file_size=4096, cq_file_size=20 * per_file, build_index=False,
                     clock=lambda: 1_700_000_000_000) as w:
        for _ in range(64):
            w.append(MessageSpec("T", b"x" * 40, queue_id=0))
        w.sync()
    qdir = root / "consumequeue" / "T" / "0"
    files = sorted(qdir.iterdir())
    assert len(files) == 8
    files[2].unlink()  # a file lost between kept ones
    planted: dict[int, tuple[int, int]] = {}  # queue offset -> (commitlog offset, size)
    for qoff in [0, 3, 4, 5, 7, 8, 9, 10, 11, 12, 14, 15, 24, 25, 26, 27, 29, 30, 31, 32, 33, 34, 36, 38, 39]:
        planted[qoff] = (-1, 50) if qoff % 3 == 0 else (500, 0) if qoff % 3 == 1 else (0, -7)
    pre = [1, 28, 35]
    for qoff in pre:
        planted[qoff] = (0, CQ_PRE_BLANK_SIZE)
    for qoff, (off, size) in planted.items():
        with open(qdir / f"{qoff // per_file * per_file * 20:020d}", "r+b") as f:
            f.seek(qoff % per_file * 20)
            f.write(struct.pack(">qiq", off, size, 0))
    for chunk_units in (None, 1, 3, 8):
        doc = _same(root, monkeypatch, chunk_units)
    (q,) = doc["queues"]
    bad = sorted(k for k in planted if k not in pre)
    assert (q["pre_blank"], q["holes"], q["hole_offsets"]) == (3, len(bad), bad[:dumps.MAX_LISTED])
    assert q["missing_files"] == [{"from_queue_offset": 16, "to_queue_offset": 24, "files": 1}]
