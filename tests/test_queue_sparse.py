"""Consume-queue files as RocketMQ creates them: sparse, 300,000 units long, a few written. The recovery
prediction looked for valid units past each queue's end by reading the rest of every file (6 MB per queue):
a store of 20,000 LMQ queues took minutes in ``verify``. The scan now skips holes and zero chunks
(:mod:`rmqdump.disk.extents`); what it finds is the unit-by-unit answer."""

from __future__ import annotations

import errno
import os

import pytest
from sparsefiles import count_reads, require_holes, write_sparse

from rmqdump.broker.recovery import queues as Q
from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, CQ_UNIT
from rmqdump.disk import extents
from rmqdump.store.consumequeue import ConsumeQueue
from rmqdump.store.root import Store

UNITS = 300_000
FILE = UNITS * CQ_STORE_UNIT_SIZE
#: units whose bytes cross a 4 KiB block and the 1 MiB read chunk (non-zero bytes on both sides of it), and
#: the file's last unit
ACROSS_BLOCK, ACROSS_CHUNK, LAST = 4096 // 20, (1 << 20) // 20, UNITS - 1


def _queue(root, units: dict[int, tuple[int, int, int]], sparse: bool = True):
    (root / "commitlog").mkdir()
    (root / "commitlog" / ("0" * 20)).write_bytes(bytes(4096))
    qdir = root / "consumequeue" / "T" / "0"
    qdir.mkdir(parents=True)
    write_sparse(qdir / ("0" * 20), FILE, {i * CQ_STORE_UNIT_SIZE: CQ_UNIT.pack(*u) for i, u in units.items()},
                 sparse)
    return qdir


def _reference(cq, start: int, stop: int | None = None) -> list[tuple[int, int]]:
    """Valid units in [start, stop) read one by one by the reader."""
    return [(u.queue_offset, u.commit_log_offset) for u in cq.iter_raw(start)
            if (stop is None or u.queue_offset < stop) and u.is_valid]


CASES = {
    "written head only": {0: (0, 10, 0), 1: (10, 10, 0), 2: (20, 10, 0)},
    "a unit across a block, one across the read chunk, the last": {
        0: (0, 10, 0), ACROSS_BLOCK: (100, 10, 0), ACROSS_CHUNK: (200, 10, 1 << 32 | 1), LAST: (300, 10, 0)},
    "invalid non-zero units past the end": {0: (0, 10, 0), 5: (-1, 10, 0), 9000: (7, 0, 3), 9001: (50, 10, 0)},
    "a unit whose only non-zero byte is its tags code": {0: (0, 10, 0), ACROSS_CHUNK + 1: (0, 0, 1)},
}


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "zeros written"])
@pytest.mark.parametrize("case", CASES)
def test_units_past_the_end_are_the_unit_by_unit_answer(tmp_path, case, sparse):
    _queue(tmp_path, CASES[case], sparse)
    states, problems = Q.consume_queue_states(Store.open(tmp_path))
    (st,) = states
    assert problems == []
    cq = ConsumeQueue(st.path, "T", 0, FILE)
    assert st.beyond == _reference(cq, st.max_offset)
    for lo, hi in ((0, None), (1, ACROSS_CHUNK), (ACROSS_BLOCK, ACROSS_CHUNK + 1), (LAST, None)):
        assert [(u.queue_offset, u.commit_log_offset) for u in Q._units(cq, lo, hi) if u.is_valid] == \
            _reference(cq, lo, hi), (lo, hi)


def test_a_sparse_queue_file_is_not_read_whole(tmp_path, monkeypatch):
    """A 6 MB queue file with three units: the queue's state (recovery, units past its end) and its truncation
    to a commitlog end read a few KiB of it (they read all 6 MB, and a 327 KB first chunk)."""
    qdir = _queue(tmp_path, CASES["written head only"])
    require_holes(qdir / ("0" * 20))
    read = count_reads(monkeypatch)
    (st,), _ = Q.consume_queue_states(Store.open(tmp_path))
    assert st.max_offset == 3 and st.beyond == []
    assert read(reset=True) < 64 << 10
    # the commitlog ends before the queue's entries: truncateDirtyLogicFiles keeps the units below its end
    # (it read the whole file)
    cut = Q.cq_truncation(st, 15, True)
    assert (cut.new_end, cut.dropped) == (2, [(2, 20)])
    assert read() < 64 << 10


def test_extents_where_the_filesystem_cannot_say(tmp_path, monkeypatch):
    """No SEEK_DATA (EINVAL): the whole range may be data, and the non-zero chunks are still found."""
    p = tmp_path / "f"
    p.write_bytes(bytes(5000) + b"\1" + bytes(3000))

    def no_seek(fd, pos, how):
        raise OSError(errno.EINVAL, "not supported")

    fd = os.open(p, os.O_RDONLY)
    try:
        monkeypatch.setattr(os, "lseek", no_seek)
        assert list(extents.data_extents(fd, 100, 8001)) == [(100, 8001)]
        assert [(a, len(b)) for a, b in extents.nonzero_chunks(fd, 0, 8001, chunk=4096)] == [(4096, 3905)]
    finally:
        os.close(fd)


def test_is_zero():
    assert extents.is_zero(b"") and extents.is_zero(bytes(extents.CHUNK)) and extents.is_zero(bytes(3 * extents.CHUNK))
    assert not extents.is_zero(bytes(extents.CHUNK) + b"\1") and not extents.is_zero(b"\0\1")
