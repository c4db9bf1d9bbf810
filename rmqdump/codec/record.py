"""Decode one commitlog record (§2) exactly as RocketMQ's ``checkMessageAndReturnSize`` does.

:func:`decode_record` returns a :class:`Message`, a :class:`Blank` (end-of-file record) or an
:class:`Invalid` verdict saying why the position is not a valid record. Header fields are
unpacked in place from the caller's buffer; the body is copied only when asked for.
"""

from __future__ import annotations

import zlib
from zlib import crc32 as _crc32

from rmqdump.codec.crc import body_crc
from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS, dispatch_tags_code
from rmqdump.codec.layout import (
    BLANK_MAGIC_CODE,
    BODY_LENGTH_BASE,
    BORN_HOST_POSITION,
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    COMPRESSION_NAMES,
    COMPRESSION_TYPE_COMPARATOR,
    CRC32_RESERVED_LEN,
    CRC_MASK,
    HOST_V4,
    HOST_V6,
    HOST_V6_LENGTH,
    INT16,
    INT64,
    MAX_PROPERTIES_LENGTH,
    MAX_RECORD_SIZE,
    MESSAGE_FIXED_OVERHEAD,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE_V1_IPV4,
    PROPERTY_CRC32,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    RECONSUME_TIMES_BASE,
    RECORD_FIXED_V4V4,
    RECORD_PREFIX,
    RECORD_TAIL,
    SCHEDULE_TOPIC,
    STORE_HOST_BASE,
    STORE_TIMESTAMP_BASE,
    STOREHOSTADDRESS_V6_FLAG,
    TOTALSIZE_MAGIC,
    TRANSACTION_NAMES,
    TRANSACTION_TYPE_MASK,
    host_lengths,
    topic_length_size,
)
from rmqdump.codec.msgid import create_offset_msg_id, format_host
from rmqdump.codec.properties import decode_properties_text, parse_properties, split_keys
from rmqdump.errors import FormatError, UnsupportedError

_FIXED_V4V4 = RECORD_FIXED_V4V4.size  # V1 magic, IPv4 hosts: one unpack up to BODYLENGTH
_SCHEDULE_TOPIC = SCHEDULE_TOPIC.encode()
_DELAY = PROPERTY_DELAY_TIME_LEVEL.encode()

# Invalid-record kinds (stable identifiers, shared with verify findings).
END_OF_DATA = "end_of_data"  # zero-filled: never written
BAD_MAGIC = "bad_magic"
BAD_TOTALSIZE = "bad_totalsize"
TRUNCATED = "truncated"
LENGTH_MISMATCH = "length_mismatch"
BODY_CRC = "body_crc"
BAD_FIELD = "bad_field"
BAD_BLANK = "bad_blank"


class Blank:
    """The end-of-file BLANK record: readers jump to the next file."""

    __slots__ = ("offset", "file", "file_pos", "size", "bytes_to_end")

    def __init__(self, offset: int, file: str, file_pos: int, size: int, bytes_to_end: int):
        self.offset, self.file, self.file_pos = offset, file, file_pos
        self.size, self.bytes_to_end = size, bytes_to_end

    def __repr__(self) -> str:
        return f"Blank(offset={self.offset}, size={self.size}, bytes_to_end={self.bytes_to_end})"


class Invalid:
    """Why a position holds no valid record (``size`` > 0 when TOTALSIZE is usable to skip)."""

    __slots__ = ("offset", "file", "file_pos", "kind", "detail", "size")

    def __init__(self, offset: int, file: str, file_pos: int, kind: str, detail: str, size: int = -1):
        self.offset, self.file, self.file_pos = offset, file, file_pos
        self.kind, self.detail, self.size = kind, detail, size

    def __repr__(self) -> str:
        return f"Invalid({self.offset}, {self.kind}: {self.detail})"


