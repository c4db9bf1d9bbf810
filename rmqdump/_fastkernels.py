"""Compiled (numba) kernels behind :mod:`rmqdump.fastwalk`. Importing this module imports numba.

Only :mod:`rmqdump.fastwalk` should import it, and only when a job is large enough to pay for
it. Kernels are compiled with ``cache=True`` (numba's cache: ``__pycache__`` beside this file,
or the user-wide cache when that is read-only, or ``NUMBA_CACHE_DIR``).

The record walk mirrors :func:`rmqdump.record.decode_record` check for check, in the same order,
so that its stop verdict (position + kind) is the pure decoder's. The body CRC is CRC-32
(zlib's) computed by PCLMULQDQ folding where the CPU has it, else by a slice-by-8 table.
"""

from __future__ import annotations

import os
import platform

import numba
import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# --- kernel return codes ---------------------------------------------------------------------
FULL = 0  # batch full (records or bytes); resume at the returned position
SEG_END = 1  # a record ended exactly at the end of the segment
BLANK = 2  # a valid end-of-file BLANK at the returned position
LIMIT = 3  # reached the caller's limit position (--to-offset)
DEFER = 4  # a record the Python decoder must judge (DELAY property on SCHEDULE_TOPIC_XXXX)
INVALID = 16  # INVALID + k: invalid record of kind k (index into fastwalk.KINDS)

K_END_OF_DATA, K_BAD_MAGIC, K_BAD_TOTALSIZE, K_TRUNCATED = 0, 1, 2, 3
K_LENGTH_MISMATCH, K_BODY_CRC, K_BAD_FIELD, K_BAD_BLANK = 4, 5, 6, 7

CRC_TABLE = 0
CRC_CLMUL = 1

_MAGIC_V1 = 0xDAA320A7
_MAGIC_V2 = 0xDAA320AB
_MAGIC_BLANK = 0xCBD43194
_MIN_RECORD = 91
_SCHEDULE = np.frombuffer(b"SCHEDULE_TOPIC_XXXX", dtype=np.uint8).copy()
_DELAY = np.frombuffer(b"DELAY", dtype=np.uint8).copy()


def host_has_clmul() -> bool:
    """Whether the compile target is this x86-64 host and it has PCLMULQDQ."""
    if os.environ.get("RMQDUMP_CRC", "").lower() == "table":
        return False
    if numba.config.CPU_NAME or numba.config.CPU_FEATURES:
        return False  # an explicit (portable) target: do not assume host features
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        from llvmlite import binding as ll

        return bool(ll.get_host_cpu_features().get("pclmul", False))
    except Exception:  # pragma: no cover - feature detection unavailable
        return False


HAVE_CLMUL = host_has_clmul()


# --- intrinsics: unaligned little/big-endian loads, carry-less multiply ------------------------
def _load(builder, context, aryty, ary_val, idx, bits):
    ary = context.make_array(aryty)(context, builder, ary_val)
    ptr = builder.gep(ary.data, [idx])
    return builder.load(builder.bitcast(ptr, ir.IntType(bits).as_pointer()), align=1)


def _bswap(builder, v, bits):
    fn = builder.module.declare_intrinsic("llvm.bswap", [ir.IntType(bits)])
    return builder.call(fn, [v])


@intrinsic
def ld_le64(typingctx, arr, idx):
    """Unaligned little-endian uint64 at ``arr[idx]`` (no bounds check)."""
    sig = types.uint64(arr, types.int64)

    def codegen(context, builder, signature, args):
        return _load(builder, context, signature.args[0], args[0], args[1], 64)

    return sig, codegen


@intrinsic
def ld_le32(typingctx, arr, idx):
    """Unaligned little-endian uint32 at ``arr[idx]`` (no bounds check)."""
    sig = types.uint32(arr, types.int64)

    def codegen(context, builder, signature, args):
        return _load(builder, context, signature.args[0], args[0], args[1], 32)

    return sig, codegen


