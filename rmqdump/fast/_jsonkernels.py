"""Compiled (numba) renderers behind :mod:`rmqdump.fast.render`. Importing this module imports numba.

Two entry points over the columns of a :class:`rmqdump.fast.walk.RecordBatch`:

* ``rmqdump_jsonl``: scan's JSONL lines (``json.dumps(row, ensure_ascii=False)`` of
  :func:`rmqdump.rows.bodyfmt.message_to_row`), byte for byte, into a caller's buffer;
* ``rmqdump_columns``: the derived Arrow columns of :mod:`rmqdump.rows.arrow` (properties map,
  keys list, tags, uniq_key, tags_code, hosts, msg_id, topic) as offsets + data buffers.

Both render only what they can render identically to the pure path: a record with IPv6 hosts,
topic/properties (or a text body) that are not valid UTF-8, the delay topic
(``SCHEDULE_TOPIC_XXXX``), or a compressed body to decompress is handed back to Python
(``FALLBACK``). Valid UTF-8 decodes to the same text with Java's replacing decoder, so the
bytes are copied as they are (JSON escapes added). Built like :mod:`rmqdump.fast._kernels`:
once per machine into a shared library loaded with ctypes (``python -m rmqdump.fast._jsonkernels
OUT.so [CC]``), or numba's JIT cache when no C compiler links one.

One module: numba compiles these kernels, their helpers and their C entry points into one shared library; the ABI lives in :mod:`rmqdump.fast.abi`.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, cfunc, njit, types
from numba.extending import intrinsic

from rmqdump.codec.layout import (
    COMPRESSED_FLAG,
    COMPRESSION_TYPE_COMPARATOR,
    MESSAGE_MAGIC_CODE_V2,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.fast._link import link_shared_library, pointer_intrinsic
from rmqdump.fast.abi import (
    B_BUF,
    B_COLS,
    B_DECOMPRESS,
    B_FILE,
    B_FILE_LEN,
    B_I0,
    B_LIMIT,
    B_MODE,
    B_N,
    B_OUT,
    B_OUT_CAP,
    B_OUT_CODE,
    B_OUT_EMITTED,
    B_OUT_LEN,
    B_OUT_NEXT,
    B_SCRATCH,
    B_SCRATCH_CAP,
    B_SEG_START,
    B_SELECT,
    B_SIZE,
    B_TAIL,
    B_TAIL_LEN,
    BLOCK_SIZE,
    C_BORN_H,
    C_ENTRIES,
    C_FLAGS,
    C_KEY_DATA,
    C_KEY_OFF,
    C_KEYS,
    C_MSGID,
    C_N,
    C_NAME_DATA,
    C_NAME_OFF,
    C_OUT_ENTRIES,
    C_OUT_KEYS,
    C_STORE_H,
    C_TAGCODE,
    C_TAGS,
    C_TOPIC,
    C_UNIQ,
    C_VALID,
    C_VALUE_DATA,
    C_VALUE_OFF,
    CODE_DONE,
    CODE_FALLBACK,
    CODE_FULL,
    MODE_BASE64,
    MODE_HEX,
    MODE_NONE,
    MODE_TEXT,
)

_SCHEDULE = np.frombuffer(b"SCHEDULE_TOPIC_XXXX", dtype=np.uint8).copy()
_TAGS = np.frombuffer(b"TAGS", dtype=np.uint8).copy()
_KEYS = np.frombuffer(b"KEYS", dtype=np.uint8).copy()
_UNIQ = np.frombuffer(b"UNIQ_KEY", dtype=np.uint8).copy()
_B64 = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", dtype=np.uint8).copy()
_B64I = [int(c) for c in _B64]
# 12 input bits -> their two base64 characters (first in the low byte)
_B64PAIR = np.array([_B64I[i >> 6] | (_B64I[i & 63] << 8) for i in range(4096)], dtype=np.uint32)
_B64PAIR64 = _B64PAIR.astype(np.uint64)
# a byte -> its two lower-case hex digits (first in the low byte)
_HEXPAIR = np.array([ord("0123456789abcdef"[i >> 4]) | (ord("0123456789abcdef"[i & 15]) << 8) for i in range(256)],
                    dtype=np.uint64)
_DIGITS2 = np.frombuffer(b"".join(b"%02d" % i for i in range(100)), dtype=np.uint8).copy()
_POW10 = np.array([10 ** i for i in range(20)], dtype=np.uint64)
_HEXL = np.frombuffer(b"0123456789abcdef", dtype=np.uint8).copy()
_HEXU = np.frombuffer(b"0123456789ABCDEF", dtype=np.uint8).copy()
_V2 = np.uint32(MESSAGE_MAGIC_CODE_V2)


def _lits(*parts: str) -> tuple[np.ndarray, np.ndarray]:
    """Literal byte strings as one array + offsets (numba freezes global arrays as constants),
    padded by 8 bytes for :func:`_copy8`."""
    data = b"".join(p.encode() for p in parts) + bytes(8)
    offs = np.zeros(len(parts) + 1, dtype=np.int64)
    offs[1:] = np.cumsum([len(p.encode()) for p in parts])
    return np.frombuffer(data, dtype=np.uint8).copy(), offs


# JSONL keys, in FIELDS order, each with the separator before its value
_KEYTEXT, _KEYOFF = _lits(
    '{"offset": ', ', "file": ', ', "file_pos": ', ', "size": ', ', "magic": ', ', "body_crc": ', ', "queue_id": ',
    ', "flag": ', ', "queue_offset": ', ', "physical_offset": ', ', "sys_flag": ', ', "transaction": ',
    ', "compression": ', ', "born_timestamp": ', ', "born_host": ', ', "store_timestamp": ', ', "store_host": ',
    ', "reconsume_times": ', ', "prepared_transaction_offset": ', ', "topic": ', ', "properties": ', ', "keys": ',
    ', "tags": ', ', "uniq_key": ', ', "msg_id": ', ', "tags_code": ', ', "body_length": ', ', "body": ', "}\n",
)
# "v1" "v2" | transaction names by (sysflag & 0xC) >> 2 | compression: none zlib lz4 zstd unknown | null
_NAMES, _NAMEOFF = _lits('"v1"', '"v2"', '"none"', '"prepared"', '"commit"', '"rollback"', '"none"', '"zlib"',
                         '"lz4"', '"zstd"', '"unknown"', "null", ", ", ": ", "[]", "{}", "true",
                         ', "store_time": ', '+00:00"', "}\n")
N_V1, N_TX, N_COMP, N_NULL, N_COMMA, N_COLON = 0, 2, 6, 11, 12, 13
N_TRUE, N_STORE_TIME, N_UTC, N_END = 16, 17, 18, 19
_MAX_TS_MS = 253402300799999  # 9999-12-31T23:59:59.999Z: export's store_time is null past it (and before 1970)
K_TAGS_CODE = 25


PREFETCH_AHEAD = 16  # rows: the fields of a row lie in a different cache line (and page) than the last's


@intrinsic
def _prefetch(typingctx, arr, idx):
    """``llvm.prefetch`` (read, high locality) of ``arr[idx]``: a hint, never a fault."""
    sig = types.void(arr, idx)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.gep(ary.data, [args[1]])
        i8p = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
        name = "llvm.prefetch.p0i8"
        fn = builder.module.globals.get(name) or ir.Function(builder.module, fnty, name=name)
        builder.call(fn, [builder.bitcast(ptr, i8p), ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _st_u32(typingctx, arr, idx, val):
    """Store the low 32 bits of ``val`` at byte ``idx`` of a uint8 array (unaligned, native order)."""
    sig = types.void(arr, idx, val)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(32).as_pointer())
        v = args[2]
        if v.type.width > 32:
            v = builder.trunc(v, ir.IntType(32))
        elif v.type.width < 32:
            v = builder.zext(v, ir.IntType(32))
        builder.store(v, ptr).align = 1
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _copy8(typingctx, dst, d, src, s):
    """Copy 8 bytes ``src[s:s+8]`` to ``dst[d:d+8]`` (unaligned uint8 arrays)."""
    sig = types.void(dst, d, src, s)

    def codegen(context, builder, signature, args):
        p64 = ir.IntType(64).as_pointer()
        da = context.make_array(signature.args[0])(context, builder, args[0])
        sa = context.make_array(signature.args[2])(context, builder, args[2])
        v = builder.load(builder.bitcast(builder.gep(sa.data, [args[3]]), p64))
        v.align = 1
        builder.store(v, builder.bitcast(builder.gep(da.data, [args[1]]), p64)).align = 1
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _st_u64(typingctx, arr, idx, val):
    """Store a uint64 at byte ``idx`` of a uint8 array (unaligned, native order)."""
    sig = types.void(arr, idx, val)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        ptr = builder.bitcast(builder.gep(ary.data, [args[1]]), ir.IntType(64).as_pointer())
        builder.store(args[2], ptr).align = 1
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _ld_be64(typingctx, arr, idx):
    """The big-endian uint64 at byte ``idx`` of a uint8 array (unaligned)."""
    sig = types.uint64(arr, idx)

    def codegen(context, builder, signature, args):
        ary = context.make_array(signature.args[0])(context, builder, args[0])
        i64 = ir.IntType(64)
        v = builder.load(builder.bitcast(builder.gep(ary.data, [args[1]]), i64.as_pointer()))
        v.align = 1
        name = "llvm.bswap.i64"
        fn = builder.module.globals.get(name) or ir.Function(builder.module, ir.FunctionType(i64, [i64]), name=name)
        return builder.call(fn, [v])

    return sig, codegen


@intrinsic
def _memcpy(typingctx, dst, d, src, s, n):
    """Copy ``src[s:s+n]`` to ``dst[d:d+n]`` (uint8 arrays, no overlap) with one ``memcpy``."""
    sig = types.void(dst, d, src, s, n)

    def codegen(context, builder, signature, args):
        from numba.core import cgutils

        da = context.make_array(signature.args[0])(context, builder, args[0])
        sa = context.make_array(signature.args[2])(context, builder, args[2])
        cgutils.raw_memcpy(builder, builder.gep(da.data, [args[1]]), builder.gep(sa.data, [args[3]]), args[4], 1)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _bits(typingctx, u):
    """The bit length of a uint64 (``64 - ctlz``; 0 for 0)."""
    sig = types.int64(u)

    def codegen(context, builder, signature, args):
        i64 = ir.IntType(64)
        name = "llvm.ctlz.i64"
        fn = builder.module.globals.get(name) or ir.Function(
            builder.module, ir.FunctionType(i64, [i64, ir.IntType(1)]), name=name)
        z = builder.call(fn, [args[0], ir.Constant(ir.IntType(1), 0)])
        return builder.sub(ir.Constant(i64, 64), z)

    return sig, codegen


@njit(cache=True, nogil=True, inline="always")
def _ahead(buf, i, n, topic_start, props_start):
    """Prefetch the topic and properties of row ``i + PREFETCH_AHEAD``."""
    j = i + PREFETCH_AHEAD
    if j < n:
        t = topic_start[j]
        if 0 <= t < buf.size:
            _prefetch(buf, t)
        p = props_start[j]
        if 0 <= p < buf.size:
            _prefetch(buf, p)


@njit(cache=True, nogil=True, inline="always")
def _lit(out, o, text, offs, k):
    """Copy literal ``k`` in 8-byte words (``text`` is padded; up to 7 bytes past the literal are
    written and later overwritten: every record's bound keeps that slack)."""
    s, e = offs[k], offs[k + 1]
    for j in range(0, e - s, 8):
        _copy8(out, o + j, text, s + j)
    return o + e - s


@njit(cache=True, nogil=True, inline="always")
def _ch(out, o, c):
    out[o] = c
    return o + 1


@njit(cache=True, nogil=True, inline="always")
def _int(out, o, v):
    """Decimal of a signed 64-bit value (as Python's repr), two digits per division."""
    if 0 <= v < 10:
        out[o] = 48 + v
        return o + 1
    if v < 0:
        out[o] = 45
        o += 1
        u = np.uint64(-(v + 1)) + np.uint64(1)
    else:
        u = np.uint64(v)
    t = (_bits(u) * 1233) >> 12  # floor(log10(u)) or one more
    n = t + 1 if u >= _POW10[t] else t
    p = o + n
    c100 = np.uint64(100)
    while u >= c100:
        q = u // c100
        r = np.int64(u - q * c100) * 2
        p -= 2
        out[p] = _DIGITS2[r]
        out[p + 1] = _DIGITS2[r + 1]
        u = q
    if u >= np.uint64(10):
        r = np.int64(u) * 2
        out[p - 2] = _DIGITS2[r]
        out[p - 1] = _DIGITS2[r + 1]
    else:
        out[p - 1] = 48 + np.int64(u)
    return o + n


@njit(cache=True, nogil=True)
def _utf8_ok(buf, s, n):
    """Whether ``buf[s:s+n]`` is strict UTF-8 (Python's decoder: no surrogates, no overlongs)."""
    j = s
    e = s + n
    while j < e:
        c = buf[j]
        if c < 0x80:
            j += 1
            continue
        if 0xC2 <= c <= 0xDF:
            if j + 1 >= e or buf[j + 1] & 0xC0 != 0x80:
                return False
            j += 2
        elif 0xE0 <= c <= 0xEF:
            if j + 2 >= e:
                return False
            c1 = buf[j + 1]
            lo = 0xA0 if c == 0xE0 else 0x80
            hi = 0x9F if c == 0xED else 0xBF
            if c1 < lo or c1 > hi or buf[j + 2] & 0xC0 != 0x80:
                return False
            j += 3
        elif 0xF0 <= c <= 0xF4:
            if j + 3 >= e:
                return False
            c1 = buf[j + 1]
            lo = 0x90 if c == 0xF0 else 0x80
            hi = 0x8F if c == 0xF4 else 0xBF
            if c1 < lo or c1 > hi or buf[j + 2] & 0xC0 != 0x80 or buf[j + 3] & 0xC0 != 0x80:
                return False
            j += 4
        else:
            return False
    return True


@njit(cache=True, nogil=True)
def _str(out, o, buf, s, n):
    """``buf[s:s+n]`` (valid UTF-8) as the inside of a JSON string, escaped like json.dumps
    with ensure_ascii=False."""
    for j in range(s, s + n):
        c = buf[j]
        if c >= 32 and c != 34 and c != 92:
            out[o] = c
            o += 1
        elif c == 34 or c == 92:
            out[o] = 92
            out[o + 1] = c
            o += 2
        elif c == 10:
            out[o] = 92
            out[o + 1] = 110
            o += 2
        elif c == 13:
            out[o] = 92
            out[o + 1] = 114
            o += 2
        elif c == 9:
            out[o] = 92
            out[o + 1] = 116
            o += 2
        elif c == 8:
            out[o] = 92
            out[o + 1] = 98
            o += 2
        elif c == 12:
            out[o] = 92
            out[o + 1] = 102
            o += 2
        else:
            out[o] = 92
            out[o + 1] = 117
            out[o + 2] = 48
            out[o + 3] = 48
            out[o + 4] = _HEXL[c >> 4]
            out[o + 5] = _HEXL[c & 15]
            o += 6
    return o


@njit(cache=True, nogil=True, inline="always")
def _qstr(out, o, buf, s, n):
    out[o] = 34
    o = _str(out, o + 1, buf, s, n)
    out[o] = 34
    return o + 1


@njit(cache=True, nogil=True)
def _host(out, o, addr, port):
    """``a.b.c.d:port`` of an IPv4 address (first 4 bytes of ``addr``)."""
    for k in range(4):
        if k:
            out[o] = 46
            o += 1
        o = _int(out, o, np.int64(addr[k]))
    out[o] = 58
    return _int(out, o + 1, np.int64(port))


@njit(cache=True, nogil=True, inline="always")
def _host_memo(out, o, addr, port, memo, k):
    """:func:`_host`, copying the text rendered last time at ``out[memo[k, 2]:...]`` when the address and
    port are the same (a store has few hosts). ``memo[k]``: address (int), port, position, length."""
    key = (np.int64(addr[0]) << 24) | (np.int64(addr[1]) << 16) | (np.int64(addr[2]) << 8) | np.int64(addr[3])
    if memo[k, 2] >= 0 and memo[k, 0] == key and memo[k, 1] == port:
        n = memo[k, 3]
        _memcpy(out, o, out, memo[k, 2], n)
        return o + n
    e = _host(out, o, addr, port)
    memo[k, 0] = key
    memo[k, 1] = port
    memo[k, 2] = o
    memo[k, 3] = e - o
    return e


@njit(cache=True, nogil=True)
def _msg_id(out, o, addr, port, phys):
    """createMessageId of an IPv4 store host: upper-case hex of addr, port (int32 BE), offset (int64 BE)."""
    for k in range(4):
        b = addr[k]
        out[o] = _HEXU[b >> 4]
        out[o + 1] = _HEXU[b & 15]
        o += 2
    p = np.int64(port) & 0xFFFFFFFF
    for k in range(3, -1, -1):
        b = (p >> (8 * k)) & 0xFF
        out[o] = _HEXU[b >> 4]
        out[o + 1] = _HEXU[b & 15]
        o += 2
    for k in range(7, -1, -1):
        b = (phys >> (8 * k)) & 0xFF
        out[o] = _HEXU[b >> 4]
        out[o + 1] = _HEXU[b & 15]
        o += 2
    return o


@njit(cache=True, nogil=True)
def _java_hash(buf, s, n):
    """Java String.hashCode of valid UTF-8 bytes (over UTF-16 code units), signed 32-bit."""
    h = np.int64(0)
    j = s
    e = s + n
    while j < e:
        c = np.int64(buf[j])
        if c < 0x80:
            cp = c
            j += 1
        elif c < 0xE0:
            cp = ((c & 0x1F) << 6) | (np.int64(buf[j + 1]) & 0x3F)
            j += 2
        elif c < 0xF0:
            cp = ((c & 0x0F) << 12) | ((np.int64(buf[j + 1]) & 0x3F) << 6) | (np.int64(buf[j + 2]) & 0x3F)
            j += 3
        else:
            cp = (((c & 0x07) << 18) | ((np.int64(buf[j + 1]) & 0x3F) << 12) | ((np.int64(buf[j + 2]) & 0x3F) << 6)
                  | (np.int64(buf[j + 3]) & 0x3F))
            j += 4
        if cp >= 0x10000:
            v = cp - 0x10000
            h = (31 * h + (0xD800 + (v >> 10))) & 0xFFFFFFFF
            h = (31 * h + (0xDC00 + (v & 0x3FF))) & 0xFFFFFFFF
        else:
            h = (31 * h + cp) & 0xFFFFFFFF
    if h >= 0x80000000:
        h -= 0x100000000
    return h


@njit(cache=True, nogil=True, inline="always")
def _eq(buf, s, n, lit):
    if n != lit.size:
        return False
    for j in range(n):
        if buf[s + j] != lit[j]:
            return False
    return True


@njit(cache=True, nogil=True, inline="always")
def _same(buf, s1, n1, s2, n2):
    if n1 != n2:
        return False
    for j in range(n1):
        if buf[s1 + j] != buf[s2 + j]:
            return False
    return True


@njit(cache=True, nogil=True)
def _parse_props(buf, ps, pl, sc):
    """``parse_properties`` of valid UTF-8 ``buf[ps:ps+pl]`` into ``sc`` rows (name start, name len,
    value start, value len): dict semantics (a repeated name keeps its first place, takes the last value).
    Returns the number of pairs, or -1 if ``sc`` is too small."""
    k = 0
    cap = sc.shape[0]
    a = ps
    e = ps + pl
    while a <= e:
        b = a
        while b < e and buf[b] != 2:
            b += 1
        # segment [a, b): name before the first 0x01, a non-empty value after it
        x = a
        while x < b and buf[x] != 1:
            x += 1
        if x < b and x > a and x < b - 1:
            dup = -1
            for q in range(k):
                if _same(buf, sc[q, 0], sc[q, 1], a, x - a):
                    dup = q
                    break
            if dup >= 0:
                sc[dup, 2] = x + 1
                sc[dup, 3] = b - x - 1
            else:
                if k >= cap:
                    return -1
                sc[k, 0] = a
                sc[k, 1] = x - a
                sc[k, 2] = x + 1
                sc[k, 3] = b - x - 1
                k += 1
        a = b + 1
    return k


@njit(cache=True, nogil=True)
def _find(buf, sc, k, lit):
    for q in range(k):
        if _eq(buf, sc[q, 0], sc[q, 1], lit):
            return q
    return -1


@njit(cache=True, nogil=True)
def _needs_python(buf, sys_flag, ts, tl, ps, pl, decompress, schedule):
    """Whether a record must be rendered by the pure path (see the module docs); ``schedule``:
    also a record of the delay topic."""
    if sys_flag & 0x30:
        return True
    if decompress and sys_flag & 1:
        return True
    if schedule and _eq(buf, ts, tl, _SCHEDULE):
        return True
    return not (_utf8_ok(buf, ts, tl) and _utf8_ok(buf, ps, pl))


@njit(cache=True, nogil=True, inline="always")
def _d2(out, o, v):
    """Two decimal digits of ``0 <= v < 100``."""
    out[o] = _DIGITS2[2 * v]
    out[o + 1] = _DIGITS2[2 * v + 1]
    return o + 2


@njit(cache=True, nogil=True)
def _iso_ms(out, o, ms):
    """``"YYYY-MM-DDTHH:MM:SS.mmm`` of a UTC millisecond time in 1970..9999 (Python's
    ``datetime.isoformat(timespec="milliseconds")``; the caller adds the zone and the quote)."""
    days = ms // 86400000
    r = ms - days * 86400000
    z = days + 719468  # the civil date of a day number (H. Hinnant's days_from_civil, inverted)
    era = z // 146097
    doe = z - era * 146097
    yoe = (doe - doe // 1460 + doe // 36524 - doe // 146096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    d = doy - (153 * mp + 2) // 5 + 1
    m = mp + 3 if mp < 10 else mp - 9
    y = yoe + era * 400 + (1 if m <= 2 else 0)
    out[o] = 34
    o = _d2(out, o + 1, y // 100)
    o = _d2(out, o, y % 100)
    out[o] = 45
    o = _d2(out, o + 1, m)
    out[o] = 45
    o = _d2(out, o + 1, d)
    out[o] = 84  # T
    o = _d2(out, o + 1, r // 3600000)
    out[o] = 58
    o = _d2(out, o + 1, r // 60000 % 60)
    out[o] = 58
    o = _d2(out, o + 1, r // 1000 % 60)
    out[o] = 46
    ms3 = r % 1000
    out[o + 1] = 48 + ms3 // 100
    return _d2(out, o + 2, ms3 % 100)


@njit(cache=True, nogil=True)
def jsonl(buf, n, i0, out, cap, mode, decompress, seg_start, fname, select, use_select, limit, sc,
          file_pos, size, magic, body_crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts, born_addr,
          born_port, store_ts, store_addr, store_port, reconsume, prepared, body_len, body_start, topic_start,
          topic_len, props_start, props_len, tail, crc_ok):
    """Render rows ``i0..n-1`` as JSONL into ``out``. Returns (bytes written, next row, code, emitted).
    ``tail`` not empty: export's lines, the lineage columns after ``body`` (``tail``, then ``crc_ok``
    true or null and ``store_time``)."""
    memo = sc[sc.shape[0] - 2:]  # the last two scratch rows: the host memo (born, store)
    sc = sc[:sc.shape[0] - 2]
    memo[0, 2] = -1
    memo[1, 2] = -1
    o = 0
    emitted = 0
    i = i0
    KT, KO, NT, NO = _KEYTEXT, _KEYOFF, _NAMES, _NAMEOFF
    while i < n:
        if use_select and select[i] == 0:
            i += 1
            continue
        if limit >= 0 and emitted >= limit:
            return o, i, CODE_DONE, emitted
        _ahead(buf, i, n, topic_start, props_start)
        sf = sys_flag[i]
        ts, tl = topic_start[i], max(topic_len[i], 0)
        ps, pl = props_start[i], max(props_len[i], 0)
        bs, bl = body_start[i], max(body_len[i], 0)
        if _needs_python(buf, sf, ts, tl, ps, pl, decompress, True):
            return o, i, CODE_FALLBACK, emitted
        if mode == MODE_TEXT and not _utf8_ok(buf, bs, bl):
            return o, i, CODE_FALLBACK, emitted
        if mode == MODE_BASE64:
            bound = 4 * ((bl + 2) // 3)
        elif mode == MODE_HEX:
            bound = 2 * bl
        elif mode == MODE_TEXT:
            bound = 6 * bl
        else:
            bound = 0
        bound += 2048 + fname.size + tail.size + 6 * tl + 28 * pl + 8
        if o + bound > cap:
            return o, i, CODE_FULL, emitted
        k = _parse_props(buf, ps, pl, sc)
        if k < 0:
            return o, i, CODE_FALLBACK, emitted
        fp = file_pos[i]
        o = _lit(out, o, KT, KO, 0)
        o = _int(out, o, seg_start + fp)
        o = _lit(out, o, KT, KO, 1)
        _memcpy(out, o, fname, 0, fname.size)
        o += fname.size
        o = _lit(out, o, KT, KO, 2)
        o = _int(out, o, fp)
        o = _lit(out, o, KT, KO, 3)
        o = _int(out, o, np.int64(size[i]))
        o = _lit(out, o, KT, KO, 4)
        o = _lit(out, o, NT, NO, 1 if magic[i] == _V2 else 0)
        o = _lit(out, o, KT, KO, 5)
        o = _int(out, o, np.int64(body_crc[i]))
        o = _lit(out, o, KT, KO, 6)
        o = _int(out, o, np.int64(queue_id[i]))
        o = _lit(out, o, KT, KO, 7)
        o = _int(out, o, np.int64(flag[i]))
        o = _lit(out, o, KT, KO, 8)
        o = _int(out, o, queue_offset[i])
        o = _lit(out, o, KT, KO, 9)
        o = _int(out, o, phys[i])
        o = _lit(out, o, KT, KO, 10)
        o = _int(out, o, np.int64(sf))
        o = _lit(out, o, KT, KO, 11)
        o = _lit(out, o, NT, NO, N_TX + ((sf & TRANSACTION_TYPE_MASK) >> 2))
        o = _lit(out, o, KT, KO, 12)
        if not sf & COMPRESSED_FLAG:
            o = _lit(out, o, NT, NO, N_COMP)
        else:
            ct = (sf & COMPRESSION_TYPE_COMPARATOR) >> 8
            o = _lit(out, o, NT, NO, N_COMP + (1 if ct == 0 or ct == 3 else (2 if ct == 1 else (3 if ct == 2 else 4))))
        o = _lit(out, o, KT, KO, 13)
        o = _int(out, o, born_ts[i])
        o = _lit(out, o, KT, KO, 14)
        out[o] = 34
        o = _host_memo(out, o + 1, born_addr[i], born_port[i], memo, 0)
        out[o] = 34
        o = _lit(out, o + 1, KT, KO, 15)
        o = _int(out, o, store_ts[i])
        o = _lit(out, o, KT, KO, 16)
        out[o] = 34
        o = _host_memo(out, o + 1, store_addr[i], store_port[i], memo, 1)
        out[o] = 34
        o = _lit(out, o + 1, KT, KO, 17)
        o = _int(out, o, np.int64(reconsume[i]))
        o = _lit(out, o, KT, KO, 18)
        o = _int(out, o, prepared[i])
        o = _lit(out, o, KT, KO, 19)
        o = _qstr(out, o, buf, ts, tl)
        o = _lit(out, o, KT, KO, 20)
        out[o] = 123  # {
        o += 1
        for q in range(k):
            if q:
                o = _lit(out, o, NT, NO, N_COMMA)
            o = _qstr(out, o, buf, sc[q, 0], sc[q, 1])
            o = _lit(out, o, NT, NO, N_COLON)
            o = _qstr(out, o, buf, sc[q, 2], sc[q, 3])
        out[o] = 125  # }
        o = _lit(out, o + 1, KT, KO, 21)
        out[o] = 91  # [
        o += 1
        q = _find(buf, sc, k, _KEYS)
        if q >= 0:
            first = True
            a = sc[q, 2]
            e = a + sc[q, 3]
            while a < e:
                b = a
                while b < e and buf[b] != 32:
                    b += 1
                if b > a:
                    if not first:
                        o = _lit(out, o, NT, NO, N_COMMA)
                    first = False
                    o = _qstr(out, o, buf, a, b - a)
                a = b + 1
        out[o] = 93  # ]
        o = _lit(out, o + 1, KT, KO, 22)
        qt = _find(buf, sc, k, _TAGS)
        if qt >= 0:
            o = _qstr(out, o, buf, sc[qt, 2], sc[qt, 3])
        else:
            o = _lit(out, o, NT, NO, N_NULL)
        o = _lit(out, o, KT, KO, 23)
        q = _find(buf, sc, k, _UNIQ)
        if q >= 0:
            o = _qstr(out, o, buf, sc[q, 2], sc[q, 3])
        else:
            o = _lit(out, o, NT, NO, N_NULL)
        o = _lit(out, o, KT, KO, 24)
        out[o] = 34
        o = _msg_id(out, o + 1, store_addr[i], store_port[i], phys[i])
        out[o] = 34
        o = _lit(out, o + 1, KT, KO, K_TAGS_CODE)
        o = _int(out, o, _java_hash(buf, sc[qt, 2], sc[qt, 3]) if qt >= 0 else np.int64(0))
        o = _lit(out, o, KT, KO, 26)
        o = _int(out, o, np.int64(body_len[i]))
        o = _lit(out, o, KT, KO, 27)
        if mode == MODE_NONE:
            o = _lit(out, o, NT, NO, N_NULL)
        else:
            out[o] = 34
            o += 1
            if mode == MODE_BASE64:
                o = _base64(out, o, buf, bs, bl)
            elif mode == MODE_HEX:
                o = _hex(out, o, buf, bs, bl)
            else:
                o = _str(out, o, buf, bs, bl)
            out[o] = 34
            o += 1
        if tail.size == 0:
            o = _lit(out, o, KT, KO, 28)
        else:
            _memcpy(out, o, tail, 0, tail.size)
            o += tail.size
            o = _lit(out, o, NT, NO, N_TRUE if crc_ok[i] != 0 else N_NULL)
            o = _lit(out, o, NT, NO, N_STORE_TIME)
            st = store_ts[i]
            if 0 <= st <= _MAX_TS_MS:
                o = _iso_ms(out, o, st)
                o = _lit(out, o, NT, NO, N_UTC)
            else:
                o = _lit(out, o, NT, NO, N_NULL)
            o = _lit(out, o, NT, NO, N_END)
        emitted += 1
        i += 1
    return o, i, CODE_DONE, emitted


@njit(cache=True, nogil=True)
def _hex(out, o, buf, s, n):
    """Lower-case hex of ``buf[s:s+n]``, 4 bytes -> 8 digits per store (the last step may write up to
    6 bytes past the digits: the record bound keeps that slack)."""
    j = s
    e = s + n
    H = _HEXPAIR
    while j + 4 <= e:
        _st_u64(out, o, H[buf[j]] | (H[buf[j + 1]] << np.uint64(16)) | (H[buf[j + 2]] << np.uint64(32))
                | (H[buf[j + 3]] << np.uint64(48)))
        o += 8
        j += 4
    while j < e:
        c = buf[j]
        out[o] = _HEXL[c >> 4]
        out[o + 1] = _HEXL[c & 15]
        o += 2
        j += 1
    return o


@njit(cache=True, nogil=True)
def _base64(out, o, buf, s, n):
    """Standard base64 (with padding) of ``buf[s:s+n]``: 12 bits -> 2 characters by table; 6 bytes -> 8
    characters per step while an 8-byte load stays inside ``buf``, then 3 -> 4."""
    j = s
    e6 = s + (n // 6) * 6
    T6 = _B64PAIR64
    m12 = np.uint64(4095)
    while j < e6 and j + 8 <= buf.size:
        v = _ld_be64(buf, j) >> np.uint64(16)  # the 48 bits of 6 bytes
        _st_u64(out, o, T6[(v >> np.uint64(36)) & m12] | (T6[(v >> np.uint64(24)) & m12] << np.uint64(16))
                | (T6[(v >> np.uint64(12)) & m12] << np.uint64(32)) | (T6[v & m12] << np.uint64(48)))
        o += 8
        j += 6
    n = s + n - j
    s = j
    e = s + n - n % 3
    T = _B64PAIR
    while j < e:
        v = (np.uint32(buf[j]) << 16) | (np.uint32(buf[j + 1]) << 8) | np.uint32(buf[j + 2])
        _st_u32(out, o, T[v >> 12] | (T[v & 4095] << 16))
        o += 4
        j += 3
    r = n % 3
    if r == 1:
        v = np.int64(buf[j]) << 16
        out[o] = _B64[(v >> 18) & 63]
        out[o + 1] = _B64[(v >> 12) & 63]
        out[o + 2] = 61
        out[o + 3] = 61
        o += 4
    elif r == 2:
        v = (np.int64(buf[j]) << 16) | (np.int64(buf[j + 1]) << 8)
        out[o] = _B64[(v >> 18) & 63]
        out[o + 1] = _B64[(v >> 12) & 63]
        out[o + 2] = _B64[(v >> 6) & 63]
        out[o + 3] = 61
        o += 4
    return o


@njit(cache=True, nogil=True)
def columns(buf, n, sc, sys_flag, born_addr, born_port, store_addr, store_port, phys, topic_start, topic_len,
            props_start, props_len, flags, entries, name_off, name_data, value_off, value_data, keys, key_off,
            key_data, tags, uniq, tag_code, topic, born_h, store_h, msgid, valid):
    """Derived Arrow columns of rows ``0..n-1`` (offsets int32, data uint8). ``flags[i]`` = 1 for a row
    the pure path must build (its derived values are left empty); ``valid[2i]`` / ``valid[2i+1]``: row i
    has TAGS / UNIQ_KEY. Returns the (property entries, keys) counts.

    ``tags`` / ``uniq`` / ``topic`` / ``born_h`` / ``store_h`` are (n + 1) int32 offsets into
    their own data areas that follow in the same array: see :func:`rmqdump.fast.render.derive`."""
    memo = sc[sc.shape[0] - 2:]  # the last two scratch rows: the host memo (born, store)
    sc = sc[:sc.shape[0] - 2]
    memo[0, 2] = -1
    memo[1, 2] = -1
    ne = 0
    nk = 0
    name_o = 0
    value_o = 0
    key_o = 0
    tag_o = 0
    uniq_o = 0
    topic_o = 0
    bh_o = 0
    sh_o = 0
    tags_off, tags_data = tags[0], tags[1]
    uniq_off, uniq_data = uniq[0], uniq[1]
    topic_off, topic_data = topic[0], topic[1]
    bh_off, bh_data = born_h[0], born_h[1]
    sh_off, sh_data = store_h[0], store_h[1]
    entries[0] = 0
    keys[0] = 0
    tags_off[0] = 0
    uniq_off[0] = 0
    topic_off[0] = 0
    bh_off[0] = 0
    sh_off[0] = 0
    name_off[0] = 0
    value_off[0] = 0
    key_off[0] = 0
    for i in range(n):
        _ahead(buf, i, n, topic_start, props_start)
        sf = sys_flag[i]
        ts, tl = topic_start[i], max(topic_len[i], 0)
        ps, pl = props_start[i], max(props_len[i], 0)
        k = -1
        if not _needs_python(buf, sf, ts, tl, ps, pl, False, False):
            k = _parse_props(buf, ps, pl, sc)
        if k < 0:
            flags[i] = 1
            entries[i + 1] = ne
            keys[i + 1] = nk
            tags_off[i + 1] = tag_o
            uniq_off[i + 1] = uniq_o
            topic_off[i + 1] = topic_o
            bh_off[i + 1] = bh_o
            sh_off[i + 1] = sh_o
            tag_code[i] = 0
            valid[2 * i] = 0
            valid[2 * i + 1] = 0
            for j in range(32):
                msgid[32 * i + j] = 48
            continue
        flags[i] = 0
        for q in range(k):
            for j in range(sc[q, 1]):
                name_data[name_o + j] = buf[sc[q, 0] + j]
            name_o += sc[q, 1]
            for j in range(sc[q, 3]):
                value_data[value_o + j] = buf[sc[q, 2] + j]
            value_o += sc[q, 3]
            ne += 1
            name_off[ne] = name_o
            value_off[ne] = value_o
        entries[i + 1] = ne
        q = _find(buf, sc, k, _KEYS)
        if q >= 0:
            a = sc[q, 2]
            e = a + sc[q, 3]
            while a < e:
                b = a
                while b < e and buf[b] != 32:
                    b += 1
                if b > a:
                    for j in range(b - a):
                        key_data[key_o + j] = buf[a + j]
                    key_o += b - a
                    nk += 1
                    key_off[nk] = key_o
                a = b + 1
        keys[i + 1] = nk
        qt = _find(buf, sc, k, _TAGS)
        if qt >= 0:
            for j in range(sc[qt, 3]):
                tags_data[tag_o + j] = buf[sc[qt, 2] + j]
            tag_o += sc[qt, 3]
            tag_code[i] = _java_hash(buf, sc[qt, 2], sc[qt, 3])
        else:
            tag_code[i] = 0
        tags_off[i + 1] = tag_o
        valid[2 * i] = 1 if qt >= 0 else 0
        q = _find(buf, sc, k, _UNIQ)
        if q >= 0:
            for j in range(sc[q, 3]):
                uniq_data[uniq_o + j] = buf[sc[q, 2] + j]
            uniq_o += sc[q, 3]
        uniq_off[i + 1] = uniq_o
        valid[2 * i + 1] = 1 if q >= 0 else 0
        for j in range(tl):
            topic_data[topic_o + j] = buf[ts + j]
        topic_o += tl
        topic_off[i + 1] = topic_o
        bh_o = _host_memo(bh_data, bh_o, born_addr[i], born_port[i], memo, 0)
        bh_off[i + 1] = bh_o
        sh_o = _host_memo(sh_data, sh_o, store_addr[i], store_port[i], memo, 1)
        sh_off[i + 1] = sh_o
        _msg_id(msgid, 32 * i, store_addr[i], store_port[i], phys[i])
    return ne, nk


# --- C entry points: one int64 argument block each (see abi.B_* / C_*) ---------------------------
_p_u8 = pointer_intrinsic(types.uint8)
_p_i8 = pointer_intrinsic(types.int8)
_p_i32 = pointer_intrinsic(types.int32)
_p_u32 = pointer_intrinsic(types.uint32)
_p_i64 = pointer_intrinsic(types.int64)


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def jsonl_c(a):
    """``jsonl`` over raw pointers (abi.B_* argument block; column pointers in abi.COLUMNS order)."""
    n = a[B_N]
    c = B_COLS
    sc = carray(_p_i64(a[B_SCRATCH]), (a[B_SCRATCH_CAP], 4))
    use_select = a[B_SELECT] != 0
    sel = carray(_p_u8(a[B_SELECT] if use_select else a[B_FILE]), (n if use_select else 0,))
    tail = a[B_TAIL] if a[B_TAIL_LEN] else a[B_FILE]
    o, i, code, emitted = jsonl(
        carray(_p_u8(a[B_BUF]), (a[B_SIZE],)), n, a[B_I0], carray(_p_u8(a[B_OUT]), (a[B_OUT_CAP],)), a[B_OUT_CAP],
        a[B_MODE], a[B_DECOMPRESS] != 0, a[B_SEG_START], carray(_p_u8(a[B_FILE]), (a[B_FILE_LEN],)), sel,
        use_select, a[B_LIMIT], sc,
        carray(_p_i64(a[c + 0]), (n,)), carray(_p_i32(a[c + 1]), (n,)), carray(_p_u32(a[c + 2]), (n,)),
        carray(_p_i32(a[c + 3]), (n,)), carray(_p_i32(a[c + 4]), (n,)), carray(_p_i32(a[c + 5]), (n,)),
        carray(_p_i64(a[c + 6]), (n,)), carray(_p_i64(a[c + 7]), (n,)), carray(_p_i32(a[c + 8]), (n,)),
        carray(_p_i64(a[c + 9]), (n,)), carray(_p_u8(a[c + 10]), (n, 16)), carray(_p_i32(a[c + 11]), (n,)),
        carray(_p_i64(a[c + 12]), (n,)), carray(_p_u8(a[c + 13]), (n, 16)), carray(_p_i32(a[c + 14]), (n,)),
        carray(_p_i32(a[c + 15]), (n,)), carray(_p_i64(a[c + 16]), (n,)), carray(_p_i32(a[c + 17]), (n,)),
        carray(_p_i64(a[c + 18]), (n,)), carray(_p_i64(a[c + 19]), (n,)), carray(_p_i32(a[c + 20]), (n,)),
        carray(_p_i64(a[c + 21]), (n,)), carray(_p_i32(a[c + 22]), (n,)), carray(_p_u8(tail), (a[B_TAIL_LEN],)),
        carray(_p_i8(a[c + 23]), (n,)))
    a[B_OUT_LEN] = o
    a[B_OUT_NEXT] = i
    a[B_OUT_CODE] = code
    a[B_OUT_EMITTED] = emitted


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def columns_c(a):
    """``columns`` over raw pointers (abi.C_* argument block)."""
    n = a[C_N]
    c = B_COLS
    tot = a[B_SIZE]
    cap_p = a[C_N + 1]  # property bytes of the batch (bound of every property-derived data area)
    cap_t = a[C_N + 2]  # topic bytes of the batch
    cap_e = a[C_N + 3]  # bound of property entries / keys
    ne, nk = columns(
        carray(_p_u8(a[B_BUF]), (tot,)), n, carray(_p_i64(a[B_SCRATCH]), (a[B_SCRATCH_CAP], 4)),
        carray(_p_i32(a[c + 8]), (n,)), carray(_p_u8(a[c + 10]), (n, 16)), carray(_p_i32(a[c + 11]), (n,)),
        carray(_p_u8(a[c + 13]), (n, 16)), carray(_p_i32(a[c + 14]), (n,)), carray(_p_i64(a[c + 7]), (n,)),
        carray(_p_i64(a[c + 19]), (n,)), carray(_p_i32(a[c + 20]), (n,)), carray(_p_i64(a[c + 21]), (n,)),
        carray(_p_i32(a[c + 22]), (n,)),
        carray(_p_i8(a[C_FLAGS]), (n,)), carray(_p_i32(a[C_ENTRIES]), (n + 1,)),
        carray(_p_i32(a[C_NAME_OFF]), (cap_e + 1,)), carray(_p_u8(a[C_NAME_DATA]), (cap_p,)),
        carray(_p_i32(a[C_VALUE_OFF]), (cap_e + 1,)), carray(_p_u8(a[C_VALUE_DATA]), (cap_p,)),
        carray(_p_i32(a[C_KEYS]), (n + 1,)), carray(_p_i32(a[C_KEY_OFF]), (cap_e + 1,)),
        carray(_p_u8(a[C_KEY_DATA]), (cap_p,)),
        (carray(_p_i32(a[C_TAGS]), (n + 1,)), carray(_p_u8(a[C_TAGS + 1]), (cap_p,))),
        (carray(_p_i32(a[C_UNIQ]), (n + 1,)), carray(_p_u8(a[C_UNIQ + 1]), (cap_p,))),
        carray(_p_i64(a[C_TAGCODE]), (n,)),
        (carray(_p_i32(a[C_TOPIC]), (n + 1,)), carray(_p_u8(a[C_TOPIC + 1]), (cap_t,))),
        (carray(_p_i32(a[C_BORN_H]), (n + 1,)), carray(_p_u8(a[C_BORN_H + 1]), (28 * n,))),
        (carray(_p_i32(a[C_STORE_H]), (n + 1,)), carray(_p_u8(a[C_STORE_H + 1]), (28 * n,))),
        carray(_p_u8(a[C_MSGID]), (32 * n,)), carray(_p_i8(a[C_VALID]), (2 * n,)))
    a[C_OUT_ENTRIES] = ne
    a[C_OUT_KEYS] = nk


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def info_c(a):
    """a[0] <- the argument block size this build expects."""
    a[0] = BLOCK_SIZE


ENTRY_POINTS = {"rmqdump_jsonl": jsonl_c, "rmqdump_columns": columns_c, "rmqdump_render_info": info_c}
def build_shared_library(path: str, cc: str = "cc") -> None:
    """Link the entry points into ``path`` (see :mod:`rmqdump.fast._link`; run with an empty numba
    cache, as :func:`rmqdump.fast.walk.backend` does)."""
    link_shared_library(ENTRY_POINTS, path, cc, "render")


if __name__ == "__main__":  # python -m rmqdump.fast._jsonkernels OUTPUT.so [CC]
    import sys

    build_shared_library(sys.argv[1], *(sys.argv[2:3] or ["cc"]))