class Message:
    """A decoded commitlog record. ``body`` is None unless the decoder copied it."""

    __slots__ = (
        "offset", "file", "file_pos", "size", "magic", "body_crc", "queue_id", "flag",
        "queue_offset", "physical_offset", "sys_flag", "born_timestamp", "born_addr",
        "born_port", "store_timestamp", "store_addr", "store_port", "reconsume_times",
        "prepared_transaction_offset", "body_length", "body", "topic_raw", "properties_raw",
        "crc_ok", "_props",
    )

    def __init__(self, offset, file, file_pos, size, magic, body_crc, queue_id, flag, queue_offset,
                 physical_offset, sys_flag, born_timestamp, born_addr, born_port, store_timestamp, store_addr,
                 store_port, reconsume_times, prepared_transaction_offset, body_length, topic_raw, properties_raw,
                 body=None, crc_ok=None):
        self.offset = offset
        self.file = file
        self.file_pos = file_pos
        self.size = size
        self.magic = magic
        self.body_crc = body_crc
        self.queue_id = queue_id
        self.flag = flag
        self.queue_offset = queue_offset
        self.physical_offset = physical_offset
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.born_addr = born_addr
        self.born_port = born_port
        self.store_timestamp = store_timestamp
        self.store_addr = store_addr
        self.store_port = store_port
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.body_length = body_length
        self.topic_raw = topic_raw
        self.properties_raw = properties_raw
        self.body = body
        self.crc_ok = crc_ok
        self._props = None

    # --- derived fields -------------------------------------------------------------
    @property
    def magic_name(self) -> str:
        return "v2" if self.magic == MESSAGE_MAGIC_CODE_V2 else "v1"

    @property
    def topic(self) -> str:
        return self.topic_raw.decode("utf-8", "replace")

    @property
    def properties_text(self) -> str:
        return decode_properties_text(self.properties_raw)

    @property
    def properties(self) -> dict[str, str]:
        if self._props is None:
            self._props = parse_properties(self.properties_text)
        return self._props

    @property
    def transaction(self) -> str:
        return TRANSACTION_NAMES[self.sys_flag & TRANSACTION_TYPE_MASK]

    @property
    def compression(self) -> str:
        if not self.sys_flag & COMPRESSED_FLAG:
            return "none"
        return COMPRESSION_NAMES.get((self.sys_flag & COMPRESSION_TYPE_COMPARATOR) >> 8, "unknown")

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        return split_keys(self.properties.get(PROPERTY_KEYS))

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)

    @property
    def born_host(self) -> str:
        return format_host(self.born_addr, self.born_port)

    @property
    def store_host(self) -> str:
        return format_host(self.store_addr, self.store_port)

    @property
    def msg_id(self) -> str:
        """The broker's offsetMsgId (store host + PHYSICALOFFSET field)."""
        return create_offset_msg_id(self.store_addr, self.store_port, self.physical_offset)

    def tags_code(self, delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS) -> int:
        """tagsCode as the ConsumeQueue dispatcher computes it (delivery time on the delay topic)."""
        try:
            return dispatch_tags_code(self.topic, self.properties, self.store_timestamp, delay_levels_ms)
        except ValueError:
            raise FormatError(f"malformed DELAY property {self.properties.get(PROPERTY_DELAY_TIME_LEVEL)!r}",
                              self.file, self.file_pos) from None

    def decompressed_body(self) -> bytes:
        """The body, decompressed per its sysflag compression type."""
        if self.body is None:
            raise FormatError("body was not read", self.file, self.file_pos)
        return decompress(self.body, self.compression, self.file, self.file_pos)

    def __repr__(self) -> str:
        return (f"Message(offset={self.offset}, topic={self.topic!r}, queue_id={self.queue_id}, "
                f"queue_offset={self.queue_offset}, size={self.size})")


# Producers refuse bodies over maxMessageSize (4 MiB) before compressing them; a stored body
# that inflates past this is damage or a decompression bomb, never a legal message.
MAX_DECOMPRESSED_SIZE = 16 * 1024 * 1024


def decompress(body: bytes, compression: str, file: str | None = None, pos: int | None = None,
               limit: int = MAX_DECOMPRESSED_SIZE) -> bytes:
    """Decompress a stored body, refusing output over ``limit`` bytes (lz4/zstd need ``rmqdump[codecs]``)."""
    try:
        if compression == "none":
            return body
        if compression == "zlib":
            d = zlib.decompressobj()
            out = d.decompress(body, limit + 1)
            if len(out) <= limit and not d.eof:
                raise FormatError("cannot decompress zlib body: incomplete or truncated stream", file, pos)
        elif compression == "lz4":
            try:
                import lz4.frame
            except ImportError:
                raise UnsupportedError("lz4 body: install the lz4 package (pip install 'rmqdump[codecs]')",
                                       file, pos) from None
            out = lz4.frame.LZ4FrameDecompressor().decompress(body, max_length=limit + 1)
        elif compression == "zstd":
            try:
                import zstandard
            except ImportError:
                raise UnsupportedError("zstd body: install the zstandard package (pip install 'rmqdump[codecs]')",
                                       file, pos) from None
            import io

            with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(body)) as r:
                out = r.read(limit + 1)
        else:
            raise FormatError(f"unknown compression type {compression}", file, pos)
    except (UnsupportedError, FormatError):
        raise
    except Exception as e:  # codec errors on damaged bodies
        raise FormatError(f"cannot decompress {compression} body: {e}", file, pos) from None
    if len(out) > limit:
        raise FormatError(f"{compression} body inflates past {limit} bytes (a decompression bomb or damage; "
                          "legal bodies are at most maxMessageSize before compression)", file, pos)
    return out


