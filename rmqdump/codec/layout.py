"""Every binary layout and constant of the RocketMQ store, named as RocketMQ names them.

Source of truth: ``../shared/format/rocketmq-store-format.md`` (RocketMQ 4.9.8 / 5.3.3).
All integers on disk are big-endian and signed unless noted.
"""

from __future__ import annotations

import struct

# --- §2.1 magic codes (unsigned 32-bit views of the signed Java ints) -------------------
MESSAGE_MAGIC_CODE = 0xDAA320A7  # V1, -626843481
MESSAGE_MAGIC_CODE_V2 = 0xDAA320AB  # V2 (5.1.0+), 2-byte topic length, -626843477
BLANK_MAGIC_CODE = 0xCBD43194  # end-of-file blank, -875286124
MAGIC_NAMES = {MESSAGE_MAGIC_CODE: "v1", MESSAGE_MAGIC_CODE_V2: "v2"}
MAGIC_BY_NAME = {v: k for k, v in MAGIC_NAMES.items()}

# --- §2.2 record field positions (general layout; hosts shift later fields) -------------
MESSAGE_MAGIC_CODE_POSITION = 4
MESSAGE_BODY_CRC_POSITION = 8
MESSAGE_QUEUE_ID_POSITION = 12
MESSAGE_FLAG_POSITION = 16
QUEUE_OFFSET_POSITION = 20
PHY_POS_POSITION = 28
SYSFLAG_POSITION = 36
BORN_TIMESTAMP_POSITION = 40
BORN_HOST_POSITION = 48

# TOTALSIZE MAGIC BODYCRC QUEUEID FLAG QUEUEOFFSET PHYSICALOFFSET SYSFLAG BORNTIMESTAMP
RECORD_PREFIX = struct.Struct(">iIiiiqqiq")  # 48 bytes, up to the born host
TOTALSIZE_MAGIC = struct.Struct(">iI")
HOST_V4 = struct.Struct(">4si")  # address + int32 port
HOST_V6 = struct.Struct(">16si")
HOST_V4_LENGTH = 8
HOST_V6_LENGTH = 20
# after the store host: RECONSUMETIMES PREPAREDTRANSACTIONOFFSET BODYLENGTH (16 bytes)
RECORD_TAIL = struct.Struct(">iqi")
# the whole fixed part of the common record (V1 magic, IPv4 born and store hosts), up to BODYLENGTH
RECORD_FIXED_V4V4 = struct.Struct(">iIiiiqqiq4siq4siiqi")  # 88 bytes
# offsets past the born host (length bh) and store host (length sh), from the record start
STORE_TIMESTAMP_BASE = BORN_HOST_POSITION  # + bh
STORE_HOST_BASE = BORN_HOST_POSITION + 8  # + bh
RECONSUME_TIMES_BASE = BORN_HOST_POSITION + 8  # + bh + sh
PREPARED_TRANSACTION_OFFSET_BASE = RECONSUME_TIMES_BASE + 4  # + bh + sh
BODY_LENGTH_BASE = RECONSUME_TIMES_BASE + 12  # + bh + sh; the body follows its 4-byte length
UINT8 = struct.Struct(">B")
INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
UINT32 = struct.Struct(">I")

# §2.5 calMsgLength: everything but BH, SH, TL and the variable parts
MESSAGE_FIXED_OVERHEAD = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 4 + 8 + 4 + 2  # 74
MIN_RECORD_SIZE_V1_IPV4 = MESSAGE_FIXED_OVERHEAD + 2 * HOST_V4_LENGTH + 1  # 91

# §2.6 end-of-file blank
END_FILE_MIN_BLANK_LENGTH = 8

# --- §2.4 SYSFLAG bits (MessageSysFlag) ------------------------------------------------
COMPRESSED_FLAG = 0x1
MULTI_TAGS_FLAG = 0x2
TRANSACTION_NOT_TYPE = 0x0
TRANSACTION_PREPARED_TYPE = 0x4
TRANSACTION_COMMIT_TYPE = 0x8
TRANSACTION_ROLLBACK_TYPE = 0xC
TRANSACTION_TYPE_MASK = 0xC
BORNHOST_V6_FLAG = 0x10
STOREHOSTADDRESS_V6_FLAG = 0x20
NEED_UNWRAP_FLAG = 0x40
INNER_BATCH_FLAG = 0x80
COMPRESSION_TYPE_COMPARATOR = 0x700
COMPRESSION_LZ4_TYPE = 0x100
COMPRESSION_ZSTD_TYPE = 0x200
COMPRESSION_ZLIB_TYPE = 0x300
SYSFLAG_KNOWN_BITS = 0x7FF  # every bit MessageSysFlag defines (4.9.8 and 5.3.3)


