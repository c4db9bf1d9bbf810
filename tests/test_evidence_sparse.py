"""The evidence manifest's sha256 of sparse files (RocketMQ creates its queue files sparse): holes are hashed
as zeros without reading them, files on every core. ``bundle`` of a store of 20,000 sparse 6 MB LMQ queue
files read 120 GB of zeros. The digest is the plain sha256 of the file's bytes."""

from __future__ import annotations

import hashlib
import os

import pytest
from sparsefiles import count_reads, require_holes, write_sparse

from rmqdump.disk import evidence
from rmqdump.disk.evidence import _CHUNK, hash_file

BLOCK = 4096
MIB = 1 << 20


CASES = {
    "empty": (0, {}),
    "all hole": (6 * MIB, {}),
    "data first, hole to the end": (6 * MIB, {0: b"\1" * 60}),
    "hole first, data at the end": (3 * MIB, {3 * MIB - 7: b"tail!!!"}),
    "data across the read chunk and a block": (3 * MIB, {_CHUNK - 5: b"x" * 10, 2 * BLOCK - 1: b"yz"}),
    "data extents between holes": (5 * MIB, {BLOCK * 3: b"a" * BLOCK * 2, 4 * MIB: b"b" * 100}),
    "not a multiple of a block": (MIB + 123, {MIB + 100: b"end"}),
}


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "zeros written"])
@pytest.mark.parametrize("case", CASES)
def test_sha256_is_the_bytes_sha256(tmp_path, case, sparse):
    size, pieces = CASES[case]
    f = tmp_path / "f"
    write_sparse(f, size, pieces, sparse)
    e = hash_file(f)
    assert e["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    assert e["size"] == size and "changed_while_hashing" not in e


def test_a_sparse_file_is_not_read_whole(tmp_path, monkeypatch):
    f = write_sparse(tmp_path / "q", 6_000_000, {0: b"\1" * 60})
    require_holes(f)
    read = count_reads(monkeypatch)
    assert hash_file(f)["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()
    assert read() < 64 << 10


def test_a_file_that_grows_or_shrinks_while_hashed(tmp_path, monkeypatch):
    """Bytes past the size taken at open are hashed up to the end (as before); a file cut short ends the digest
    there; both are flagged."""
    f = tmp_path / "g"
    write_sparse(f, 2 * MIB, {0: b"head", MIB: b"mid"})
    real = os.preadv
    calls = 0

    def grow(fd, bufs, off):
        nonlocal calls
        calls += 1
        if calls == 1:
            with open(f, "ab") as w:
                w.write(b"appended")
        return real(fd, bufs, off)

    monkeypatch.setattr(os, "preadv", grow)
    e = hash_file(f)
    assert e["size"] == 2 * MIB + 8 and e["changed_while_hashing"]
    assert e["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()

    calls = 0

    def shrink(fd, bufs, off):
        nonlocal calls
        calls += 1
        if calls == 1:
            os.truncate(f, 100)
        return real(fd, bufs, off)

    monkeypatch.setattr(os, "preadv", shrink)
    e = hash_file(f)
    assert e["size"] == 100 and e["changed_while_hashing"]
    assert e["sha256"] == hashlib.sha256(f.read_bytes()).hexdigest()


def test_manifest_order_with_files_hashed_in_parallel(tmp_path):
    paths = []
    for i in range(9):
        p = tmp_path / f"f{i}"
        write_sparse(p, (i + 1) * 100_000, {i * 1000: bytes([i + 1]) * 10})
        paths.append(str(p))
    entries = evidence._hash_all(paths)
    assert [e["path"] for e in entries] == paths
    assert [e["sha256"] for e in entries] == [hashlib.sha256(open(p, "rb").read()).hexdigest() for p in paths]
