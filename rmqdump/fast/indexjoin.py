"""The index-file ↔ commitlog join of ``verify STORE``, compiled (:mod:`rmqdump.fast._indexkernels`): the twin of
the per-entry and chain loops in :mod:`rmqdump.analysis.verify.index_checks`, which words the findings.

:func:`entry_status` reads every entry of a mapped index file and the record it points at in the mapped
commitlog segments (the walk's decoder on that one record, no CRC), and gives each entry a status byte:

``0``           a message whose ``topic#UNIQ_KEY`` or ``topic#KEYS`` element hashes to the entry's keyHash, not a
                ROLLBACK, with the timeDiff ``putKey`` stores
``S_EXPIRED``   below the commitlog's first offset
``S_BEYOND``    no message there, at or past the end of valid data
``S_DANGLING``  no message there, before it
``S_KEY`` | ``S_ROLLBACK`` | ``S_TIME``  a message the entry disagrees with (bits)
``S_PYTHON``    the Python decoder must judge it (an unmapped segment, the delay topic's DELAY, text that is not
                valid UTF-8, more than ``SCRATCH_PAIRS`` properties)

:func:`chain_events` walks the slot chains and logs what the Python walk would report (per class, the first
``keep``); :func:`own_slot_reachable` is the irregular-chain test. Memory: a status byte and a chain slot
(int32) per entry; keyHash and prevIndex are read in place from the mapped file.

Compiled once per machine into a shared library (in a child process) and loaded with ctypes, like the other
kernels; ``RMQDUMP_FAST_LIBRARY=0`` uses numba's JIT.
"""

from __future__ import annotations

import ctypes
import hashlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqdump.fast.engine import _numpy
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
    K_BLOCK,
    P_BLOCK,
    PAGE_BUDGET,
    SCRATCH_PAIRS,
    WINDOW,
    abi_key,
)

_backend: Any = None
_lock = threading.Lock()


def library_path() -> Path:
    from rmqdump.fast.engine import kernel_library_path

    here = Path(__file__).resolve()
    shared = hashlib.sha256()
    for name in ("_kernels.py", "_recordkernels.py", "_jsonkernels.py", "abi.py", "indexabi.py"):  # what they import
        shared.update(here.with_name(name).read_bytes())
    return kernel_library_path("indexjoin", "_indexkernels.py", abi_key(), shared.hexdigest())


class _Backend:
    def __init__(self, kind: str, entries, chains, keys, prop, info, keep=None):
        self.kind, self.entries, self.chains, self.keys, self.prop, self._keep = kind, entries, chains, keys, prop, keep
        block = (ctypes.c_int64 * 4)()
        info(ctypes.addressof(block))
        want = (E_BLOCK, C_BLOCK, K_BLOCK, P_BLOCK)
        if tuple(block) != want:
            raise RuntimeError(f"indexjoin kernel argument blocks {tuple(block)} != {want}")


def backend() -> _Backend:
    """Load the kernels once per process (building the shared library the first time)."""
    global _backend
    if _backend is not None:
        return _backend
    with _lock:
        if _backend is None:
            from rmqdump.fast.engine import load_kernels

            _backend = load_kernels(
                "rmqdump.fast._indexkernels", library_path,
                ("rmqdump_index_entries", "rmqdump_index_chains", "rmqdump_index_keys", "rmqdump_index_prop",
                 "rmqdump_index_info"), ("entries_c", "chains_c", "keys_c", "prop_c", "info_c"), _Backend)
        return _backend


@dataclass
class EntryStatus:
    """:func:`entry_status`'s answer: ``status[i]`` for entry i (0 unused), and the first and last entry the kernel
    found a message at, with its store time (-1: none)."""

    status: Any
    first: tuple[int, int]
    last: tuple[int, int]