def host_lengths(sys_flag: int) -> tuple[int, int]:
    """The born and store host field lengths (address + port) that ``sys_flag`` selects."""
    bh = HOST_V6_LENGTH if sys_flag & BORNHOST_V6_FLAG else HOST_V4_LENGTH
    sh = HOST_V6_LENGTH if sys_flag & STOREHOSTADDRESS_V6_FLAG else HOST_V4_LENGTH
    return bh, sh


def topic_length_size(magic: int) -> int:
    """Bytes of the topic length field: 1 for the V1 magic, 2 for V2."""
    return 2 if magic == MESSAGE_MAGIC_CODE_V2 else 1


TRANSACTION_NAMES = {
    TRANSACTION_NOT_TYPE: "none",
    TRANSACTION_PREPARED_TYPE: "prepared",
    TRANSACTION_COMMIT_TYPE: "commit",
    TRANSACTION_ROLLBACK_TYPE: "rollback",
}
TRANSACTION_BY_NAME = {v: k for k, v in TRANSACTION_NAMES.items()}
# compression type value ((sysflag & 0x700) >> 8) -> name; 0 is legacy zlib
COMPRESSION_NAMES = {0: "zlib", 1: "lz4", 2: "zstd", 3: "zlib"}
COMPRESSION_TYPE_BY_NAME = {"zlib": COMPRESSION_ZLIB_TYPE, "lz4": COMPRESSION_LZ4_TYPE, "zstd": COMPRESSION_ZSTD_TYPE}

# --- §3 CRCs -------------------------------------------------------------------------
CRC_MASK = 0x7FFFFFFF
PROPERTY_CRC32 = "__CRC32#"
CRC32_RESERVED_LEN = len(PROPERTY_CRC32) + 1 + 10 + 1  # 20

# --- §4 properties (MessageConst) ----------------------------------------------------
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_INNER_NUM = "INNER_NUM"
PROPERTY_INNER_BASE = "INNER_BASE"
PROPERTY_INNER_MULTI_DISPATCH = "INNER_MULTI_DISPATCH"
PROPERTY_INNER_MULTI_QUEUE_OFFSET = "INNER_MULTI_QUEUE_OFFSET"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
DUP_INFO = "DUP_INFO"

# --- system topics ---------------------------------------------------------------------
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
RMQ_SYS_TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
RMQ_SYS_TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
TIMER_TOPIC = "rmq_sys_wheel_timer"
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
TOPIC_MAX_LENGTH = 127

# §7 default messageDelayLevel "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"

# --- §1.1 default sizes (MessageStoreConfig) --------------------------------------------
MAPPED_FILE_SIZE_COMMITLOG = 1024 * 1024 * 1024
MAPPED_FILE_SIZE_CONSUME_QUEUE = 300000 * 20
MAPPED_FILE_SIZE_CONSUME_QUEUE_EXT = 48 * 1024 * 1024
MAPPER_FILE_SIZE_BATCH_CONSUME_QUEUE = 300000 * 46
MAX_HASH_SLOT_NUM = 5000000
MAX_INDEX_NUM = 5000000 * 4
MAX_MESSAGE_SIZE = 1024 * 1024 * 4
MAX_RECORD_SIZE = MAX_MESSAGE_SIZE + 64 * 1024  # whole encoded record limit (default config)


def record_size_limit(max_message_size: int = MAX_MESSAGE_SIZE) -> int:
    """The largest whole record a broker with this ``maxMessageSize`` writes (body limit + 64 KiB of headers)."""
    return max_message_size + (MAX_RECORD_SIZE - MAX_MESSAGE_SIZE)


MAX_PROPERTIES_LENGTH = 32767
FILE_NAME_DIGITS = 20

# --- §8 consume queues ------------------------------------------------------------------
CQ_STORE_UNIT_SIZE = 20
CQ_UNIT = struct.Struct(">qiq")  # commitLogOffset, size, tagsCode
MSG_TAG_OFFSET_INDEX = 12
CQ_PRE_BLANK_SIZE = 0x7FFFFFFF
BCQ_STORE_UNIT_SIZE = 46
BCQ_UNIT = struct.Struct(">qiqqqhii")
CQ_EXT_MAX_ADDR = -2147483649  # Integer.MIN_VALUE - 1
CQ_EXT_MIN_UNIT_SIZE = 20
CQ_EXT_MAX_UNIT_SIZE = 32767

# --- §9 IndexFile -----------------------------------------------------------------------
INDEX_HEADER_SIZE = 40
INDEX_HEADER = struct.Struct(">qqqqii")
INDEX_HASH_SLOT_SIZE = 4
INDEX_SIZE = 20
INDEX_ENTRY = struct.Struct(">iqii")  # keyHash, phyOffset, timeDiff, prevIndex