@intrinsic
def ld_be32(typingctx, arr, idx):
    """Big-endian signed int32 at ``arr[idx]`` (no bounds check)."""
    sig = types.int32(arr, types.int64)

    def codegen(context, builder, signature, args):
        return _bswap(builder, _load(builder, context, signature.args[0], args[0], args[1], 32), 32)

    return sig, codegen


@intrinsic
def ld_be64(typingctx, arr, idx):
    """Big-endian signed int64 at ``arr[idx]`` (no bounds check)."""
    sig = types.int64(arr, types.int64)

    def codegen(context, builder, signature, args):
        return _bswap(builder, _load(builder, context, signature.args[0], args[0], args[1], 64), 64)

    return sig, codegen


@intrinsic
def ld_be16(typingctx, arr, idx):
    """Big-endian signed int16 at ``arr[idx]`` (no bounds check)."""
    sig = types.int16(arr, types.int64)

    def codegen(context, builder, signature, args):
        return _bswap(builder, _load(builder, context, signature.args[0], args[0], args[1], 16), 16)

    return sig, codegen


def _soft_clmul(a, b):
    lo = np.uint64(0)
    hi = np.uint64(0)
    for i in range(64):
        if (b >> np.uint64(i)) & np.uint64(1):
            lo ^= a << np.uint64(i)
            if i:
                hi ^= a >> np.uint64(64 - i)
    return lo, hi


@intrinsic
def clmul(typingctx, a, b):
    """128-bit carry-less product of two uint64 -> (low, high). PCLMULQDQ on x86-64 hosts that
    have it; a (slow, never used on the hot path) shift-and-xor loop elsewhere."""
    sig = types.UniTuple(types.uint64, 2)(types.uint64, types.uint64)

    def codegen(context, builder, signature, args):
        if not HAVE_CLMUL:
            return context.compile_internal(builder, _soft_clmul, signature, args)
        i32 = ir.IntType(32)
        v2 = ir.VectorType(ir.IntType(64), 2)
        undef = ir.Constant(v2, ir.Undefined)
        va = builder.insert_element(undef, args[0], ir.Constant(i32, 0))
        vb = builder.insert_element(undef, args[1], ir.Constant(i32, 0))
        fn = builder.module.declare_intrinsic("llvm.x86.pclmulqdq",
                                              fnty=ir.FunctionType(v2, [v2, v2, ir.IntType(8)]))
        r = builder.call(fn, [va, vb, ir.Constant(ir.IntType(8), 0)])
        lo = builder.extract_element(r, ir.Constant(i32, 0))
        hi = builder.extract_element(r, ir.Constant(i32, 1))
        return context.make_tuple(builder, signature.return_type, [lo, hi])

    return sig, codegen


# --- CRC-32 (reflected 0xEDB88320, zlib.crc32) ----------------------------------------------------
def make_crc_tables() -> np.ndarray:
    """Slice-by-8 tables: ``t[k][b]`` = CRC of byte b followed by k zero bytes."""
    t = np.zeros((8, 256), dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0xEDB88320 if c & 1 else 0)
        t[0, i] = c
    for k in range(1, 8):
        for i in range(256):
            prev = int(t[k - 1, i])
            t[k, i] = (prev >> 8) ^ int(t[0, prev & 0xFF])
    return t


CRC_TABLES = make_crc_tables()

# Folding constants for the reflected CRC-32 polynomial (Intel's "Fast CRC Computation for
# Generic Polynomials Using PCLMULQDQ"; the same values as Linux crc32-pclmul_asm.S).
_K1 = np.uint64(0x154442BD4)  # x^(4*128+32) mod P, reflected: fold by 512 bits
_K2 = np.uint64(0x1C6E41596)  # x^(4*128-32)
_K3 = np.uint64(0x1751997D0)  # fold by 128 bits
_K4 = np.uint64(0x0CCAA009E)
_K5 = np.uint64(0x163CD6124)  # 64 -> 32-bit fold
_P = np.uint64(0x1DB710641)  # P(x)' (Barrett)
_U = np.uint64(0x1F7011641)  # u' (Barrett)
_M32 = np.uint64(0xFFFFFFFF)
_S8 = np.uint64(8)
_S32 = np.uint64(32)
_FF = np.uint64(0xFF)


