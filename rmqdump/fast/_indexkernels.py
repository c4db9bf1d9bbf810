"""Compiled (numba) kernels of verify's index-file check (:mod:`rmqdump.fast.indexjoin`). Importing this module
imports numba (and the walk and rendering kernels, whose record decoder, property parser and Java hash it shares).

* ``index_entries``: every entry of one index file against the record it points at, read in place from the
  mapped commitlog segments (the walk's decoder on one record): a status byte per entry (``S_*`` in
  :mod:`rmqdump.fast.indexjoin`) and the first and last entry that points at a message;
* ``index_chains``: the slot chains, as ``index_checks`` walks them, as a log of events (kept per class up to a
  bound) and counters;
* ``index_reachable``: whether every chained entry is on the chain of its own slot.
"""

from __future__ import annotations

import numpy as np
from numba import carray, cfunc, njit, types

from rmqdump.codec.layout import (
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_SIZE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.fast._jsonkernels import _KEYS, _UNIQ, _find, _java_hash, _parse_props, _utf8_ok
from rmqdump.fast._kernels import _DELAY, _SCHEDULE, CRC_TABLES, ld_be32, ld_be64, walk
from rmqdump.fast._link import link_shared_library, pointer_intrinsic
from rmqdump.fast.abi import DEFER
from rmqdump.fast.indexabi import (
    C_BLOCK,
    C_CHAIN_SLOT,
    C_CLASS_COUNT,
    C_COUNT,
    C_ENTRIES_START,
    C_EV,
    C_EV_CAP,
    C_IDX,
    C_IDX_SIZE,
    C_KEEP,
    C_N_SLOTS,
    C_OUT,
    C_OWN,
    C_SLOTS_N,
    DENSE_BYTES,
    E_BEGIN_TS,
    E_BLOCK,
    E_COUNT,
    E_ENTRIES_START,
    E_I0,
    E_IDX,
    E_IDX_SIZE,
    E_MAX_RECORD,
    E_MIN_OFF,
    E_NSEG,
    E_OUT,
    E_PAGE_BUDGET,
    E_RECOVERY_END,
    E_SCRATCH,
    E_SCRATCH_CAP,
    E_SEG_ADDR,
    E_SEG_END,
    E_SEG_SIZE,
    E_SEG_START,
    E_STATUS,
    E_VALID_END,
    E_WALK_COLS,
    E_WIN,
    ENTRY_PHY,
    ENTRY_PREV,
    ENTRY_TIME_DIFF,
    EV_CYCLE,
    EV_MERGE,
    EV_ORDER,
    EV_ORDER_SELF,
    EV_SLOT_INVALID,
    EV_SLOT_MISMATCH,
    K_BLOCK,
    K_BUF,
    K_BUF_SIZE,
    K_CAP,
    K_HASHES,
    K_I0,
    K_N,
    K_OUT,
    K_PROPS_LEN,
    K_PROPS_START,
    K_PYTHON,
    K_ROWS,
    K_SCRATCH,
    K_SCRATCH_CAP,
    K_SYS_FLAG,
    K_TOPIC_LEN,
    K_TOPIC_START,
    P_BLOCK,
    P_BUF,
    P_BUF_SIZE,
    P_I0,
    P_LEN,
    P_N,
    P_NAME,
    P_NAME_LEN,
    P_PROPS_LEN,
    P_PROPS_START,
    P_PYTHON,
    P_SCRATCH,
    P_SCRATCH_CAP,
    P_START,
    S_BEYOND,
    S_DANGLING,
    S_EXPIRED,
    S_KEY,
    S_PYTHON,
    S_ROLLBACK,
    S_TIME,
)

_M32 = 0xFFFFFFFF
_p_u8, _p_i8, _p_i32 = pointer_intrinsic(types.uint8), pointer_intrinsic(types.int8), pointer_intrinsic(types.int32)
_p_u32, _p_i64 = pointer_intrinsic(types.uint32), pointer_intrinsic(types.int64)
_p_u64 = pointer_intrinsic(types.uint64)


@njit(cache=True, nogil=True)
def _key_hash(ht, buf, s, n):
    """``index_key_hash(topic + "#" + key)`` from ``ht``, the unsigned 32-bit hash of ``topic#``, and the key's
    bytes (valid UTF-8): hash(a + b) = hash(a) * 31**units(b) + hash(b), mod 2**32."""
    hk = np.int64(_java_hash(buf, s, n)) & _M32
    pw = np.uint64(1)
    for j in range(s, s + n):
        c = buf[j]
        if c & 0xC0 != 0x80:  # a code point's first byte: one UTF-16 unit, two from 4-byte sequences
            pw = (pw * np.uint64(31)) & np.uint64(_M32)
            if c >= 0xF0:
                pw = (pw * np.uint64(31)) & np.uint64(_M32)
    h = np.int64((np.uint64(ht) * pw + np.uint64(hk)) & np.uint64(_M32))
    if h >= 0x80000000:
        h -= 0x100000000
    if h == -0x80000000:
        return np.int64(0)
    return -h if h < 0 else h


@njit(cache=True, nogil=True)
def _key_found(buf, ts, tl, ps, pl, sc, key_hash):
    """Whether ``key_hash`` is the index hash of ``topic#UNIQ_KEY`` or of ``topic#k`` for a key k of KEYS;
    -1: the properties hold more pairs than ``sc`` (Python must look)."""
    k = _parse_props(buf, ps, pl, sc)
    if k < 0:
        return -1
    ht = np.int64(_java_hash(buf, ts, tl)) & _M32
    ht = (ht * 31 + 35) & _M32  # '#'
    q = _find(buf, sc, k, _UNIQ)
    if q >= 0 and _key_hash(ht, buf, sc[q, 2], sc[q, 3]) == key_hash:
        return 1
    q = _find(buf, sc, k, _KEYS)
    if q >= 0:
        a = sc[q, 2]
        e = a + sc[q, 3]
        while a < e:
            b = a
            while b < e and buf[b] != 32:  # KEY_SEPARATOR; empty keys are dropped
                b += 1
            if b > a and _key_hash(ht, buf, a, b - a) == key_hash:
                return 1
            a = b + 1
    return 0


@njit(cache=True, nogil=True)
def _message_status(buf, ts, tl, ps, pl, sc, kh, sys_flag):
    """A message's status bits (key, rollback) or S_PYTHON (text that is not valid UTF-8, too many properties)."""
    if not (_utf8_ok(buf, ts, tl) and _utf8_ok(buf, ps, pl)):
        return S_PYTHON
    found = _key_found(buf, ts, tl, ps, pl, sc, kh)
    if found < 0:
        return S_PYTHON
    st = 0 if found else S_KEY
    if sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
        st |= S_ROLLBACK
    return st


@njit(cache=True, nogil=True)
def record_keys(buf, i0, n, ts, tl, ps, pl, sys_flag, sc, hashes, rows, cap, python, out):
    """The keyHashes ``IndexService.buildIndex`` puts for rows ``i0 .. n-1`` of a walk batch, in order: per record
    ``topic#UNIQ_KEY``, then ``topic#k`` for each non-empty space-separated element of KEYS; none for a ROLLBACK.
    ``hashes[m]``/``rows[m]``: the m-th key's hash and row. ``python[i]`` 1: the pure decoder must give row i's
    keys (text that is not valid UTF-8, more properties than ``sc`` holds). Stops before a row whose keys would
    not fit in ``cap``: ``out`` = (keys written, the next row)."""
    m = 0
    i = i0
    while i < n:
        python[i] = 0
        if sys_flag[i] & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
            i += 1
            continue
        t, tn, p, pn = ts[i], tl[i], ps[i], pl[i]
        if not (_utf8_ok(buf, t, tn) and _utf8_ok(buf, p, pn)):
            python[i] = 1
            i += 1
            continue
        k = _parse_props(buf, p, pn, sc)
        if k < 0:
            python[i] = 1
            i += 1
            continue
        if m + 1 + (pn + 1) // 2 > cap:  # a record's keys number at most 1 + half its properties' bytes
            if m == 0:
                python[i] = 1  # keys enough to fill a batch's room on their own: the pure decoder
                i += 1
                continue
            break
        ht = np.int64(_java_hash(buf, t, tn)) & _M32
        ht = (ht * 31 + 35) & _M32  # '#'
        q = _find(buf, sc, k, _UNIQ)
        if q >= 0:
            hashes[m] = _key_hash(ht, buf, sc[q, 2], sc[q, 3])
            rows[m] = i
            m += 1
        q = _find(buf, sc, k, _KEYS)
        if q >= 0:
            a = sc[q, 2]
            e = a + sc[q, 3]
            while a < e:
                b = a
                while b < e and buf[b] != 32:  # KEY_SEPARATOR; empty keys are dropped
                    b += 1
                if b > a:
                    hashes[m] = _key_hash(ht, buf, a, b - a)
                    rows[m] = i
                    m += 1
                a = b + 1
        i += 1
    out[0] = m
    out[1] = i


@njit(cache=True, nogil=True)
def record_prop(buf, i0, n, ps, pl, sc, name, start, length, python):
    """The value of property ``name`` (bytes) in rows ``i0 .. n-1`` of a walk batch, as ``parse_properties`` reads
    it (the last of repeated names; a value is never empty): its byte range ``start[i]``/``length[i]``, or
    ``length[i]`` -1 without one. ``python[i]`` 1: the pure decoder must read row i (properties that are not
    valid UTF-8, more pairs than ``sc`` holds)."""
    for i in range(i0, n):
        python[i] = 0
        length[i] = -1
        p, pn = ps[i], pl[i]
        if not _utf8_ok(buf, p, pn):
            python[i] = 1
            continue
        k = _parse_props(buf, p, pn, sc)
        if k < 0:
            python[i] = 1
            continue
        q = _find(buf, sc, k, name)
        if q >= 0:
            start[i] = sc[q, 2]
            length[i] = sc[q, 3]


@njit(cache=True, nogil=True)
def _window_end(idx, entries_start, i, count, phy, seg_lo, size, win):
    """Where a walk from entry i's record should stop: after the record of the last of the next entries (up to
    ``win`` offsets) that climb in the same segment no sparser than ``DENSE_BYTES`` per offset."""
    last = phy
    taken = 1
    j = i + 1
    while j < count and taken < win:
        pj = np.int64(ld_be64(idx, entries_start + INDEX_SIZE * j + ENTRY_PHY))
        if pj < last or pj - seg_lo >= size or pj - phy > DENSE_BYTES * taken:
            break
        if pj != last:
            taken += 1
            last = pj
        j += 1
    return last - seg_lo + 1


@njit(cache=True, nogil=True)
def index_entries(idx, entries_start, i0, count, seg_start, seg_end, seg_size, seg_addr, min_off, valid_end,
                  recovery_end, begin_ts, max_record, page_budget, win, status, sc, cols, out):
    """Status of entries i0 .. count-1 (see the module docs), stopping early once the records read span
    ``page_budget`` commitlog pages. ``seg_end``: where ``CommitLog.segment_for`` stops counting an offset as
    the segment's; ``seg_size``: the mapped bytes (``seg_addr`` 0: not mapped, Python decodes). ``out``: [0]
    first message entry, [1] its store time, [2] last message entry, [3] its store time (-1: none; kept across
    calls), [4] the next entry, [5] [6] the lowest and highest commitlog offset read.

    One walk call decodes the records of a run of climbing entries (``win`` rows in ``cols``): a row is exactly
    what a walk started at its own position decodes (the walk's checks of a record read only that record), so an
    entry's record is a message iff it is a row; an entry between rows starts a walk of its own."""
    nseg = seg_start.size
    z = np.int64(0)  # a null pointer: the walk fills no derived columns here
    stats = carray(_p_i64(cols[24]), (2,))
    c_pos, c_size = carray(_p_i64(cols[0]), (win,)), carray(_p_i32(cols[1]), (win,))
    c_sysflag, c_store_ts = carray(_p_i32(cols[8]), (win,)), carray(_p_i64(cols[12]), (win,))
    c_topic_start, c_topic_len = carray(_p_i64(cols[19]), (win,)), carray(_p_i32(cols[20]), (win,))
    c_props_start, c_props_len = carray(_p_i64(cols[21]), (win,)), carray(_p_i32(cols[22]), (win,))
    pages = 0
    lo_off = np.int64(1) << 62
    hi_off = np.int64(-1)
    win_seg = -1
    win_n = 0
    i = i0 - 1
    while i + 1 < count and pages < page_budget:
        i += 1
        p = entries_start + INDEX_SIZE * i
        kh = np.int64(ld_be32(idx, p))
        phy = np.int64(ld_be64(idx, p + ENTRY_PHY))
        td = np.int64(ld_be32(idx, p + ENTRY_TIME_DIFF))
        row = -1
        if phy < min_off:
            status[i] = S_EXPIRED
            continue
        lo, hi, k = 0, nseg - 1, -1
        while lo <= hi:
            mid = (lo + hi) // 2
            if phy < seg_start[mid]:
                hi = mid - 1
            elif phy >= seg_end[mid]:
                lo = mid + 1
            else:
                k = mid
                break
        if k < 0:
            st = S_DANGLING
        elif seg_addr[k] == 0:
            status[i] = S_PYTHON
            continue
        else:
            size = seg_size[k]
            buf = carray(_p_u8(seg_addr[k]), (size,))
            pos = phy - seg_start[k]
            if win_seg == k and win_n > 0 and c_pos[0] <= pos <= c_pos[win_n - 1]:
                lo, hi = 0, win_n - 1
                while lo <= hi:
                    mid = (lo + hi) // 2
                    if pos < c_pos[mid]:
                        hi = mid - 1
                    elif pos > c_pos[mid]:
                        lo = mid + 1
                    else:
                        row = mid
                        break
            code = 0
            if row < 0:
                lim = _window_end(idx, entries_start, i, count, phy, seg_start[k], size, win)
                win_n, end, code = walk(
                    buf, pos, size, size, max_record, False, 0, 0, win, lim,
                    c_pos, c_size, carray(_p_u32(cols[2]), (win,)), carray(_p_i32(cols[3]), (win,)),
                    carray(_p_i32(cols[4]), (win,)), carray(_p_i32(cols[5]), (win,)), carray(_p_i64(cols[6]), (win,)),
                    carray(_p_i64(cols[7]), (win,)), c_sysflag, carray(_p_i64(cols[9]), (win,)),
                    carray(_p_u64(cols[10]), (win, 2)), carray(_p_i32(cols[11]), (win,)), c_store_ts,
                    carray(_p_u64(cols[13]), (win, 2)), carray(_p_i32(cols[14]), (win,)),
                    carray(_p_i32(cols[15]), (win,)), carray(_p_i64(cols[16]), (win,)), carray(_p_i32(cols[17]), (win,)),
                    carray(_p_i64(cols[18]), (win,)), c_topic_start, c_topic_len, c_props_start, c_props_len,
                    carray(_p_i8(cols[23]), (win,)), seg_start[k], stats, CRC_TABLES, _SCHEDULE, _DELAY, False,
                    carray(_p_i32(z), (0,)), carray(_p_i8(z), (0,)), carray(_p_i64(z), (0,)), carray(_p_u64(z), (0,)),
                    carray(_p_i32(z), (0,)), 0, carray(_p_u8(z), (0,)), carray(_p_i64(z), (0,)),
                    carray(_p_i64(z), (0,)), 0, carray(_p_i64(z), (0,)))  # no derived columns
                win_seg = k
                end = max(end, phy - seg_start[k] + 1)  # the page a failed decode read
                pages += ((end - 1) >> 12) - (pos >> 12) + 1
                lo_off = min(lo_off, phy)
                hi_off = max(hi_off, seg_start[k] + end)
                if win_n > 0:
                    row = 0
            if row < 0:
                st = S_PYTHON if code == DEFER else S_DANGLING  # DEFER: the delay topic's DELAY, Python judges
            else:
                st = _message_status(buf, c_topic_start[row], np.int64(c_topic_len[row]), c_props_start[row],
                                     np.int64(c_props_len[row]), sc, kh, c_sysflag[row])
                if st != S_PYTHON and i > 1 and begin_ts > 0:
                    d = c_store_ts[row] - begin_ts
                    exp = min(d // 1000, 0x7FFFFFFF) if d > 0 else 0
                    if td != exp:
                        st |= S_TIME
        if st == S_DANGLING and (phy >= valid_end or (recovery_end >= 0 and phy >= recovery_end)):
            st = S_BEYOND
        status[i] = st
        if st & (S_DANGLING | S_BEYOND | S_PYTHON):
            continue
        store_ts = c_store_ts[row]
        if out[0] < 0:
            out[0], out[1] = i, store_ts
        out[2], out[3] = i, store_ts
    out[4], out[5], out[6] = i + 1, lo_off, hi_off


@njit(cache=True, nogil=True)
def _event(ev, ev_n, cls_count, keep, cls, a, b, c):
    if cls_count[cls] < keep and ev_n < ev.shape[0]:
        ev[ev_n, 0], ev[ev_n, 1], ev[ev_n, 2], ev[ev_n, 3] = cls, a, b, c
        ev_n += 1
    cls_count[cls] += 1
    return ev_n


@njit(cache=True, nogil=True)
def index_chains(idx, n_slots, slots_n, entries_start, count, chain_slot, keep, ev, cls_count, out):
    """The slot chains as ``index_checks._chains_pure`` walks them. ``out``: [0] events kept, [1] slots in use,
    [2] entries on no chain, [3] the first of them (-1: none)."""
    for i in range(count):
        chain_slot[i] = -1
    ev_n = 0
    used = 0
    for s in range(n_slots):
        head = np.int64(ld_be32(idx, INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * s))
        if head == 0:
            continue
        if head < 0 or head >= count:
            ev_n = _event(ev, ev_n, cls_count, keep, EV_SLOT_INVALID, s, head, 0)
            continue
        used += 1
        cur = head
        seen = 0
        while cur > 0:
            cs = chain_slot[cur]
            if cs == s:
                ev_n = _event(ev, ev_n, cls_count, keep, EV_CYCLE, s, cur, 0)
                break
            if cs != -1:
                ev_n = _event(ev, ev_n, cls_count, keep, EV_MERGE, cur, cs, s)
                break
            chain_slot[cur] = s
            p = entries_start + INDEX_SIZE * cur
            h = np.int64(ld_be32(idx, p))
            r = h % slots_n
            if r < 0:
                r += slots_n
            if r != s:
                ev_n = _event(ev, ev_n, cls_count, keep, EV_SLOT_MISMATCH, cur, h, s)
            prev = np.int64(ld_be32(idx, p + ENTRY_PREV))
            if prev == cur:
                ev_n = _event(ev, ev_n, cls_count, keep, EV_ORDER_SELF, cur, prev, 0)
                break
            if prev >= cur or prev < 0 or prev >= count:
                if prev != 0:
                    ev_n = _event(ev, ev_n, cls_count, keep, EV_ORDER, cur, prev, 0)
                break
            cur = prev
            seen += 1
            if seen > count:
                break
    first = -1
    unreachable = 0
    for i in range(1, count):
        if chain_slot[i] == -1:
            if first < 0:
                first = i
            unreachable += 1
    out[0], out[1], out[2], out[3] = ev_n, used, unreachable, first


@njit(cache=True, nogil=True)
def index_reachable(idx, n_slots, entries_start, count, chain_slot, own):
    """``index_checks._own_slot_reachable`` (the same work bound)."""
    budget = 4 * count + n_slots
    for i in range(count):
        own[i] = 0
    for s in range(n_slots):
        head = np.int64(ld_be32(idx, INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * s))
        cur = head if 0 < head < count else 0
        while cur > 0:
            budget -= 1
            if budget < 0:
                return 0
            p = entries_start + INDEX_SIZE * cur
            r = np.int64(ld_be32(idx, p)) % n_slots
            if r < 0:
                r += n_slots
            if r == s:
                own[cur] = 1
            prev = np.int64(ld_be32(idx, p + ENTRY_PREV))
            if prev >= cur or prev < 0:
                break
            cur = prev
    for i in range(1, count):
        if chain_slot[i] != -1 and own[i] == 0:
            return 0
    return 1


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def entries_c(a):
    """``index_entries`` over raw pointers (the E_* argument block)."""
    nseg = a[E_NSEG]
    count = a[E_COUNT]
    index_entries(
        carray(_p_u8(a[E_IDX]), (a[E_IDX_SIZE],)), a[E_ENTRIES_START], a[E_I0], count,
        carray(_p_i64(a[E_SEG_START]), (nseg,)), carray(_p_i64(a[E_SEG_END]), (nseg,)),
        carray(_p_i64(a[E_SEG_SIZE]), (nseg,)), carray(_p_i64(a[E_SEG_ADDR]), (nseg,)), a[E_MIN_OFF],
        a[E_VALID_END], a[E_RECOVERY_END], a[E_BEGIN_TS], a[E_MAX_RECORD], a[E_PAGE_BUDGET], a[E_WIN],
        carray(_p_u8(a[E_STATUS]), (count,)),
        carray(_p_i64(a[E_SCRATCH]), (a[E_SCRATCH_CAP], 4)), carray(_p_i64(a[E_WALK_COLS]), (25,)),
        carray(_p_i64(a[E_OUT]), (8,)))


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def chains_c(a):
    """``index_chains`` (C_OWN 0) or ``index_reachable`` (C_OWN: its scratch; the answer in out[0])
    over raw pointers (the C_* argument block)."""
    count = a[C_COUNT]
    idx = carray(_p_u8(a[C_IDX]), (a[C_IDX_SIZE],))
    chain_slot = carray(_p_i32(a[C_CHAIN_SLOT]), (count,))
    out = carray(_p_i64(a[C_OUT]), (4,))
    if a[C_OWN] != 0:
        out[0] = index_reachable(idx, a[C_N_SLOTS], a[C_ENTRIES_START], count, chain_slot,
                                 carray(_p_u8(a[C_OWN]), (count,)))
    else:
        index_chains(idx, a[C_N_SLOTS], a[C_SLOTS_N], a[C_ENTRIES_START], count, chain_slot, a[C_KEEP],
                     carray(_p_i64(a[C_EV]), (a[C_EV_CAP], 4)), carray(_p_i64(a[C_CLASS_COUNT]), (8,)), out)


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def keys_c(a):
    """``record_keys`` over raw pointers (the K_* argument block)."""
    n, cap = a[K_N], a[K_CAP]
    record_keys(carray(_p_u8(a[K_BUF]), (a[K_BUF_SIZE],)), a[K_I0], n, carray(_p_i64(a[K_TOPIC_START]), (n,)),
                carray(_p_i32(a[K_TOPIC_LEN]), (n,)), carray(_p_i64(a[K_PROPS_START]), (n,)),
                carray(_p_i32(a[K_PROPS_LEN]), (n,)), carray(_p_i32(a[K_SYS_FLAG]), (n,)),
                carray(_p_i64(a[K_SCRATCH]), (a[K_SCRATCH_CAP], 4)), carray(_p_i64(a[K_HASHES]), (cap,)),
                carray(_p_i32(a[K_ROWS]), (cap,)), cap, carray(_p_u8(a[K_PYTHON]), (n,)),
                carray(_p_i64(a[K_OUT]), (2,)))


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def prop_c(a):
    """``record_prop`` over raw pointers (the P_* argument block)."""
    n = a[P_N]
    record_prop(carray(_p_u8(a[P_BUF]), (a[P_BUF_SIZE],)), a[P_I0], n, carray(_p_i64(a[P_PROPS_START]), (n,)),
                carray(_p_i32(a[P_PROPS_LEN]), (n,)), carray(_p_i64(a[P_SCRATCH]), (a[P_SCRATCH_CAP], 4)),
                carray(_p_u8(a[P_NAME]), (a[P_NAME_LEN],)), carray(_p_i64(a[P_START]), (n,)),
                carray(_p_i32(a[P_LEN]), (n,)), carray(_p_u8(a[P_PYTHON]), (n,)))


@cfunc(types.void(types.CPointer(types.int64)), nopython=True, cache=True)
def info_c(a):
    """a[0..3] <- the E_*, C_*, K_* and P_* block sizes this build expects."""
    a[0] = E_BLOCK
    a[1] = C_BLOCK
    a[2] = K_BLOCK
    a[3] = P_BLOCK


ENTRY_POINTS = {"rmqdump_index_entries": entries_c, "rmqdump_index_chains": chains_c, "rmqdump_index_keys": keys_c,
                "rmqdump_index_prop": prop_c, "rmqdump_index_info": info_c}


def build_shared_library(path: str, cc: str = "cc") -> None:
    """Link the entry points into ``path`` (see :mod:`rmqdump.fast._link`)."""
    link_shared_library(ENTRY_POINTS, path, cc, "indexjoin")


if __name__ == "__main__":  # python -m rmqdump.fast._indexkernels OUTPUT.so [CC]
    import sys

    build_shared_library(sys.argv[1], *(sys.argv[2:3] or ["cc"]))
