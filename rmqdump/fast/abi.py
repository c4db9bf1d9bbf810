"""The compiled kernels' ABI: argument-block slots, return codes and column order shared by the
numba kernels (``_kernels``, ``_jsonkernels``) and their numba-free callers (``walk``, ``render``,
``analysis.verify.fast``). A change here changes every cached library's key (``walk._abi``)."""

from __future__ import annotations

from rmqdump.codec.record import (
    BAD_BLANK,
    BAD_FIELD,
    BAD_MAGIC,
    BAD_TOTALSIZE,
    BODY_CRC,
    END_OF_DATA,
    LENGTH_MISMATCH,
    TRUNCATED,
)

# --- walk / verify kernels (_kernels) ---------------------------------------------------------------

# Kernel kind codes, index = code - INVALID (see rmqdump.fast._kernels).
KINDS: tuple[str, ...] = (END_OF_DATA, BAD_MAGIC, BAD_TOTALSIZE, TRUNCATED, LENGTH_MISMATCH, BODY_CRC,
                          BAD_FIELD, BAD_BLANK)

# (name, numpy dtype) of every column of a RecordBatch; *_start are segment positions.
COLUMNS: tuple[tuple[str, str], ...] = (
    ("file_pos", "int64"), ("size", "int32"), ("magic", "uint32"), ("body_crc", "int32"),
    ("queue_id", "int32"), ("flag", "int32"), ("queue_offset", "int64"), ("physical_offset", "int64"),
    ("sys_flag", "int32"), ("born_timestamp", "int64"), ("born_addr", "16u1"), ("born_port", "int32"),
    ("store_timestamp", "int64"), ("store_addr", "16u1"), ("store_port", "int32"), ("reconsume_times", "int32"),
    ("prepared_transaction_offset", "int64"), ("body_length", "int32"), ("body_start", "int64"),
    ("topic_start", "int64"), ("topic_length", "int32"), ("properties_start", "int64"),
    ("properties_length", "int32"), ("crc_ok", "int8"),
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)

# Kernel return codes (see rmqdump.fast._kernels.walk).
FULL = 0  # batch full (records or bytes); resume at the returned position
SEG_END = 1  # a record ended exactly at the end of the segment
BLANK = 2  # a valid end-of-file BLANK at the returned position
LIMIT = 3  # reached the caller's limit position (--to-offset)
DEFER = 4  # a record the Python decoder must judge (DELAY property on SCHEDULE_TOPIC_XXXX)
INVALID = 16  # INVALID + k: invalid record of kind KINDS[k]
CRC_TABLE = 0  # slice-by-8 table CRC
CRC_CLMUL = 1  # PCLMULQDQ folding CRC

# The int64 argument block of the walk entry point: inputs, 24 column pointers, outputs.
A_BUF, A_POS, A_SIZE, A_LIMIT, A_MAX_RECORD_SIZE, A_CHECK_CRC, A_CRC_MODE = 0, 1, 2, 3, 4, 5, 6
A_N, A_MAX_N, A_BYTE_LIMIT, A_SEG_START, A_STATS, A_COLUMNS = 7, 8, 9, 10, 11, 12
A_OUT_N, A_OUT_POS, A_OUT_CODE = 36, 37, 38
# Derived columns (verify): when A_DERIVE is 1 the walk also interns each record's topic in a bounded table
# (rmqdump.fast.intern) and fills DERIVED_COLUMNS while the record's bytes are in the cache.
A_DERIVE, A_D_COLUMNS = 40, 41  # 3 column pointers, DERIVED_COLUMNS order
A_IT_KEYS, A_IT_IDS, A_IT_MASK, A_IT_ARENA, A_IT_ARENA_SIZE, A_IT_OFF, A_IT_LEN, A_IT_CAP, A_IT_STATE = (
    44, 45, 46, 47, 48, 49, 50, 51, 52)
ARG_BLOCK_SIZE = 56
# walk_topic: the record's id in the walk's topic table (-1: not interned); equal ids of one table mean
# byte-equal topics. props_check: the verify property check (-1 must check, 0 clear, 1 clear with INNER_NUM).
# tags_hash: the Java hash of the TAGS property (0 without one), NOT_ASCII when a byte is not ASCII.
DERIVED_COLUMNS: tuple[tuple[str, str], ...] = (("walk_topic", "int32"), ("props_check", "int8"),
                                                ("tags_hash", "int64"))
NOT_ASCII = -(1 << 40)  # no tags hash from the walk (Java hashes are 32-bit)

# The int64 argument block of the verify-checks entry point (rmqdump_vscan; see rmqdump.analysis.verify.fast).
VSCAN_COLUMNS: tuple[str, ...] = (
    "file_pos", "size", "body_crc", "queue_id", "queue_offset", "physical_offset", "sys_flag", "born_timestamp",
    "born_port", "store_timestamp", "store_addr", "store_port", "reconsume_times", "prepared_transaction_offset",
    "body_length", "topic_start", "topic_length", "properties_start", "properties_length")