def hash_slots(n: int) -> struct.Struct:
    """``n`` consecutive hash slots (int32 each: the entry number a key's chain starts at)."""
    return struct.Struct(f">{n}i")

INDEX_INVALID_INDEX = 0
INDEX_FILE_NAME_FORMAT = "%Y%m%d%H%M%S"  # + 3 digits of milliseconds = 17 digits
MAX_MSGS_NUM_BATCH = 64

# --- §10 checkpoint, abort, lock, config ---------------------------------------------------
CHECKPOINT_FILE_SIZE = 4096
CHECKPOINT = struct.Struct(">qqqqq")  # physic, logics, index, masterFlushed, confirmPhy
CHECKPOINT_MIN_TIMESTAMP_MARGIN_MS = 3000
LOCK_FILE_CONTENT = b"lock"
STORE_COMMITLOG_DIR = "commitlog"
STORE_CONSUMEQUEUE_DIR = "consumequeue"
STORE_CONSUMEQUEUE_EXT_DIR = "consumequeue_ext"
STORE_BATCH_CONSUMEQUEUE_DIR = "batchconsumequeue"
STORE_INDEX_DIR = "index"
STORE_CHECKPOINT_FILE = "checkpoint"
STORE_ABORT_FILE = "abort"
STORE_LOCK_FILE = "lock"
STORE_CONFIG_DIR = "config"

# --- §5 message ids ------------------------------------------------------------------------
OFFSET_MSG_ID_V4_HEX_LENGTH = 32
OFFSET_MSG_ID_V6_HEX_LENGTH = 56
MSG_ID_STORE_TAIL = struct.Struct(">iq")  # store port, physical offset (after the store address)
#: pid, classloader hash, ms since the producer's month start, counter. The client writes that time as
#: ``(int) (now - monthStart)``, which passes 2^31 after 24.8 days; RocketMQ reads it back unsigned
#: (``MessageClientIDSetter.getNearlyTimeFromID``), so it is an unsigned 32-bit field here.
UNIQ_ID_TAIL = struct.Struct(">HiIH")

# --- §13 5.x timer store (TimerLog, TimerWheel, Slot, TimerCheckpoint, TimerMessageStore) -----------
STORE_TIMERLOG_DIR = "timerlog"
STORE_TIMERWHEEL_FILE = "timerwheel"
TIMER_CHECK_FILE = "timercheck"  # under config/
TIMER_METRICS_FILE = "timermetrics"  # under config/
#: size prevPos magic currWriteTimeMs delayTime offsetPy sizePy realTopicHash reserved
TIMER_LOG_UNIT = struct.Struct(">iqiqiqiiq")  # 52 bytes
TIMER_LOG_UNIT_SIZE = 52
TIMER_LOG_UNIT_PRE_SIZE_FOR_MSG = 28  # offsetPy
TIMER_LOG_MIN_BLANK_LEN = 16  # int32 remaining, int64 0, int32 BLANK_MAGIC_CODE (at the unit's magic position)
#: TimerLog.BLANK_MAGIC_CODE (0xBBCCDDEE ^ 1880681586 + 8): the commitlog blank magic, signed view
TIMER_LOG_BLANK_MAGIC_CODE = BLANK_MAGIC_CODE - (1 << 32)
TIMER_MAGIC_DEFAULT = 1
TIMER_MAGIC_ROLL = 2
TIMER_MAGIC_DELETE = 4
TIMER_MAGIC_KNOWN = 0xF  # TimerMessageStore.isMagicOK: (magic | 0xF) == 0xF
MAPPED_FILE_SIZE_TIMER_LOG = 100 * 1024 * 1024
TIMER_PRECISION_MS = 1000
#: timeMs / precisionMs, firstPos, lastPos, num, magic
TIMER_SLOT = struct.Struct(">qqqii")  # 32 bytes
TIMER_SLOT_SIZE = 32
TIMER_SLOTS_TOTAL = 7 * 86400  # TIMER_WHEEL_TTL_DAY * DAY_SECS, whatever the precision
TIMER_WHEEL_SLOTS = 2 * TIMER_SLOTS_TOTAL
TIMER_WHEEL_SIZE = TIMER_WHEEL_SLOTS * TIMER_SLOT_SIZE  # 38,707,200
TIMER_BLANK_SLOTS = 60
#: lastReadTimeMs lastTimerLogFlushPos lastTimerQueueOffset masterTimerQueueOffset
#: dataVersion.stateVersion dataVersion.timestamp dataVersion.counter
TIMER_CHECKPOINT = struct.Struct(">qqqqqqq")  # 56 bytes of a 4096-byte file
TIMER_CHECKPOINT_FILE_SIZE = 4096
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
PROPERTY_TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