@njit(cache=True, nogil=True, boundscheck=False)
def crc_update_table(c, buf, s, e, t):
    """Continue the (pre-inverted) CRC state ``c`` over ``buf[s:e]``, slice-by-8."""
    p = s
    while p + 8 <= e:
        lo = np.uint32(c) ^ ld_le32(buf, p)
        hi = ld_le32(buf, p + 4)
        c = np.uint64(t[7, lo & 0xFF] ^ t[6, (lo >> 8) & 0xFF] ^ t[5, (lo >> 16) & 0xFF] ^ t[4, lo >> 24]
                      ^ t[3, hi & 0xFF] ^ t[2, (hi >> 8) & 0xFF] ^ t[1, (hi >> 16) & 0xFF] ^ t[0, hi >> 24])
        p += 8
    while p < e:
        c = (c >> _S8) ^ np.uint64(t[0, (c ^ np.uint64(buf[p])) & _FF])
        p += 1
    return c


@njit(cache=True, nogil=True, boundscheck=False)
def crc_update_clmul(c, buf, s, e, t):
    """Continue the (pre-inverted) CRC state ``c`` over ``buf[s:e]``: four-lane PCLMULQDQ
    folding over 64-byte blocks, then 16-byte folds, Barrett reduction, table for the tail."""
    p = s
    if e - s >= 64:
        a0 = ld_le64(buf, p) ^ c
        b0 = ld_le64(buf, p + 8)
        a1 = ld_le64(buf, p + 16)
        b1 = ld_le64(buf, p + 24)
        a2 = ld_le64(buf, p + 32)
        b2 = ld_le64(buf, p + 40)
        a3 = ld_le64(buf, p + 48)
        b3 = ld_le64(buf, p + 56)
        p += 64
        while p + 64 <= e:
            x0, y0 = clmul(a0, _K1)
            x1, y1 = clmul(b0, _K2)
            a0 = x0 ^ x1 ^ ld_le64(buf, p)
            b0 = y0 ^ y1 ^ ld_le64(buf, p + 8)
            x0, y0 = clmul(a1, _K1)
            x1, y1 = clmul(b1, _K2)
            a1 = x0 ^ x1 ^ ld_le64(buf, p + 16)
            b1 = y0 ^ y1 ^ ld_le64(buf, p + 24)
            x0, y0 = clmul(a2, _K1)
            x1, y1 = clmul(b2, _K2)
            a2 = x0 ^ x1 ^ ld_le64(buf, p + 32)
            b2 = y0 ^ y1 ^ ld_le64(buf, p + 40)
            x0, y0 = clmul(a3, _K1)
            x1, y1 = clmul(b3, _K2)
            a3 = x0 ^ x1 ^ ld_le64(buf, p + 48)
            b3 = y0 ^ y1 ^ ld_le64(buf, p + 56)
            p += 64
        x0, y0 = clmul(a0, _K3)
        x1, y1 = clmul(b0, _K4)
        a = x0 ^ x1 ^ a1
        b = y0 ^ y1 ^ b1
        x0, y0 = clmul(a, _K3)
        x1, y1 = clmul(b, _K4)
        a = x0 ^ x1 ^ a2
        b = y0 ^ y1 ^ b2
        x0, y0 = clmul(a, _K3)
        x1, y1 = clmul(b, _K4)
        a = x0 ^ x1 ^ a3
        b = y0 ^ y1 ^ b3
        while p + 16 <= e:
            x0, y0 = clmul(a, _K3)
            x1, y1 = clmul(b, _K4)
            a = x0 ^ x1 ^ ld_le64(buf, p)
            b = y0 ^ y1 ^ ld_le64(buf, p + 8)
            p += 16
        # 128 -> 96 bits (adds 32 zero bits), 96 -> 64, then Barrett 64 -> 32
        x0, y0 = clmul(a, _K4)
        lo = b ^ x0
        hi = y0
        t2 = (lo >> _S32) | (hi << _S32)
        x0, y0 = clmul(lo & _M32, _K5)
        lo = x0 ^ t2
        q, _ = clmul(lo & _M32, _U)
        q, _ = clmul(q & _M32, _P)
        c = ((lo ^ q) >> _S32) & _M32
    return crc_update_table(c, buf, p, e, t)