V_BUF, V_SIZE, V_I0, V_N, V_SEG_START, V_COLUMNS = 0, 1, 2, 3, 4, 5
V_HT_KEYS, V_HT_IDS, V_HT_MASK, V_ARENA, V_ARENA_SIZE, V_ARENA_OFF, V_ARENA_LEN = 24, 25, 26, 27, 28, 29, 30
V_TFLAGS, V_TCOUNT, V_TOPIC_CAP, V_QT_KEYS, V_QT_SLOTS, V_QT_MASK = 31, 32, 33, 34, 35, 36
V_Q_NEXT, V_Q_COUNT, V_Q_PY, V_QUEUE_CAP, V_STATE, V_TX_OUT, V_HALF_OUT, V_OUT_CAP = 37, 38, 39, 40, 41, 42, 43, 44
V_OUT_I, V_OUT_CODE = 45, 46
# the walk's derived columns (V_DERIVED 1: walk_topic, props_check) and the walk-topic -> topic map
V_DERIVED, V_D_TID, V_D_PV, V_WMAP, V_WMAP_CAP = 48, 49, 50, 51, 52
V_BLOCK_SIZE = 56


# The int64 argument block of the ConsumeQueue join (rmqdump_cqjoin; see rmqdump.fast.cqjoin).
CQJOIN_COLUMNS: tuple[str, ...] = (
    "file_pos", "size", "queue_id", "queue_offset", "sys_flag", "topic_start", "topic_length", "properties_start",
    "properties_length")
J_BUF, J_SIZE, J_I0, J_N, J_SEG_START, J_COLUMNS = 0, 1, 2, 3, 4, 5
J_HT_KEYS, J_HT_IDS, J_HT_MASK, J_ARENA, J_ARENA_SIZE, J_ARENA_OFF, J_ARENA_LEN, J_TFLAGS, J_NTOPICS = (
    14, 15, 16, 17, 18, 19, 20, 21, 22)
J_QT_KEYS, J_QT_SLOTS, J_QT_MASK, J_Q_BASE, J_Q_N, J_Q_AT, J_NQ = 23, 24, 25, 26, 27, 28, 29
J_PHYS, J_SIZES, J_TAGS, J_NENTRIES, J_SCRATCH, J_SCRATCH_CAP = 30, 31, 32, 33, 34, 35
J_CODE, J_GIDX, J_TID, J_OUT_I = 36, 37, 38, 39
# the walk's derived columns (J_DERIVED 1: walk_topic, tags_hash) and the walk-topic -> topic map
J_DERIVED, J_D_TID, J_D_TAGS, J_WMAP, J_WMAP_CAP = 40, 41, 42, 43, 44
J_BLOCK_SIZE = 48
# per-record codes of the join
JCODE_SKIP, JCODE_CLEARED, JCODE_UNMATCHED, JCODE_PYTHON = 0, 1, 2, 3

# --- JSONL row kernels (_jsonkernels) ---------------------------------------------------------------

# Body modes of the JSONL kernel.
MODE_NONE, MODE_BASE64, MODE_HEX, MODE_TEXT = 0, 1, 2, 3
BODY_MODES = {"none": MODE_NONE, "base64": MODE_BASE64, "hex": MODE_HEX, "text": MODE_TEXT}
# Kernel return codes.
CODE_DONE, CODE_FULL, CODE_FALLBACK = 0, 1, 2

# The int64 argument block shared by both entry points.
B_BUF, B_SIZE, B_N, B_I0, B_OUT, B_OUT_CAP, B_MODE, B_DECOMPRESS = 0, 1, 2, 3, 4, 5, 6, 7
B_SEG_START, B_FILE, B_FILE_LEN, B_SELECT, B_LIMIT, B_SCRATCH, B_SCRATCH_CAP = 8, 9, 10, 11, 12, 13, 14
B_COLS = 15  # 24 column pointers, fastwalk.COLUMNS order
B_OUT_LEN, B_OUT_NEXT, B_OUT_CODE, B_OUT_EMITTED = 39, 40, 41, 42
C_N = 43  # C_N + 1: property bytes, + 2: topic bytes, + 3: entry bound
C_FLAGS, C_ENTRIES, C_NAME_OFF, C_NAME_DATA, C_VALUE_OFF, C_VALUE_DATA = 47, 48, 49, 50, 51, 52
C_KEYS, C_KEY_OFF, C_KEY_DATA, C_TAGS, C_UNIQ, C_TAGCODE = 53, 54, 55, 56, 58, 60
C_TOPIC, C_BORN_H, C_STORE_H, C_MSGID, C_VALID = 61, 63, 65, 67, 68
C_OUT_ENTRIES, C_OUT_KEYS = 69, 70
# export's JSONL lines: the lineage columns after "body" (B_TAIL: the UTF-8 bytes from ', "broker": ' up to
# and including ', "crc_ok": '; B_TAIL_LEN 0: scan's lines, no lineage)
B_TAIL, B_TAIL_LEN = 72, 73
BLOCK_SIZE = 76
