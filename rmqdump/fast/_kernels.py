"""Compiled (numba) kernels behind :mod:`rmqdump.fast.walk`. Importing this module imports numba.

Only :mod:`rmqdump.fast.walk` imports it: to build the kernels' shared library once per machine
(:func:`build_shared_library`; later runs load that library with ctypes and never import
numba), or as the fallback when no C compiler can link one (the ``cache=True`` cfuncs
below, numba's own cache).

The record walk mirrors :func:`rmqdump.codec.record.decode_record` check for check, in the same order,
so that its stop verdict (position + kind) is the pure decoder's. The body CRC is CRC-32
(zlib's) computed by PCLMULQDQ folding where the CPU has it, else by a slice-by-8 table.

One module: numba compiles these kernels, their helpers and their C entry points into one shared library; the ABI lives in :mod:`rmqdump.fast.abi`.
"""

from __future__ import annotations

import os
import platform

import numba
import numpy as np
from llvmlite import ir
from numba import carray, cfunc, njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from rmqdump.codec.layout import (
    BLANK_MAGIC_CODE,
    BODY_LENGTH_BASE,
    BORN_HOST_POSITION,
    BORN_TIMESTAMP_POSITION,
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    CRC_MASK,
    HOST_V4_LENGTH,
    HOST_V6_LENGTH,
    INNER_BATCH_FLAG,
    MESSAGE_BODY_CRC_POSITION,
    MESSAGE_FIXED_OVERHEAD,
    MESSAGE_FLAG_POSITION,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_POSITION,
    MESSAGE_MAGIC_CODE_V2,
    MESSAGE_QUEUE_ID_POSITION,
    MIN_RECORD_SIZE_V1_IPV4,
    PHY_POS_POSITION,
    PROPERTY_DELAY_TIME_LEVEL,
    QUEUE_OFFSET_POSITION,
    SCHEDULE_TOPIC,
    STORE_HOST_BASE,
    STORE_TIMESTAMP_BASE,
    STOREHOSTADDRESS_V6_FLAG,
    SYSFLAG_KNOWN_BITS,
    SYSFLAG_POSITION,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.fast._link import link_shared_library, pointer_intrinsic
from rmqdump.fast._recordkernels import intern_topic, props_scan, same_bytes, topic_slot
from rmqdump.fast.abi import (  # kernel return codes and argument-block layout, shared with the numba-free caller
    A_BUF,
    A_BYTE_LIMIT,
    A_CHECK_CRC,
    A_COLUMNS,
    A_CRC_MODE,
    A_D_COLUMNS,
    A_DERIVE,
    A_IT_ARENA,
    A_IT_ARENA_SIZE,
    A_IT_CAP,
    A_IT_IDS,
    A_IT_KEYS,
    A_IT_LEN,
    A_IT_MASK,
    A_IT_OFF,
    A_IT_STATE,
    A_LIMIT,
    A_MAX_N,
    A_MAX_RECORD_SIZE,
    A_N,
    A_OUT_CODE,
    A_OUT_N,
    A_OUT_POS,
    A_POS,
    A_SEG_START,
    A_SIZE,
    A_STATS,
    ARG_BLOCK_SIZE,
    BLANK,
    CRC_CLMUL,
    CRC_TABLE,
    DEFER,
    FULL,
    INVALID,
    LIMIT,
    SEG_END,
    V_ARENA,
    V_ARENA_LEN,
    V_ARENA_OFF,
    V_ARENA_SIZE,
    V_BUF,
    V_COLUMNS,
    V_D_PV,
    V_D_TID,
    V_DERIVED,
    V_HALF_OUT,
    V_HT_IDS,
    V_HT_KEYS,
    V_HT_MASK,
    V_I0,
    V_N,
    V_OUT_CAP,
    V_OUT_CODE,
    V_OUT_I,
    V_Q_COUNT,
    V_Q_NEXT,
    V_Q_PY,
    V_QT_KEYS,
    V_QT_MASK,
    V_QT_SLOTS,
    V_QUEUE_CAP,
    V_SEG_START,
    V_SIZE,
    V_STATE,
    V_TCOUNT,
    V_TFLAGS,
    V_TOPIC_CAP,
    V_TX_OUT,
    V_WMAP,
    V_WMAP_CAP,
)

K_END_OF_DATA, K_BAD_MAGIC, K_BAD_TOTALSIZE, K_TRUNCATED = 0, 1, 2, 3
K_LENGTH_MISMATCH, K_BODY_CRC, K_BAD_FIELD, K_BAD_BLANK = 4, 5, 6, 7

# the record layout, from codec/layout.py (numba freezes these module globals as constants)
_MAGIC_V1 = MESSAGE_MAGIC_CODE
_MAGIC_V2 = MESSAGE_MAGIC_CODE_V2
_MAGIC_BLANK = BLANK_MAGIC_CODE
_MIN_RECORD = MIN_RECORD_SIZE_V1_IPV4
_BODY_BASE = BODY_LENGTH_BASE + 4  # + bh + sh: where the body starts
_V6_BORN = BORNHOST_V6_FLAG
_V6_STORE = STOREHOSTADDRESS_V6_FLAG
_H4, _H6 = HOST_V4_LENGTH, HOST_V6_LENGTH
_TX_MASK, _TX_PREPARED = TRANSACTION_TYPE_MASK, TRANSACTION_PREPARED_TYPE
_TX_COMMIT, _TX_ROLLBACK = TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE
_SCHEDULE = np.frombuffer(SCHEDULE_TOPIC.encode(), dtype=np.uint8).copy()
_DELAY = np.frombuffer(PROPERTY_DELAY_TIME_LEVEL.encode(), dtype=np.uint8).copy()


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


@intrinsic
def prefetch(typingctx, arr, idx):
    """A read prefetch of ``arr[idx]`` into every cache level (a hint: never faults)."""
    sig = types.void(arr, types.int64)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(8).as_pointer())
        i32 = ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(
            ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]))
        builder.call(fn, [ptr, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

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

# Folding constants for the reflected CRC-32 polynomial (the method of Intel's "Fast CRC Computation
# for Generic Polynomials Using PCLMULQDQ"), derived by :func:`fold_constant` (tests check them):
# a 128-bit lane (lo, hi) moved forward by D bytes is clmul(lo, x^(8D+32)) ^ clmul(hi, x^(8D-32)).
_FOLD_128 = (0x1E88EF372, 0x14A7FE880)  # D = 128: eight lanes per loop step
_FOLD_64 = (0x154442BD4, 0x1C6E41596)  # D = 64: four lanes
_FOLD_32 = (0x0F1DA05AA, 0x15A546366)  # D = 32: four lanes -> two
_FOLD_16 = (0x1751997D0, 0x0CCAA009E)  # D = 16: two lanes -> one, then 16-byte blocks
_K3 = np.uint64(_FOLD_16[0])
_K4 = np.uint64(_FOLD_16[1])  # also x^96: 128 -> 96 bits
_K5 = np.uint64(0x163CD6124)  # x^64: 96 -> 64 bits
_P = np.uint64(0x1DB710641)  # P(x)' (Barrett)
_U = np.uint64(0x1F7011641)  # u' (Barrett)
_M32 = np.uint64(0xFFFFFFFF)
_S8 = np.uint64(8)
_S32 = np.uint64(32)
_FF = np.uint64(0xFF)
_FOLD_PREFETCH = 1024  # bytes the eight-lane loop prefetches ahead (as ISA-L)


def fold_constant(n: int) -> int:
    """x^n mod P(x) for CRC-32's P = 0x104C11DB7, bit-reflected and shifted left by one (the
    33-bit operand form PCLMULQDQ folding uses for the reflected CRC)."""
    r = 1
    for _ in range(n):
        r <<= 1
        if r >> 32:
            r ^= 0x104C11DB7
    return int(f"{r:032b}"[::-1], 2) << 1


@njit(cache=True, nogil=True, boundscheck=False)
def _fold_soft(buf, s, e, c):
    """:func:`clmul_fold` where PCLMULQDQ is missing: one lane, scalar carry-less multiplies."""
    a = ld_le64(buf, s) ^ c
    b = ld_le64(buf, s + 8)
    p = s + 16
    while p + 16 <= e:
        x0, y0 = clmul(a, _K3)
        x1, y1 = clmul(b, _K4)
        a = x0 ^ x1 ^ ld_le64(buf, p)
        b = y0 ^ y1 ^ ld_le64(buf, p + 8)
        p += 16
    return a, b, p


def _fold_ir(context, builder, aryty, ary_val, s, e, c):
    """LLVM IR of :func:`clmul_fold`: the lanes stay in xmm registers (<2 x i64>), two PCLMULQDQ
    (imm 0x00 and 0x11 against (k_lo, k_hi)) and an xor with the next 16 bytes per lane and step."""
    i8, i32, i64 = ir.IntType(8), ir.IntType(32), ir.IntType(64)
    v2 = ir.VectorType(i64, 2)
    base = context.make_array(aryty)(context, builder, ary_val).data
    pclmul = builder.module.declare_intrinsic("llvm.x86.pclmulqdq", fnty=ir.FunctionType(v2, [v2, v2, i8]))
    pfetch = builder.module.declare_intrinsic("llvm.prefetch", fnty=ir.FunctionType(
        ir.VoidType(), [ir.IntType(8).as_pointer(), i32, i32, i32]))
    k128, k64, k32, k16 = (ir.Constant(v2, [ir.Constant(i64, lo), ir.Constant(i64, hi)])
                           for lo, hi in (_FOLD_128, _FOLD_64, _FOLD_32, _FOLD_16))

    def at(pos, off):
        return builder.gep(base, [builder.add(pos, ir.Constant(i64, off))])

    def load(pos, off):
        return builder.load(builder.bitcast(at(pos, off), v2.as_pointer()), align=1)

    def fold(x, k, d):
        lo = builder.call(pclmul, [x, k, ir.Constant(i8, 0x00)])
        hi = builder.call(pclmul, [x, k, ir.Constant(i8, 0x11)])
        return builder.xor(builder.xor(lo, hi), d)

    def fold_lanes(n, k, src):  # lanes[i] = fold(lanes[i], k, src(i)), i < n
        for i in range(n):
            builder.store(fold(builder.load(lanes[i]), k, src(i)), lanes[i])

    def loop(step, body):  # while p + step <= e: body(p); p += step
        cond, blk, end = (builder.append_basic_block(f"crcfold.{n}") for n in ("cond", "body", "end"))
        builder.branch(cond)
        builder.position_at_end(cond)
        p = builder.load(pv)
        builder.cbranch(builder.icmp_signed("<=", builder.add(p, ir.Constant(i64, step)), e), blk, end)
        builder.position_at_end(blk)
        body(p)
        builder.store(builder.add(p, ir.Constant(i64, step)), pv)
        builder.branch(cond)
        builder.position_at_end(end)

    def step128(p):
        for off in (_FOLD_PREFETCH, _FOLD_PREFETCH + 64):  # a hint: never faults past the end
            builder.call(pfetch, [at(p, off), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        fold_lanes(8, k128, lambda i: load(p, 16 * i))

    pv = cgutils.alloca_once(builder, i64)
    lanes = [cgutils.alloca_once(builder, v2) for _ in range(8)]
    seed = builder.insert_element(ir.Constant(v2, None), c, ir.Constant(i32, 0))
    with builder.if_else(builder.icmp_signed(">=", builder.sub(e, s), ir.Constant(i64, 128))) as (wide, narrow):
        for n, branch in ((8, wide), (4, narrow)):
            with branch:
                for i in range(n):
                    builder.store(builder.xor(load(s, 0), seed) if i == 0 else load(s, 16 * i), lanes[i])
                builder.store(builder.add(s, ir.Constant(i64, 16 * n)), pv)
                if n == 8:
                    loop(128, step128)
                    fold_lanes(4, k64, lambda i: builder.load(lanes[i + 4]))  # 8 lanes -> 4
    loop(64, lambda p: fold_lanes(4, k64, lambda i: load(p, 16 * i)))
    fold_lanes(2, k32, lambda i: builder.load(lanes[i + 2]))  # 4 lanes -> 2
    fold_lanes(1, k16, lambda i: builder.load(lanes[1]))  # 2 lanes -> 1
    loop(16, lambda p: fold_lanes(1, k16, lambda i: load(p, 0)))
    w = builder.load(lanes[0])
    return [builder.extract_element(w, ir.Constant(i32, 0)), builder.extract_element(w, ir.Constant(i32, 1)),
            builder.load(pv)]


@intrinsic
def clmul_fold(typingctx, buf, s, e, c):
    """Fold ``buf[s:e]`` (``e - s >= 64``; ``c`` the pre-inverted CRC state, xored into the first
    bytes) into one 128-bit remainder -> (low, high, p): every whole 16-byte block up to ``p`` is
    consumed, ``buf[p:e]`` (< 16 bytes) is not. Eight lanes of 128 bits per 128-byte step (eight
    independent PCLMULQDQ chains hide its latency), then 4, 2, 1 lanes."""
    sig = types.Tuple((types.uint64, types.uint64, types.int64))(buf, types.int64, types.int64, types.uint64)

    def codegen(context, builder, signature, args):
        if not HAVE_CLMUL:
            return context.compile_internal(builder, _fold_soft.py_func, signature, args)
        return context.make_tuple(builder, signature.return_type, _fold_ir(context, builder, signature.args[0], *args))

    return sig, codegen


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
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


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def crc_reduce(a, b):
    """The (pre-inverted) CRC state of the 128-bit remainder (a low, b high) of a fold."""
    x0, y0 = clmul(a, _K4)  # 128 -> 96 bits (adds 32 zero bits), 96 -> 64, then Barrett 64 -> 32
    lo = b ^ x0
    t2 = (lo >> _S32) | (y0 << _S32)
    x0, y0 = clmul(lo & _M32, _K5)
    lo = x0 ^ t2
    q, _ = clmul(lo & _M32, _U)
    q, _ = clmul(q & _M32, _P)
    return ((lo ^ q) >> _S32) & _M32


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def crc_update_clmul(c, buf, s, e, t):
    """Continue the (pre-inverted) CRC state ``c`` over ``buf[s:e]``: PCLMULQDQ folding of the
    whole 16-byte blocks (:func:`clmul_fold`, from 64 bytes on), Barrett reduction, table for the tail."""
    p = s
    if e - s >= 64:
        a, b, p = clmul_fold(buf, s, e, c)
        c = crc_reduce(a, b)
    return crc_update_table(c, buf, p, e, t)


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
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


_WALK_AHEAD = 4096  # bytes the walk prefetches ahead of its position

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
         seg_start, stats, t, sched, delay, derive, d_tid, d_pv, d_tags, it_keys, it_ids, it_mask, it_arena,
         it_off, it_len, it_cap, it_state):
    """Walk records of ``buf[:size]`` from ``pos`` by TOTALSIZE, decoding every header field
    into the column arrays from row ``n``. Returns ``(rows, pos, code)``; see the codes above.

    ``stats``: [0] PHYSICALOFFSET != position count, [1] first such position (-1: none).
    ``derive``: also fill the derived columns (``abi.DERIVED_COLUMNS``; ``it_*``: the topic table).
    """
    prev_wt = np.int64(-1)
    pf = pos + _WALK_AHEAD  # prefetched up to here: the walk's loads depend on each other (TOTALSIZE)
    pf_end = min(size, limit)
    while True:
        ahead = min(pos + _WALK_AHEAD, pf_end)
        while pf < ahead:
            prefetch(buf, pf)
            pf += 64
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
        magic = np.int64(ld_be32(buf, pos + MESSAGE_MAGIC_CODE_POSITION)) & 0xFFFFFFFF
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
        sysflag = np.int64(ld_be32(buf, pos + SYSFLAG_POSITION))
        bh = _H6 if sysflag & _V6_BORN else _H4
        sh = _H6 if sysflag & _V6_STORE else _H4
        p = _BODY_BASE + bh + sh
        if p > total:
            return n, pos, INVALID + K_LENGTH_MISMATCH
        body_len = np.int64(ld_be32(buf, pos + p - 4))
        blen = body_len if body_len > 0 else 0
        tl = 2 if magic == _MAGIC_V2 else 1
        if p + blen + tl > total:
            return n, pos, INVALID + K_LENGTH_MISMATCH
        stored_crc = np.int64(ld_be32(buf, pos + MESSAGE_BODY_CRC_POSITION))
        crc_ok = 0
        if check_crc and blen > 0:
            c = crc32(buf, pos + p, pos + p + blen, t, crc_mode)
            if np.int64(c & _M32) & CRC_MASK != stored_crc:
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
        if MESSAGE_FIXED_OVERHEAD + (p - _BODY_BASE) + blen + tl + topic_len + plen != total:
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
        phys = ld_be64(buf, pos + PHY_POS_POSITION)
        if phys != seg_start + pos:
            if stats[0] == 0:
                stats[1] = pos
            stats[0] += 1
        un = np.uint64(n)  # unsigned index: no negative-index wraparound code
        c_pos[un] = pos
        c_size[un] = total
        c_magic[un] = magic
        c_crc[un] = stored_crc
        c_qid[un] = ld_be32(buf, pos + MESSAGE_QUEUE_ID_POSITION)
        c_flag[un] = ld_be32(buf, pos + MESSAGE_FLAG_POSITION)
        c_qoff[un] = ld_be64(buf, pos + QUEUE_OFFSET_POSITION)
        c_phys[un] = phys
        c_sysflag[un] = sysflag
        c_born_ts[un] = ld_be64(buf, pos + BORN_TIMESTAMP_POSITION)
        ba = pos + BORN_HOST_POSITION
        if bh == _H4:
            c_born_addr[un, 0] = np.uint64(ld_le32(buf, ba))
            c_born_addr[un, 1] = 0
        else:
            c_born_addr[un, 0] = ld_le64(buf, ba)
            c_born_addr[un, 1] = ld_le64(buf, ba + 8)
        c_born_port[un] = ld_be32(buf, ba + bh - 4)
        c_store_ts[un] = ld_be64(buf, pos + STORE_TIMESTAMP_BASE + bh)
        sa = pos + STORE_HOST_BASE + bh
        if sh == _H4:
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
        if derive:  # while the record's bytes are in the cache
            wt = np.int64(-1)
            if prev_wt >= 0 and it_len[prev_wt] == topic_len and same_bytes(it_arena, it_off[prev_wt], buf,
                                                                           topic_start, topic_len):
                wt = prev_wt  # the previous record's topic: the common case
            if wt < 0:
                wt = intern_topic(buf, topic_start, topic_len, it_keys, it_ids, it_mask, it_arena, it_off, it_len,
                                  it_cap, it_state)
            prev_wt = wt
            d_tid[un] = prev_wt
            pv, tg = props_scan(buf, pos + q, plen)
            d_pv[un] = pv
            d_tags[un] = tg
        n += 1
        pos += total


# --- verify: per-record checks over a walked batch (see rmqdump.analysis.verify.records) ------------------
_QHASH = np.uint64(0x9E3779B97F4A7C15)
_TS_LO, _TS_HI, _HOUR = 946684800000, 4102444800000, 3600000
_AHEAD = 8  # rows vscan prefetches ahead


@njit(cache=True, nogil=True, boundscheck=False)
def vscan(buf, i0, n, seg_start, c_pos, c_size, c_crc, c_qid, c_qoff, c_phys, c_sysflag, c_born_ts, c_born_port,
          c_store_ts, c_store_addr, c_store_port, c_reconsume, c_prepared, c_body_len, c_topic_start, c_topic_len,
          c_props_start, c_props_len, ht_keys, ht_ids, ht_mask, arena, arena_off, arena_len, tflags, tcount,
          qt_keys, qt_slots, qt_mask, q_next, q_count, q_py, state, tx_out, half_out, derived, d_tid, d_pv, wmap):
    """Verify rows ``i0..n`` of a batch: every record whose checks could report anything (or
    that needs Python: a new topic or queue, a queue anomaly, a header-outlier candidate) stops
    the loop; the others only update the compact state. Returns ``(row, code)``: code 0 all
    done, 1 row's topic is not in the table yet, 2 row must be checked in Python. ``derived``: the walk's
    ``d_tid``/``d_pv`` columns stand for the topic and property bytes (``wmap``: walk topic -> topic id)."""
    last_tid = np.int64(-1)
    for i in range(i0, n):
        if not derived and i + _AHEAD < n:  # the topic and properties of a record a few rows on: they left the cache
            prefetch(buf, c_topic_start[i + _AHEAD])
        pos = c_pos[i]
        off = seg_start + pos
        # topic id: the previous record's topic (the common case), else the hash table
        ts = c_topic_start[i]
        tl = np.int64(c_topic_len[i])
        tid = np.int64(-1)
        wt = np.int64(d_tid[i]) if derived else np.int64(-1)
        if wt >= 0:
            tid = np.int64(wmap[wt])
        if tid < 0 and last_tid >= 0 and arena_len[last_tid] == tl and same_bytes(arena, arena_off[last_tid], buf,
                                                                                   ts, tl):
            tid = last_tid
        if tid < 0:
            tid = topic_slot(buf, ts, tl, ht_keys, ht_ids, ht_mask, arena, arena_off, arena_len)[0]
        if tid < 0:
            return i, 1
        if wt >= 0:
            wmap[wt] = tid
        last_tid = tid
        tf = tflags[tid]
        if tf & 1 or c_phys[i] != off or pos == 0:
            return i, 2
        sf = np.int64(c_sysflag[i])
        if sf & ~np.int64(SYSFLAG_KNOWN_BITS):
            return i, 2
        blen = np.int64(c_body_len[i])
        if sf & COMPRESSED_FLAG and blen > 0:
            return i, 2
        # properties: the shape check of analysis.verify.record_checks._PROPS_OK, UTF-8, __CRC32#, INNER_NUM
        pv = np.int64(d_pv[i]) if derived else props_scan(buf, c_props_start[i], np.int64(c_props_len[i]))[0]
        if pv < 0:
            return i, 2
        inner = pv == 1
        tx = sf & _TX_MASK
        qoff = c_qoff[i]
        prepared = c_prepared[i]
        qslot = -1
        if tx == 0 or tx == _TX_COMMIT:
            if sf & INNER_BATCH_FLAG and inner:
                return i, 2
            key = (np.uint64(tid) << np.uint64(32)) | (np.uint64(np.int64(c_qid[i])) & np.uint64(0xFFFFFFFF))
            qs = np.int64(((key * _QHASH) >> np.uint64(32)) & np.uint64(qt_mask))
            while True:
                cs = qt_slots[qs]
                if cs < 0:
                    break
                if qt_keys[qs] == np.int64(key):
                    qslot = np.int64(cs)
                    break
                qs = (qs + 1) & qt_mask
            if qslot < 0 or q_py[qslot] != 0 or qoff != q_next[qslot] or qoff == 0x7FFFFFFFFFFFFFFF:
                return i, 2
            if tx == 0 and prepared != 0:
                return i, 2
        elif qoff != 0:
            return i, 2
        st_ts = c_store_ts[i]
        born_ts = c_born_ts[i]
        if st_ts < _TS_LO or st_ts > _TS_HI or born_ts < _TS_LO or born_ts > _TS_HI:
            return i, 2
        bp = c_born_port[i]
        sp = np.int64(c_store_port[i])
        if bp < 0 or bp > 65535 or sp < 0 or sp > 65535:
            return i, 2
        alen = _H6 - 4 if sf & _V6_STORE else _H4 - 4
        w0 = np.int64(c_store_addr[i, 0])
        w1 = np.int64(c_store_addr[i, 1])
        if state[5] != 0:
            return i, 2
        if state[0] != 0:
            if tx != _TX_COMMIT:
                pt = state[4]
                if pt < _TS_LO or pt > _TS_HI:
                    return i, 2
                d = st_ts - pt
                if d >= _HOUR or d <= -_HOUR:
                    return i, 2
        if blen <= 0 and c_crc[i] != 0:
            return i, 2
        if c_qid[i] < 0 or c_reconsume[i] < 0:
            return i, 2
        # nothing to report: update the state
        if qslot >= 0:
            q_next[qslot] = qoff + 1
            q_count[qslot] += 1
            if tx == _TX_COMMIT:
                m = state[11]
                tx_out[m, 0] = off
                tx_out[m, 1] = pos
                tx_out[m, 2] = prepared
                tx_out[m, 3] = tx
                state[11] = m + 1
            if tf & 2:
                half_out[state[12]] = off
                state[12] += 1
        elif tx == _TX_PREPARED:  # PREPARED (4.x store API): a COMMIT/ROLLBACK may point at it
            half_out[state[12]] = off
            state[12] += 1
        elif tx == _TX_ROLLBACK:
            m = state[11]
            tx_out[m, 0] = off
            tx_out[m, 1] = pos
            tx_out[m, 2] = prepared
            tx_out[m, 3] = tx
            state[11] = m + 1
        state[0] = alen
        state[1] = w0
        state[2] = w1
        state[3] = sp
        if tx != _TX_COMMIT:
            state[4] = st_ts
        if state[6] == 0:
            state[6] = 1
            state[7] = st_ts
            state[8] = st_ts
        else:
            if st_ts < state[7]:
                state[7] = st_ts
            if st_ts > state[8]:
                state[8] = st_ts
        state[9] += c_size[i]
        state[10] = off
        tcount[tid] += 1
    return n, 0


# --- C entry points: one int64 argument block each (see abi.ARG_BLOCK) -------------------------
_PTR = {name: pointer_intrinsic(getattr(types, name))
        for name in ("uint8", "int8", "int32", "uint32", "int64", "uint64")}
_p_u8, _p_i8, _p_i32 = _PTR["uint8"], _PTR["int8"], _PTR["int32"]
_p_u32, _p_i64, _p_u64 = _PTR["uint32"], _PTR["int64"], _PTR["uint64"]


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def walk_c(a):
    """``walk`` over raw pointers: ``a`` is the argument block (abi.A_*: inputs, column
    pointers, outputs)."""
    cap = a[A_MAX_N]
    c = A_COLUMNS
    buf = carray(_p_u8(a[A_BUF]), (a[A_SIZE],))
    derive = a[A_DERIVE] != 0
    dn = cap if derive else 0
    d = A_D_COLUMNS
    itc = a[A_IT_CAP] if derive else 0
    ith = a[A_IT_MASK] + 1 if derive else 0
    itb = a[A_IT_ARENA_SIZE] if derive else 0
    its = 2 if derive else 0
    n, pos, code = walk(
        buf, a[A_POS], a[A_SIZE], a[A_LIMIT], a[A_MAX_RECORD_SIZE], a[A_CHECK_CRC] != 0, a[A_CRC_MODE], a[A_N],
        cap, a[A_BYTE_LIMIT],
        carray(_p_i64(a[c + 0]), (cap,)), carray(_p_i32(a[c + 1]), (cap,)), carray(_p_u32(a[c + 2]), (cap,)),
        carray(_p_i32(a[c + 3]), (cap,)), carray(_p_i32(a[c + 4]), (cap,)), carray(_p_i32(a[c + 5]), (cap,)),
        carray(_p_i64(a[c + 6]), (cap,)), carray(_p_i64(a[c + 7]), (cap,)), carray(_p_i32(a[c + 8]), (cap,)),
        carray(_p_i64(a[c + 9]), (cap,)), carray(_p_u64(a[c + 10]), (cap, 2)), carray(_p_i32(a[c + 11]), (cap,)),
        carray(_p_i64(a[c + 12]), (cap,)), carray(_p_u64(a[c + 13]), (cap, 2)), carray(_p_i32(a[c + 14]), (cap,)),
        carray(_p_i32(a[c + 15]), (cap,)), carray(_p_i64(a[c + 16]), (cap,)), carray(_p_i32(a[c + 17]), (cap,)),
        carray(_p_i64(a[c + 18]), (cap,)), carray(_p_i64(a[c + 19]), (cap,)), carray(_p_i32(a[c + 20]), (cap,)),
        carray(_p_i64(a[c + 21]), (cap,)), carray(_p_i32(a[c + 22]), (cap,)), carray(_p_i8(a[c + 23]), (cap,)),
        a[A_SEG_START], carray(_p_i64(a[A_STATS]), (2,)), CRC_TABLES, _SCHEDULE, _DELAY, derive,
        carray(_p_i32(a[d + 0]), (dn,)), carray(_p_i8(a[d + 1]), (dn,)), carray(_p_i64(a[d + 2]), (dn,)),
        carray(_p_u64(a[A_IT_KEYS]), (ith,)), carray(_p_i32(a[A_IT_IDS]), (ith,)), a[A_IT_MASK],
        carray(_p_u8(a[A_IT_ARENA]), (itb,)), carray(_p_i64(a[A_IT_OFF]), (itc,)),
        carray(_p_i64(a[A_IT_LEN]), (itc,)), itc, carray(_p_i64(a[A_IT_STATE]), (its,)))
    a[A_OUT_N] = n
    a[A_OUT_POS] = pos
    a[A_OUT_CODE] = code


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def vscan_c(a):
    """``vscan`` over raw pointers: ``a`` is the argument block (abi.V_*)."""
    n = a[V_N]
    c = V_COLUMNS
    nt = a[V_TOPIC_CAP]
    nq = a[V_QUEUE_CAP]
    cap = a[V_OUT_CAP]
    derived = a[V_DERIVED] != 0
    dn = n if derived else 0
    wn = a[V_WMAP_CAP] if derived else 0
    i, code = vscan(
        carray(_p_u8(a[V_BUF]), (a[V_SIZE],)), a[V_I0], n, a[V_SEG_START],
        carray(_p_i64(a[c + 0]), (n,)), carray(_p_i32(a[c + 1]), (n,)), carray(_p_i32(a[c + 2]), (n,)),
        carray(_p_i32(a[c + 3]), (n,)), carray(_p_i64(a[c + 4]), (n,)), carray(_p_i64(a[c + 5]), (n,)),
        carray(_p_i32(a[c + 6]), (n,)), carray(_p_i64(a[c + 7]), (n,)), carray(_p_i32(a[c + 8]), (n,)),
        carray(_p_i64(a[c + 9]), (n,)), carray(_p_u64(a[c + 10]), (n, 2)), carray(_p_i32(a[c + 11]), (n,)),
        carray(_p_i32(a[c + 12]), (n,)), carray(_p_i64(a[c + 13]), (n,)), carray(_p_i32(a[c + 14]), (n,)),
        carray(_p_i64(a[c + 15]), (n,)), carray(_p_i32(a[c + 16]), (n,)), carray(_p_i64(a[c + 17]), (n,)),
        carray(_p_i32(a[c + 18]), (n,)),
        carray(_p_u64(a[V_HT_KEYS]), (a[V_HT_MASK] + 1,)), carray(_p_i32(a[V_HT_IDS]), (a[V_HT_MASK] + 1,)),
        a[V_HT_MASK], carray(_p_u8(a[V_ARENA]), (a[V_ARENA_SIZE],)), carray(_p_i64(a[V_ARENA_OFF]), (nt,)),
        carray(_p_i64(a[V_ARENA_LEN]), (nt,)), carray(_p_i32(a[V_TFLAGS]), (nt,)), carray(_p_i64(a[V_TCOUNT]), (nt,)),
        carray(_p_i64(a[V_QT_KEYS]), (a[V_QT_MASK] + 1,)), carray(_p_i32(a[V_QT_SLOTS]), (a[V_QT_MASK] + 1,)),
        a[V_QT_MASK], carray(_p_i64(a[V_Q_NEXT]), (nq,)), carray(_p_i64(a[V_Q_COUNT]), (nq,)),
        carray(_p_i8(a[V_Q_PY]), (nq,)), carray(_p_i64(a[V_STATE]), (16,)), carray(_p_i64(a[V_TX_OUT]), (cap, 4)),
        carray(_p_i64(a[V_HALF_OUT]), (cap,)), derived, carray(_p_i32(a[V_D_TID]), (dn,)),
        carray(_p_i8(a[V_D_PV]), (dn,)), carray(_p_i32(a[V_WMAP]), (wn,)))
    a[V_OUT_I] = i
    a[V_OUT_CODE] = code


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def crc32_c(a):
    """a[0] data pointer, a[1] length, a[2] mode (-1: this build's best) -> a[3] zlib.crc32."""
    mode = a[2]
    if mode < 0:
        mode = CRC_CLMUL if HAVE_CLMUL else CRC_TABLE
    a[3] = np.int64(crc32(carray(_p_u8(a[0]), (a[1],)), 0, a[1], CRC_TABLES, mode))


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def info_c(a):
    """a[0] <- 1 if this build folds CRCs with PCLMULQDQ, a[1] <- the ARG_BLOCK size it expects."""
    a[0] = 1 if HAVE_CLMUL else 0
    a[1] = ARG_BLOCK_SIZE


ENTRY_POINTS = {"rmqdump_walk": walk_c, "rmqdump_crc32": crc32_c, "rmqdump_info": info_c,
                "rmqdump_vscan": vscan_c}

# numba runtime helpers the cfunc wrappers reference on their error paths. The kernels never
# take those paths (no allocation, no exceptions), but a shared library must resolve every
# symbol: these stand-ins (which abort) make a library that loads without numba.
def build_shared_library(path: str, cc: str = "cc") -> None:
    """Link the entry points into ``path`` (see :mod:`rmqdump.fast._link`; run with an empty numba
    cache, as :func:`rmqdump.fast.walk.backend` does)."""
    link_shared_library(ENTRY_POINTS, path, cc, "kernels")


if __name__ == "__main__":  # python -m rmqdump.fast._kernels OUTPUT.so [CC]
    import sys

    build_shared_library(sys.argv[1], *(sys.argv[2:3] or ["cc"]))