@njit(cache=True, nogil=True, boundscheck=False)
def crc32(buf, s, e, t, mode):
    """``zlib.crc32(buf[s:e])`` (unmasked)."""
    c = np.uint64(0xFFFFFFFF)
    if mode == CRC_CLMUL:
        c = crc_update_clmul(c, buf, s, e, t)
    else:
        c = crc_update_table(c, buf, s, e, t)
    return c ^ _M32


@njit(cache=True, nogil=True, boundscheck=False)
def crc32_chunks(buf, step, t, mode):
    """XOR of the CRCs of consecutive ``step``-byte chunks (benchmark helper)."""
    acc = np.uint64(0)
    n = buf.size
    i = 0
    while i < n:
        j = min(n, i + step)
        acc ^= crc32(buf, i, j, t, mode)
        i = j
    return acc


@njit(cache=True, nogil=True, boundscheck=False)
def sum_u64(words):
    """Sum of a uint64 array (read-bandwidth probe)."""
    s = np.uint64(0)
    for i in range(words.size):
        s += words[i]
    return s


# --- the record walk ----------------------------------------------------------------------------
@njit(cache=True, nogil=True, boundscheck=False)
def _has_delay(buf, s, n, pat):
    m = pat.size
    for i in range(s, s + n - m + 1):
        ok = True
        for j in range(m):
            if buf[i + j] != pat[j]:
                ok = False
                break
        if ok:
            return True
    return False


