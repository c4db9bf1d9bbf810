"""Compiled (numba) kernel of the ConsumeQueue join (:mod:`rmqdump.fast.cqjoin`). Importing this module
imports numba (and the rendering kernels, whose property parser and tag hash it shares).

``cqjoin`` looks at a batch's records in order and classifies each against the consume-queue entry
its topic, QUEUEID and QUEUEOFFSET name (``CODE_*`` in :mod:`rmqdump.fast.cqjoin`): not dispatched
(PREPARED/ROLLBACK), matched with equal size and tagsCode, no matching entry, or one the Python checker
must look at (size or tagsCode differ, the delay topic, properties that are not valid UTF-8). The entry
columns hold a window of each queue (``q_base``/``q_n``/``q_at``); a record whose queue offset lies outside
its queue's window is unmatched with ``gidx = -1 - queue`` so that the caller can look the entry up.
"""

from __future__ import annotations

import numpy as np
from numba import carray, cfunc, njit, types

from rmqdump.codec.layout import TRANSACTION_COMMIT_TYPE, TRANSACTION_TYPE_MASK
from rmqdump.fast._jsonkernels import _TAGS, _find, _java_hash, _parse_props, _utf8_ok
from rmqdump.fast._kernels import prefetch
from rmqdump.fast._link import link_shared_library, pointer_intrinsic
from rmqdump.fast._recordkernels import props_scan, same_bytes, topic_slot
from rmqdump.fast.abi import (
    J_ARENA,
    J_ARENA_LEN,
    J_ARENA_OFF,
    J_ARENA_SIZE,
    J_BLOCK_SIZE,
    J_BUF,
    J_CODE,
    J_COLUMNS,
    J_D_TAGS,
    J_D_TID,
    J_DERIVED,
    J_GIDX,
    J_HT_IDS,
    J_HT_KEYS,
    J_HT_MASK,
    J_I0,
    J_N,
    J_NENTRIES,
    J_NQ,
    J_NTOPICS,
    J_OUT_I,
    J_PHYS,
    J_Q_AT,
    J_Q_BASE,
    J_Q_N,
    J_QT_KEYS,
    J_QT_MASK,
    J_QT_SLOTS,
    J_SCRATCH,
    J_SCRATCH_CAP,
    J_SEG_START,
    J_SIZE,
    J_SIZES,
    J_TAGS,
    J_TFLAGS,
    J_TID,
    J_WMAP,
    J_WMAP_CAP,
    JCODE_CLEARED,
    JCODE_PYTHON,
    JCODE_SKIP,
    JCODE_UNMATCHED,
    NOT_ASCII,
)

_QHASH = np.uint64(0x9E3779B97F4A7C15)
_EXT_LIMIT = -2147483649  # tagsCode at or below: a ConsumeQueueExt address
_TAGS_KEY = np.frombuffer(b"TAGS\x01", dtype=np.uint8).copy()
_AHEAD = 8  # rows cqjoin prefetches ahead


@njit(cache=True, nogil=True)
def _contains(buf, s, n, lit):
    m = lit.size
    for j in range(s, s + n - m + 1):
        k = 0
        while k < m and buf[j + k] == lit[k]:
            k += 1
        if k == m:
            return True
    return False


@njit(cache=True, nogil=True, boundscheck=False)
def cqjoin(buf, i0, n, seg_start, pos, size, qid, qoff, sys_flag, tstart, tlen, pstart, plen,
           ht_keys, ht_ids, mask, arena, aoff, alen, tflags, qt_keys, qt_slots, qmask, q_base, q_n, q_at,
           phys, sizes, tags, sc, code, gidx, tid, derived, d_tid, d_tags, wmap):
    """Classify records ``i0..n-1`` (code/gidx/tid per record); returns the index of the first record
    whose topic is not in the table yet (``n`` when all were classified). ``derived``: the walk's
    ``d_tid``/``d_tags`` columns stand for the topic and property bytes (``wmap``: walk topic -> topic)."""
    prev_t = -1
    prev_s = 0
    prev_l = -1
    for i in range(i0, n):
        if not derived and i + _AHEAD < n:  # the topic and properties of a record a few rows on: they left the cache
            prefetch(buf, tstart[i + _AHEAD])
        tx = sys_flag[i] & TRANSACTION_TYPE_MASK
        if tx != 0 and tx != TRANSACTION_COMMIT_TYPE:
            code[i] = JCODE_SKIP
            continue
        ts = tstart[i]
        tl = max(tlen[i], 0)
        t = -1
        wt = d_tid[i] if derived else -1
        if wt >= 0:
            t = wmap[wt]
        if t < 0 and prev_t >= 0 and tl == prev_l and same_bytes(buf, ts, buf, prev_s, tl):
            t = prev_t
        if t < 0:
            t = topic_slot(buf, ts, tl, ht_keys, ht_ids, mask, arena, aoff, alen)[0]
            if t < 0:
                return i
        if wt >= 0:
            wmap[wt] = t
        prev_t, prev_s, prev_l = t, ts, tl
        tid[i] = t
        if tflags[t] & 1:
            code[i] = JCODE_PYTHON
            continue
        key = (np.int64(t) << 32) | (np.int64(qid[i]) & 0xFFFFFFFF)
        s = np.int64(((np.uint64(key) * _QHASH) >> np.uint64(32)) & np.uint64(qmask))
        slot = -1
        while qt_slots[s] >= 0:
            if qt_keys[s] == key:
                slot = qt_slots[s]
                break
            s = (s + 1) & qmask
        if slot < 0:
            code[i] = JCODE_UNMATCHED
            gidx[i] = 0
            continue
        j = qoff[i] - q_base[slot]
        if j < 0 or j >= q_n[slot]:  # outside the queue's window: the caller looks the entry up
            code[i] = JCODE_UNMATCHED
            gidx[i] = -1 - slot
            continue
        g = q_at[slot] + j
        if phys[g] != seg_start + pos[i]:
            code[i] = JCODE_UNMATCHED
            gidx[i] = g
            continue
        gidx[i] = g
        if sizes[g] != size[i]:
            code[i] = JCODE_PYTHON
            continue
        tg = tags[g]
        if tg > _EXT_LIMIT:
            ps = pstart[i]
            pl = max(plen[i], 0)
            exp = d_tags[i] if derived else props_scan(buf, ps, pl)[1]
            if exp == NOT_ASCII:
                exp = 0
                if _contains(buf, ps, pl, _TAGS_KEY):
                    if not _utf8_ok(buf, ps, pl):
                        code[i] = JCODE_PYTHON
                        continue
                    k = _parse_props(buf, ps, pl, sc)
                    if k < 0:
                        code[i] = JCODE_PYTHON
                        continue
                    q = _find(buf, sc, k, _TAGS)
                    if q >= 0:
                        exp = _java_hash(buf, sc[q, 2], sc[q, 3])
            if exp != tg:
                code[i] = JCODE_PYTHON
                continue
        code[i] = JCODE_CLEARED
    return n