def entry_status(idx, entries_start: int, count: int, segments: list[tuple[int, int, Any]], *, min_off: int,
                 valid_end: int, recovery_end: int | None, begin_ts: int, max_record_size: int,
                 release: Callable[[int, int, int, int], None] | None = None) -> EntryStatus:
    """Status of entries 1 .. count-1 of the mapped index file ``idx`` (a uint8 array). ``segments``: (start, end
    of what ``segment_for`` counts as the segment's, mapped uint8 array or None) in order. Every
    ``PAGE_BUDGET`` commitlog pages read, ``release(first entry, next entry, lowest, highest offset read)`` may
    drop the mapped pages read (the resident set stays bounded)."""
    np = _numpy()
    n = len(segments)
    starts = np.array([s for s, _, _ in segments] or [0], dtype=np.int64)
    ends = np.array([e for _, e, _ in segments] or [0], dtype=np.int64)
    sizes = np.array([(0 if b is None else b.size) for _, _, b in segments] or [0], dtype=np.int64)
    addrs = np.array([(0 if b is None or b.size == 0 else b.ctypes.data) for _, _, b in segments] or [0],
                     dtype=np.int64)
    status = np.zeros(max(count, 1), dtype=np.uint8)
    scratch = np.zeros((SCRATCH_PAIRS, 4), dtype=np.int64)
    colbuf = np.zeros((25, 2 * WINDOW), dtype=np.int64)  # WINDOW rows a walk column (<= 16 bytes a row), stats
    cols = np.array([colbuf.ctypes.data + 16 * WINDOW * k for k in range(25)], dtype=np.int64)
    out = np.full(8, -1, dtype=np.int64)
    b = np.zeros(E_BLOCK, dtype=np.int64)
    b[E_IDX], b[E_IDX_SIZE], b[E_ENTRIES_START], b[E_COUNT] = idx.ctypes.data, idx.size, entries_start, count
    b[E_NSEG], b[E_SEG_START], b[E_SEG_END] = n, starts.ctypes.data, ends.ctypes.data
    b[E_SEG_SIZE], b[E_SEG_ADDR] = sizes.ctypes.data, addrs.ctypes.data
    b[E_MIN_OFF], b[E_VALID_END] = min_off, valid_end
    b[E_RECOVERY_END] = -1 if recovery_end is None else recovery_end
    b[E_BEGIN_TS], b[E_MAX_RECORD], b[E_STATUS] = begin_ts, max_record_size, status.ctypes.data
    b[E_SCRATCH], b[E_SCRATCH_CAP], b[E_WALK_COLS], b[E_OUT] = (scratch.ctypes.data, SCRATCH_PAIRS, cols.ctypes.data,
                                                                out.ctypes.data)
    b[E_PAGE_BUDGET], b[E_WIN] = PAGE_BUDGET, WINDOW
    entries = backend().entries
    i = 1
    while i < count:
        b[E_I0] = i
        entries(b.ctypes.data)
        nxt = int(out[4])
        if release is not None:
            release(i, nxt, int(out[5]), int(out[6]))
        i = nxt
    return EntryStatus(status, (int(out[0]), int(out[1])), (int(out[2]), int(out[3])))


@dataclass
class ChainResult:
    """:func:`chain_events`' answer: kept events (rows: class, a, b, c, in walk order), events per class, slots in
    use, entries on no chain and the first of them, and the chain slot per entry (for
    :func:`own_slot_reachable`)."""

    events: list[tuple[int, int, int, int]]
    class_count: list[int]
    used: int
    unreachable: int
    first_unreachable: int
    chain_slot: Any


def _chain_block(idx, n_slots: int, entries_start: int, count: int, chain_slot):
    np = _numpy()
    b = np.zeros(C_BLOCK, dtype=np.int64)
    b[C_IDX], b[C_IDX_SIZE], b[C_N_SLOTS] = idx.ctypes.data, idx.size, n_slots
    b[C_ENTRIES_START], b[C_COUNT], b[C_CHAIN_SLOT] = entries_start, count, chain_slot.ctypes.data
    return b


def chain_events(idx, n_slots: int, slots_n: int, entries_start: int, count: int, keep: int) -> ChainResult:
    """The slot chains of the mapped index file ``idx``: ``n_slots`` slots read, keyHash % ``slots_n`` their own
    slot, entries 1 .. count-1."""
    np = _numpy()
    keep = max(keep, 1)
    chain_slot = np.empty(count, dtype=np.int32)
    ev = np.zeros((6 * keep, 4), dtype=np.int64)
    cls = np.zeros(8, dtype=np.int64)
    out = np.zeros(4, dtype=np.int64)
    b = _chain_block(idx, n_slots, entries_start, count, chain_slot)
    b[C_SLOTS_N], b[C_KEEP], b[C_EV], b[C_EV_CAP] = slots_n, keep, ev.ctypes.data, ev.shape[0]
    b[C_CLASS_COUNT], b[C_OUT] = cls.ctypes.data, out.ctypes.data
    backend().chains(b.ctypes.data)
    events = [tuple(int(v) for v in row) for row in ev[: int(out[0])]]
    return ChainResult(events, [int(v) for v in cls], int(out[1]), int(out[2]), int(out[3]), chain_slot)


def own_slot_reachable(idx, n_slots: int, entries_start: int, count: int, chain_slot) -> bool:
    """Whether every chained entry is also on its own slot's chain (``index_checks._own_slot_reachable``)."""
    np = _numpy()
    own = np.zeros(count, dtype=np.uint8)
    out = np.zeros(4, dtype=np.int64)
    b = _chain_block(idx, n_slots, entries_start, count, chain_slot)
    b[C_OUT], b[C_OWN] = out.ctypes.data, own.ctypes.data
    backend().chains(b.ctypes.data)
    return bool(out[0])