@njit(cache=True, nogil=True, boundscheck=False)
def walk(buf, pos, size, limit, max_record_size, check_crc, crc_mode, n, max_n, byte_limit,
         c_pos, c_size, c_magic, c_crc, c_qid, c_flag, c_qoff, c_phys, c_sysflag, c_born_ts,
         c_born_addr, c_born_port, c_store_ts, c_store_addr, c_store_port, c_reconsume, c_prepared,
         c_body_len, c_body_start, c_topic_start, c_topic_len, c_props_start, c_props_len, c_crc_ok,
         seg_start, stats, t, sched, delay):
    """Walk records of ``buf[:size]`` from ``pos`` by TOTALSIZE, decoding every header field
    into the column arrays from row ``n``. Returns ``(rows, pos, code)``; see the codes above.

    ``stats``: [0] PHYSICALOFFSET != position count, [1] first such position (-1: none).
    """
    while True:
        if pos >= limit:
            return n, pos, LIMIT
        if pos >= size:
            return n, pos, SEG_END
        if n >= max_n or pos >= byte_limit:
            return n, pos, FULL
        to_end = size - pos
        if to_end < 8:
            for k in range(pos, size):
                if buf[k] != 0:
                    return n, pos, INVALID + K_TRUNCATED
            return n, pos, INVALID + K_END_OF_DATA
        total = np.int64(ld_be32(buf, pos))
        magic = np.int64(ld_be32(buf, pos + 4)) & 0xFFFFFFFF
        if magic == _MAGIC_BLANK:
            if total != to_end:
                return n, pos, INVALID + K_BAD_BLANK
            return n, pos, BLANK
        if magic != _MAGIC_V1 and magic != _MAGIC_V2:
            if total == 0 and magic == 0:
                return n, pos, INVALID + K_END_OF_DATA
            return n, pos, INVALID + K_BAD_MAGIC
        if total < _MIN_RECORD:
            return n, pos, INVALID + K_BAD_TOTALSIZE
        if total > to_end:
            return n, pos, INVALID + K_TRUNCATED
        if total > max_record_size:
            return n, pos, INVALID + K_BAD_TOTALSIZE
        sysflag = np.int64(ld_be32(buf, pos + 36))
        bh = 20 if sysflag & 0x10 else 8
        sh = 20 if sysflag & 0x20 else 8
        p = 72 + bh + sh
        if p > total:
            return n, pos, INVALID + K_LENGTH_MISMATCH
        body_len = np.int64(ld_be32(buf, pos + p - 4))
        blen = body_len if body_len > 0 else 0
        tl = 2 if magic == _MAGIC_V2 else 1
        if p + blen + tl > total:
            return n, pos, INVALID + K_LENGTH_MISMATCH
        stored_crc = np.int64(ld_be32(buf, pos + 8))
        crc_ok = 0
        if check_crc and blen > 0:
            c = crc32(buf, pos + p, pos + p + blen, t, crc_mode)
            if np.int64(c & _M32) & 0x7FFFFFFF != stored_crc:
                return n, pos, INVALID + K_BODY_CRC
            crc_ok = 1
        q = p + blen
        if tl == 1:
            topic_len = np.int64(np.int8(buf[pos + q]))
        else:
            topic_len = np.int64(ld_be16(buf, pos + q))
        q += tl
        if topic_len < 0:
            return n, pos, INVALID + K_BAD_FIELD
        if q + topic_len + 2 > total:
            return n, pos, INVALID + K_LENGTH_MISMATCH
        topic_start = pos + q
        q += topic_len
        props_len = np.int64(ld_be16(buf, pos + q))
        q += 2
        plen = props_len if props_len > 0 else 0
        if q + plen > total:
            return n, pos, INVALID + K_LENGTH_MISMATCH
        if 74 + (p - 72) + blen + tl + topic_len + plen != total:
            return n, pos, INVALID + K_LENGTH_MISMATCH
        if topic_len == sched.size and plen >= delay.size:
            same = True
            for k in range(topic_len):
                if buf[topic_start + k] != sched[k]:
                    same = False
                    break
            if same and _has_delay(buf, pos + q, plen, delay):
                return n, pos, DEFER
        # a valid message: store its columns
        phys = ld_be64(buf, pos + 28)
        if phys != seg_start + pos:
            if stats[0] == 0:
                stats[1] = pos
            stats[0] += 1
        un = np.uint64(n)  # unsigned index: no negative-index wraparound code
        c_pos[un] = pos
        c_size[un] = total
        c_magic[un] = magic
        c_crc[un] = stored_crc
        c_qid[un] = ld_be32(buf, pos + 12)
        c_flag[un] = ld_be32(buf, pos + 16)
        c_qoff[un] = ld_be64(buf, pos + 20)
        c_phys[un] = phys
        c_sysflag[un] = sysflag
        c_born_ts[un] = ld_be64(buf, pos + 40)
        if bh == 8:
            c_born_addr[un, 0] = np.uint64(ld_le32(buf, pos + 48))
            c_born_addr[un, 1] = 0
        else:
            c_born_addr[un, 0] = ld_le64(buf, pos + 48)
            c_born_addr[un, 1] = ld_le64(buf, pos + 56)
        c_born_port[un] = ld_be32(buf, pos + 44 + bh)
        c_store_ts[un] = ld_be64(buf, pos + 48 + bh)
        sa = pos + 56 + bh
        if sh == 8:
            c_store_addr[un, 0] = np.uint64(ld_le32(buf, sa))
            c_store_addr[un, 1] = 0
        else:
            c_store_addr[un, 0] = ld_le64(buf, sa)
            c_store_addr[un, 1] = ld_le64(buf, sa + 8)
        c_store_port[un] = ld_be32(buf, sa + sh - 4)
        c_reconsume[un] = ld_be32(buf, sa + sh)
        c_prepared[un] = ld_be64(buf, sa + sh + 4)
        c_body_len[un] = body_len
        c_body_start[un] = pos + p
        c_topic_start[un] = topic_start
        c_topic_len[un] = topic_len
        c_props_start[un] = pos + q
        c_props_len[un] = plen
        c_crc_ok[un] = crc_ok
        n += 1
        pos += total
