"""Per-record kernels the walk, the verify checks and the ConsumeQueue join share (numba): the property
check of :mod:`rmqdump.analysis.verify.record_checks`, the TAGS hash a ConsumeQueue entry holds, and the
walk's bounded topic table (:func:`intern_topic`, see :mod:`rmqdump.fast.intern`). Compiled into the
libraries of :mod:`rmqdump.fast._kernels` and :mod:`rmqdump.fast._cqkernels` (both key on this file)."""

from __future__ import annotations

import numpy as np
from numba import njit

from rmqdump.fast.abi import NOT_ASCII

FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)
_CRC_KEY = np.frombuffer(b"__CRC32#", dtype=np.uint8).copy()
_INNER_KEY = np.frombuffer(b"INNER_NUM", dtype=np.uint8).copy()


@njit(cache=True, nogil=True, boundscheck=False)
def _ends_with(buf, e, lit):
    """Whether ``buf[e - len(lit):e]`` equals ``lit`` (called after its last byte matched: rarely)."""
    m = lit.size
    for k in range(m):
        if buf[e - m + k] != lit[k]:
            return False
    return True


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def props_scan(buf, ps, pl):
    """The properties ``buf[ps:ps + pl]`` in one pass: ``(check, tags)``.

    ``check``: -1 when verify must look at them in Python (not ASCII, not ``key\x01value`` pairs joined by
    ``\x02`` as ``record_checks._PROPS_OK`` wants, or holding ``__CRC32#\x01``), else 1 when they hold
    ``INNER_NUM\x01``, 0 when not. ``tags``: the Java hash of the TAGS value as the property parser,
    ``_find`` and ``_java_hash`` give it for ASCII properties (the last \x02-separated field named TAGS with a
    non-empty value; 0 without one), ``NOT_ASCII`` when a byte is not ASCII.
    Plain bytes (3..0x7F) cost one compare; a field (``a``: its start, ``one``: its first \x01) is judged
    at its separator.
    """
    bad = False
    nonascii = False
    crc = False
    inner = 0
    h = np.int64(0)
    a = 0
    one = -1
    j = 0
    while True:
        while j < pl:  # plain bytes: one compare each
            c = buf[ps + j]
            if 3 <= c < 0x80:
                j += 1
            else:
                break
        end = j >= pl
        b = np.uint8(2) if end else buf[ps + j]  # the end closes the last field as a separator would
        if b == 1:
            if one < 0:  # the key's end
                one = j
                if j == a:
                    bad = True  # an empty key
            if j >= 8 and buf[ps + j - 1] == 35 and _ends_with(buf, ps + j, _CRC_KEY):  # "...#": "__CRC32#"?
                crc = True
            if j >= 9 and buf[ps + j - 1] == 77 and _ends_with(buf, ps + j, _INNER_KEY):  # "...M": "INNER_NUM"?
                inner = 1
        elif b == 2:
            if j == a:
                if not end:
                    bad = True  # an empty field (a trailing separator is allowed)
            else:
                if one < 0 or j == one + 1:
                    bad = True  # no value
                if j - a >= 6 and buf[ps + a] == 84 and buf[ps + a + 1] == 65 and buf[ps + a + 2] == 71 \
                        and buf[ps + a + 3] == 83 and buf[ps + a + 4] == 1:  # "TAGS\x01" and a value
                    v = np.int64(0)
                    for k in range(ps + a + 5, ps + j):
                        v = (31 * v + np.int64(buf[k])) & 0xFFFFFFFF
                    h = v - 0x100000000 if v >= 0x80000000 else v
            if end:
                break
            a = j + 1
            one = -1
        else:  # NUL or not ASCII
            bad = True
            if b >= 0x80:
                nonascii = True
        j += 1
    if nonascii:
        return np.int64(-1), np.int64(NOT_ASCII)
    return (np.int64(-1) if bad or crc else np.int64(inner)), h


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def same_bytes(x, xs, y, ys, n):
    """Whether ``x[xs:xs + n]`` equals ``y[ys:ys + n]``."""
    for k in range(n):
        if x[xs + k] != y[ys + k]:
            return False
    return True


@njit(cache=True, nogil=True, boundscheck=False, inline="always")
def topic_slot(buf, ts, tl, keys, ids, mask, arena, off, ln):
    """Topic ``buf[ts:ts + tl]`` in an open-addressing topic table (FNV-1a 64 ``keys``, ``ids`` -1 where free,
    the topics' bytes at ``arena[off[id]:off[id] + ln[id]]``): ``(its id or -1, the slot it is in or would go
    in, its hash)``. The walk's, the record checks' and the CQ join's tables all probe this way."""
    h = FNV_OFFSET
    for k in range(tl):
        h = (h ^ np.uint64(buf[ts + k])) * FNV_PRIME
    s = np.int64(h & np.uint64(mask))
    while True:
        c = ids[s]
        if c < 0:
            return np.int64(-1), s, h
        if keys[s] == h and ln[c] == tl:
            a0 = off[c]
            same = True
            for k in range(tl):
                if arena[a0 + k] != buf[ts + k]:
                    same = False
                    break
            if same:
                return np.int64(c), s, h
        s = (s + 1) & mask


@njit(cache=True, nogil=True, boundscheck=False)
def intern_topic(buf, ts, tl, keys, ids, mask, arena, off, ln, cap, state):
    """The id of topic ``buf[ts:ts + tl]`` in a walk's topic table (added when new; -1 when the table is
    full). ``keys``/``ids``: open addressing over ``mask + 1 >= 2 * cap`` slots; ``arena``/``off``/``ln``: the
    topics' bytes; ``state``: [topics, arena bytes used]. Ids are only ever added: equal ids mean byte-equal
    topics."""
    c, s, h = topic_slot(buf, ts, tl, keys, ids, mask, arena, off, ln)
    if c >= 0:
        return c
    n = state[0]
    used = state[1]
    if n >= cap or used + tl > arena.size:
        return np.int64(-1)
    for k in range(tl):
        arena[used + k] = buf[ts + k]
    off[n] = used
    ln[n] = tl
    keys[s] = h
    ids[s] = n
    state[0] = n + 1
    state[1] = used + tl
    return np.int64(n)