def decode_record(buf, i: int, avail: int, file_pos: int, seg_start: int, file: str, *,
                  to_end: int | None = None, check_crc: bool = True, read_body: bool = True,
                  max_record_size: int = MAX_RECORD_SIZE) -> Message | Blank | Invalid:
    """Decode the record at ``buf[i:i+avail]``.

    ``to_end`` is the number of bytes from this position to the end of the file (default
    ``avail``); the buffer must hold the whole record when TOTALSIZE is plausible (see
    :func:`record_extent`). ``file_pos`` is the position in the segment, ``seg_start`` the
    segment's start offset.
    """
    offset = seg_start + file_pos
    if to_end is None:
        to_end = avail
    if to_end < 8 or avail < 8:
        if to_end <= 0 or not any(memoryview(buf)[i:i + min(avail, to_end)]):
            return Invalid(offset, file, file_pos, END_OF_DATA, "end of file")
        return Invalid(offset, file, file_pos, TRUNCATED, f"{to_end} bytes left, too few for a record header")
    total, magic = TOTALSIZE_MAGIC.unpack_from(buf, i)
    if magic == BLANK_MAGIC_CODE:
        if total != to_end:
            return Invalid(offset, file, file_pos, BAD_BLANK,
                           f"BLANK TOTALSIZE {total} is not the {to_end} bytes to the end of the file")
        return Blank(offset, file, file_pos, total, to_end)
    if magic != MESSAGE_MAGIC_CODE and magic != MESSAGE_MAGIC_CODE_V2:
        if total == 0 and magic == 0:
            return Invalid(offset, file, file_pos, END_OF_DATA, "zero TOTALSIZE (unwritten space)")
        return Invalid(offset, file, file_pos, BAD_MAGIC, f"bad MAGICCODE 0x{magic:08X} (TOTALSIZE {total})")
    if total < MIN_RECORD_SIZE_V1_IPV4:
        return Invalid(offset, file, file_pos, BAD_TOTALSIZE,
                       f"TOTALSIZE {total} is smaller than the smallest record ({MIN_RECORD_SIZE_V1_IPV4})")
    if total > to_end:
        return Invalid(offset, file, file_pos, TRUNCATED,
                       f"TOTALSIZE {total} runs past the end of the file ({to_end} bytes left)")
    if total > max_record_size:
        return Invalid(offset, file, file_pos, BAD_TOTALSIZE,
                       f"TOTALSIZE {total} exceeds the maximum record size {max_record_size}")
    if total > avail:
        return Invalid(offset, file, file_pos, TRUNCATED, f"only {avail} of TOTALSIZE {total} bytes could be read")
    if magic == MESSAGE_MAGIC_CODE and total >= _FIXED_V4V4:
        (_, _, crc, qid, flag, qoff, phys, sysflag, born_ts, born_addr, born_port, store_ts,
         store_addr, store_port, reconsume, prepared, body_len) = RECORD_FIXED_V4V4.unpack_from(buf, i)
        p = _FIXED_V4V4 if sysflag & (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG) == 0 else -1
    else:
        p = -1
    if p < 0:
        _, _, crc, qid, flag, qoff, phys, sysflag, born_ts = RECORD_PREFIX.unpack_from(buf, i)
        bh, sh = host_lengths(sysflag)
        p = BODY_LENGTH_BASE + bh + sh + 4
        if p > total:
            return Invalid(offset, file, file_pos, LENGTH_MISMATCH,
                           f"IPv6 hosts need {p + 3} header bytes, more than TOTALSIZE {total}", total)
        born_addr, born_port = (HOST_V6 if bh == HOST_V6_LENGTH else HOST_V4).unpack_from(buf, i + BORN_HOST_POSITION)
        (store_ts,) = INT64.unpack_from(buf, i + STORE_TIMESTAMP_BASE + bh)
        store_addr, store_port = (HOST_V6 if sh == HOST_V6_LENGTH else HOST_V4).unpack_from(
            buf, i + STORE_HOST_BASE + bh)
        reconsume, prepared, body_len = RECORD_TAIL.unpack_from(buf, i + RECONSUME_TIMES_BASE + bh + sh)
    avail = total  # every later field must lie inside the record
    body_pos = p
    blen = body_len if body_len > 0 else 0
    tl = topic_length_size(magic)
    if body_pos + blen + tl > avail:
        return Invalid(offset, file, file_pos, LENGTH_MISMATCH, f"BODYLEN {body_len} runs past TOTALSIZE {total}",
                       total)
    mv = memoryview(buf)
    b0 = i + body_pos
    crc_ok = None
    if check_crc and blen > 0:
        computed = _crc32(mv[b0:b0 + blen]) & CRC_MASK
        crc_ok = computed == crc
        if not crc_ok:
            return Invalid(offset, file, file_pos, BODY_CRC, f"body CRC mismatch: stored {crc}, computed {computed}",
                           total)
    q = body_pos + blen
    if tl == 1:
        topic_len = buf[i + q]
        if topic_len > 127:
            topic_len -= 256
    else:
        (topic_len,) = INT16.unpack_from(buf, i + q)
    q += tl
    if topic_len < 0:
        hint = " (RocketMQ's signed V1 topic-length bug: a topic of 128-255 UTF-8 bytes)" if tl == 1 else ""
        return Invalid(offset, file, file_pos, BAD_FIELD, f"negative topic length {topic_len}{hint}", total)
    if q + topic_len + 2 > avail:
        return Invalid(offset, file, file_pos, LENGTH_MISMATCH, f"topic length {topic_len} runs past TOTALSIZE {total}",
                       total)
    topic_raw = mv[i + q:i + q + topic_len].tobytes()
    q += topic_len
    props_len = (buf[i + q] << 8) | buf[i + q + 1]
    if props_len > MAX_PROPERTIES_LENGTH:
        props_len -= 65536
    q += 2
    plen = props_len if props_len > 0 else 0
    if q + plen > avail:
        return Invalid(offset, file, file_pos, LENGTH_MISMATCH,
                       f"PROPERTIESLEN {props_len} runs past TOTALSIZE {total}", total)
    props_raw = mv[i + q:i + q + plen].tobytes()
    # calMsgLength: 74 + BH + SH + TL + lengths, and body_pos = BODY_LENGTH_BASE + 4 + BH + SH
    expected = MESSAGE_FIXED_OVERHEAD + (body_pos - BODY_LENGTH_BASE - 4) + blen + tl + topic_len + plen
    if expected != total:
        return Invalid(offset, file, file_pos, LENGTH_MISMATCH,
                       f"TOTALSIZE {total} does not match the field lengths ({expected})", total)
    msg = Message(offset, file, file_pos, total, magic, crc, qid, flag, qoff, phys, sysflag, born_ts, born_addr,
                  born_port, store_ts, store_addr, store_port, reconsume, prepared, body_len, topic_raw, props_raw,
                  mv[b0:b0 + blen].tobytes() if read_body else None, crc_ok)
    if topic_raw == _SCHEDULE_TOPIC and _DELAY in props_raw:
        delay = msg.properties.get(PROPERTY_DELAY_TIME_LEVEL)
        if delay is not None and not _is_java_int(delay):
            return Invalid(offset, file, file_pos, BAD_FIELD, f"malformed DELAY property {delay!r} on {SCHEDULE_TOPIC}",
                           total)
    return msg


