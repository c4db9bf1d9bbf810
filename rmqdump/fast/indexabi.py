"""The argument blocks, entry status bits and chain event classes of the compiled index check, shared by the
numba-free caller (:mod:`rmqdump.fast.indexjoin`), its kernels (:mod:`rmqdump.fast._indexkernels`) and the pure
check that words their findings (:mod:`rmqdump.analysis.verify.index_checks`)."""

import struct

from rmqdump.codec.layout import INDEX_ENTRY

_FIELDS = INDEX_ENTRY.format.lstrip("<>!=@")  # keyHash, phyOffset, timeDiff, prevIndex
ENTRY_PHY, ENTRY_TIME_DIFF, ENTRY_PREV = (struct.calcsize(">" + _FIELDS[:k]) for k in (1, 2, 3))

# entry status bits
S_EXPIRED, S_BEYOND, S_DANGLING, S_KEY, S_ROLLBACK, S_TIME, S_PYTHON = 1, 2, 4, 8, 16, 32, 64
# chain event classes (ev rows: class, a, b, c)
EV_SLOT_INVALID, EV_CYCLE, EV_ORDER, EV_MERGE, EV_SLOT_MISMATCH, EV_ORDER_SELF = 0, 1, 2, 3, 4, 5
IRREGULAR = (EV_MERGE, EV_SLOT_MISMATCH, EV_ORDER_SELF)
# argument blocks
(E_IDX, E_IDX_SIZE, E_ENTRIES_START, E_COUNT, E_NSEG, E_SEG_START, E_SEG_END, E_SEG_SIZE, E_SEG_ADDR, E_MIN_OFF,
 E_VALID_END, E_RECOVERY_END, E_BEGIN_TS, E_MAX_RECORD, E_STATUS, E_SCRATCH, E_SCRATCH_CAP, E_WALK_COLS,
 E_OUT, E_I0, E_PAGE_BUDGET, E_WIN) = range(22)
E_BLOCK = 24
WINDOW = 64  # records one walk call decodes for a run of climbing entries
DENSE_BYTES = 2048  # a run stops where its entries lie sparser than this many commitlog bytes per offset
PAGE_BUDGET = 16384  # commitlog pages (64 MiB) read between two releases of the mapped pages
(C_IDX, C_IDX_SIZE, C_N_SLOTS, C_SLOTS_N, C_ENTRIES_START, C_COUNT, C_CHAIN_SLOT, C_KEEP, C_EV, C_EV_CAP,
 C_CLASS_COUNT, C_OUT, C_OWN) = range(13)
C_BLOCK = 16
# the index keys of walked records (repair --rebuild-index): a batch's columns in, (keyHash, row) pairs out
(K_BUF, K_BUF_SIZE, K_I0, K_N, K_TOPIC_START, K_TOPIC_LEN, K_PROPS_START, K_PROPS_LEN, K_SYS_FLAG, K_SCRATCH,
 K_SCRATCH_CAP, K_HASHES, K_ROWS, K_CAP, K_PYTHON, K_OUT) = range(16)
K_BLOCK = 16
# one property's value in each of a batch's records (its byte range, or -1), P_* block
(P_BUF, P_BUF_SIZE, P_I0, P_N, P_PROPS_START, P_PROPS_LEN, P_SCRATCH, P_SCRATCH_CAP, P_NAME, P_NAME_LEN, P_START,
 P_LEN, P_PYTHON) = range(13)
P_BLOCK = 16
SCRATCH_PAIRS = 1024


def abi_key() -> bytes:
    """The caller/kernel contract (part of the shared library's cache key)."""
    names = sorted(n for n in globals() if n[:2] in ("S_", "E_", "C_", "K_", "P_") or n.startswith(("EV_", "PAGE", "SCRATCH", "WINDOW", "DENSE", "ENTRY_")))
    return repr([(n, globals()[n]) for n in names]).encode()
