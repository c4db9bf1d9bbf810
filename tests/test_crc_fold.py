"""The compiled CRC-32's PCLMULQDQ folding (eight 128-bit lanes per 128-byte step, then 4, 2, 1 lanes,
16-byte blocks, a table tail) against zlib.crc32: every length around the fold boundaries, every
alignment, the constants, and the scalar fallback used where PCLMULQDQ is missing."""

from __future__ import annotations

import random
import zlib

import pytest

from rmqdump.fast import abi
from rmqdump.fast import walk as fastwalk

pytestmark = pytest.mark.skipif(not fastwalk.fast_available(), reason="numba/numpy not installed")

DATA = random.Random(15).randbytes(200_000)


def _clmul_backend():
    if not fastwalk.backend().clmul:
        pytest.skip("no PCLMULQDQ on this host")


def test_fold_constants_are_derived():
    """The published constants (Intel's paper, fold by 64 and 16 bytes, x^64) come out of
    fold_constant, and every constant the kernel uses is fold_constant(8 D +- 32)."""
    k = pytest.importorskip("rmqdump.fast._kernels")
    assert [k.fold_constant(n) for n in (4 * 128 + 32, 4 * 128 - 32, 128 + 32, 128 - 32, 64)] == [
        0x154442BD4, 0x1C6E41596, 0x1751997D0, 0x0CCAA009E, 0x163CD6124]
    for d, pair in ((128, k._FOLD_128), (64, k._FOLD_64), (32, k._FOLD_32), (16, k._FOLD_16)):
        assert pair == (k.fold_constant(8 * d + 32), k.fold_constant(8 * d - 32)), d
    assert (int(k._K3), int(k._K4), int(k._K5)) == (*k._FOLD_16, k.fold_constant(64))


@pytest.mark.parametrize("mode", [abi.CRC_CLMUL, abi.CRC_TABLE])
def test_every_length_and_alignment(mode):
    """Lengths 0..600 (below, at and across the 64- and 128-byte fold boundaries) at 16 alignments."""
    if mode == abi.CRC_CLMUL:
        _clmul_backend()
    mv = memoryview(DATA)
    for s in range(16):
        for n in range(601):
            assert fastwalk.crc32(mv[s:s + n], mode) == zlib.crc32(mv[s:s + n]), (s, n)


def test_lengths_across_the_eight_lane_steps():
    """n = 128 k + d for the d that end a buffer just before, at and after a 128-, 64- and
    16-byte step (the 8 -> 4 -> 2 -> 1 lane reduction and the 16-byte loop), up to 20 KiB."""
    _clmul_backend()
    mv = memoryview(DATA)
    rnd = random.Random(7)
    for k in range(1, 160):
        for d in (-65, -64, -63, -17, -16, -15, -1, 0, 1, 15, 16, 17, 48, 63, 64, 65, 79, 80, 112, 127):
            n = 128 * k + d
            s = rnd.randrange(0, 64)
            assert fastwalk.crc32(mv[s:s + n], abi.CRC_CLMUL) == zlib.crc32(mv[s:s + n]), (s, n)


def test_random_slices_and_whole_buffer():
    _clmul_backend()
    mv = memoryview(DATA)
    rnd = random.Random(3)
    for _ in range(400):
        s = rnd.randrange(0, len(DATA))
        n = rnd.randrange(0, len(DATA) - s + 1)
        assert fastwalk.crc32(mv[s:s + n], abi.CRC_CLMUL) == zlib.crc32(mv[s:s + n]), (s, n)
    assert fastwalk.crc32(DATA) == zlib.crc32(DATA)
    zeros, ones = bytes(4099), b"\xff" * 4099
    assert fastwalk.crc32(zeros, abi.CRC_CLMUL) == zlib.crc32(zeros)
    assert fastwalk.crc32(ones, abi.CRC_CLMUL) == zlib.crc32(ones)


def test_scalar_fold_fallback():
    """_fold_soft (what clmul_fold compiles to without PCLMULQDQ) + crc_reduce + the table tail."""
    k = pytest.importorskip("rmqdump.fast._kernels")
    np = pytest.importorskip("numpy")
    from numba import njit

    @njit
    def soft_crc(buf, s, e, t):
        a, b, p = k._fold_soft(buf, s, e, np.uint64(0xFFFFFFFF))
        return k.crc_update_table(k.crc_reduce(a, b), buf, p, e, t) ^ np.uint64(0xFFFFFFFF)

    arr = np.frombuffer(DATA, dtype=np.uint8)
    for s in (0, 3):
        for n in [*range(16, 300), 1000, 4097]:
            assert soft_crc(arr, s, s + n, k.CRC_TABLES) == zlib.crc32(DATA[s:s + n]), (s, n)