def record_extent(buf, i: int, avail: int, to_end: int, max_record_size: int = MAX_RECORD_SIZE) -> int:
    """How many bytes a reader must provide at this position for :func:`decode_record`."""
    if avail < 4:
        return min(8, to_end)
    total = int.from_bytes(memoryview(buf)[i:i + 4], "big", signed=True)
    if MIN_RECORD_SIZE_V1_IPV4 <= total <= min(to_end, max_record_size):
        return total
    return min(8, to_end)


def _is_java_int(s: str) -> bool:
    """Whether ``Integer.parseInt`` would accept ``s``."""
    t = s[1:] if s[:1] in "+-" else s
    if not t or not t.isascii() or not t.isdigit():
        return False
    return -(2**31) <= int(s) < 2**31


def record_crc_property(msg: Message, record: bytes) -> tuple[int | None, int]:
    """The 5.2+ ``__CRC32#`` whole-record CRC: (stored value or None, computed value)."""
    from rmqdump.codec.crc import decode_crc_property_value

    stored = msg.properties.get(PROPERTY_CRC32)
    computed = body_crc(record[:msg.size - CRC32_RESERVED_LEN])
    if stored is None:
        return None, computed
    try:
        return decode_crc_property_value(stored), computed
    except ValueError:
        return -1, computed