_p_u8 = pointer_intrinsic(types.uint8)
_p_i8 = pointer_intrinsic(types.int8)
_p_i32 = pointer_intrinsic(types.int32)
_p_i64 = pointer_intrinsic(types.int64)
_p_u64 = pointer_intrinsic(types.uint64)


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def cqjoin_c(a):
    """``cqjoin`` over raw pointers (abi.J_* argument block)."""
    n = a[J_N]
    c = J_COLUMNS
    nt = a[J_NTOPICS]
    nh = a[J_QT_MASK] + 1
    nq = a[J_NQ]
    ne = a[J_NENTRIES]
    derived = a[J_DERIVED] != 0
    dn = n if derived else 0
    wn = a[J_WMAP_CAP] if derived else 0
    a[J_OUT_I] = cqjoin(
        carray(_p_u8(a[J_BUF]), (a[J_SIZE],)), a[J_I0], n, a[J_SEG_START],
        carray(_p_i64(a[c + 0]), (n,)), carray(_p_i32(a[c + 1]), (n,)), carray(_p_i32(a[c + 2]), (n,)),
        carray(_p_i64(a[c + 3]), (n,)), carray(_p_i32(a[c + 4]), (n,)), carray(_p_i64(a[c + 5]), (n,)),
        carray(_p_i32(a[c + 6]), (n,)), carray(_p_i64(a[c + 7]), (n,)), carray(_p_i32(a[c + 8]), (n,)),
        carray(_p_u64(a[J_HT_KEYS]), (a[J_HT_MASK] + 1,)), carray(_p_i32(a[J_HT_IDS]), (a[J_HT_MASK] + 1,)),
        a[J_HT_MASK], carray(_p_u8(a[J_ARENA]), (a[J_ARENA_SIZE],)), carray(_p_i64(a[J_ARENA_OFF]), (nt,)),
        carray(_p_i64(a[J_ARENA_LEN]), (nt,)), carray(_p_i32(a[J_TFLAGS]), (nt,)),
        carray(_p_i64(a[J_QT_KEYS]), (nh,)), carray(_p_i32(a[J_QT_SLOTS]), (nh,)), a[J_QT_MASK],
        carray(_p_i64(a[J_Q_BASE]), (nq,)), carray(_p_i64(a[J_Q_N]), (nq,)), carray(_p_i64(a[J_Q_AT]), (nq,)),
        carray(_p_i64(a[J_PHYS]), (ne,)), carray(_p_i32(a[J_SIZES]), (ne,)), carray(_p_i64(a[J_TAGS]), (ne,)),
        carray(_p_i64(a[J_SCRATCH]), (a[J_SCRATCH_CAP], 4)), carray(_p_i8(a[J_CODE]), (n,)),
        carray(_p_i64(a[J_GIDX]), (n,)), carray(_p_i32(a[J_TID]), (n,)), derived,
        carray(_p_i32(a[J_D_TID]), (dn,)), carray(_p_i64(a[J_D_TAGS]), (dn,)),
        carray(_p_i32(a[J_WMAP]), (wn,)))


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def info_c(a):
    """a[0] <- the argument block size this build expects."""
    a[0] = J_BLOCK_SIZE


ENTRY_POINTS = {"rmqdump_cqjoin": cqjoin_c, "rmqdump_cqjoin_info": info_c}


def build_shared_library(path: str, cc: str = "cc") -> None:
    """Link the entry points into ``path`` (see :mod:`rmqdump.fast._link`)."""
    link_shared_library(ENTRY_POINTS, path, cc, "cqjoin")


if __name__ == "__main__":  # python -m rmqdump.fast._cqkernels OUTPUT.so [CC]
    import sys

    build_shared_library(sys.argv[1], *(sys.argv[2:3] or ["cc"]))
