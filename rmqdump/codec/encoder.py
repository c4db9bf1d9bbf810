"""Encode commitlog records: the exact inverse of :func:`rmqdump.codec.record.decode_record`."""

from __future__ import annotations

from rmqdump.codec.crc import body_crc, encode_crc_property_value
from rmqdump.codec.layout import (
    BLANK_MAGIC_CODE,
    BODY_LENGTH_BASE,
    BORNHOST_V6_FLAG,
    CRC32_RESERVED_LEN,
    END_FILE_MIN_BLANK_LENGTH,
    HOST_V4,
    HOST_V6,
    INT16,
    INT32,
    INT64,
    MAX_PROPERTIES_LENGTH,
    MESSAGE_FIXED_OVERHEAD,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    NAME_VALUE_SEPARATOR,
    PROPERTY_CRC32,
    PROPERTY_SEPARATOR,
    RECORD_PREFIX,
    RECORD_TAIL,
    STOREHOSTADDRESS_V6_FLAG,
    SYSFLAG_POSITION,
    TOPIC_MAX_LENGTH,
    TOTALSIZE_MAGIC,
    UINT8,
    host_lengths,
    topic_length_size,
)
from rmqdump.codec.properties import parse_properties
from rmqdump.codec.record import Message
from rmqdump.errors import FormatError


def cal_msg_length(sys_flag: int, body_length: int, topic_length: int, properties_length: int,
                   magic: int = MESSAGE_MAGIC_CODE) -> int:
    """``CommitLog.calMsgLength``: TOTALSIZE for the given field lengths."""
    bh, sh = host_lengths(sys_flag)
    tl = topic_length_size(magic)
    return MESSAGE_FIXED_OVERHEAD + bh + sh + tl + max(body_length, 0) + topic_length + max(properties_length, 0)


def _host(addr: bytes, port: int, v6: bool, what: str) -> bytes:
    host = HOST_V6 if v6 else HOST_V4
    if len(addr) != host.size - 4:
        raise FormatError(f"{what} address of {len(addr)} bytes does not match the sysflag IPv6 bit")
    return host.pack(addr, port)


def encode_fields(*, topic: bytes, body: bytes, properties: bytes, queue_id: int = 0, flag: int = 0,
                  queue_offset: int = 0, physical_offset: int = 0, sys_flag: int = 0, born_timestamp: int = 0,
                  born_addr: bytes = b"\x7f\x00\x00\x01", born_port: int = 0, store_timestamp: int = 0,
                  store_addr: bytes = b"\x7f\x00\x00\x01", store_port: int = 10911, reconsume_times: int = 0,
                  prepared_transaction_offset: int = 0, magic: int = MESSAGE_MAGIC_CODE,
                  stored_body_crc: int | None = None, body_length: int | None = None) -> bytes:
    """Pack one record from its raw parts (``stored_body_crc`` None = compute it)."""
    blen = len(body) if body_length is None else body_length
    tl = topic_length_size(magic)
    total = cal_msg_length(sys_flag, blen, len(topic), len(properties), magic)
    crc = body_crc(body) if stored_body_crc is None else stored_body_crc
    parts = [
        RECORD_PREFIX.pack(total, magic, crc, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp),
        _host(born_addr, born_port, bool(sys_flag & BORNHOST_V6_FLAG), "born host"),
        INT64.pack(store_timestamp),
        _host(store_addr, store_port, bool(sys_flag & STOREHOSTADDRESS_V6_FLAG), "store host"),
        RECORD_TAIL.pack(reconsume_times, prepared_transaction_offset, blen),
        body,
        len(topic).to_bytes(tl, "big", signed=False) if tl == 2 else UINT8.pack(len(topic) & 0xFF),
        topic,
        INT16.pack(len(properties)),
        properties,
    ]
    return b"".join(parts)


def encode_message(msg: Message) -> bytes:
    """Re-encode a decoded record byte for byte (its body must have been read)."""
    if msg.body is None:
        raise FormatError("cannot encode a record whose body was not read", msg.file, msg.file_pos)
    return encode_fields(
        topic=msg.topic_raw, body=msg.body, properties=msg.properties_raw, queue_id=msg.queue_id, flag=msg.flag,
        queue_offset=msg.queue_offset, physical_offset=msg.physical_offset, sys_flag=msg.sys_flag,
        born_timestamp=msg.born_timestamp, born_addr=msg.born_addr, born_port=msg.born_port,
        store_timestamp=msg.store_timestamp, store_addr=msg.store_addr, store_port=msg.store_port,
        reconsume_times=msg.reconsume_times, prepared_transaction_offset=msg.prepared_transaction_offset,
        magic=msg.magic, stored_body_crc=msg.body_crc, body_length=msg.body_length,
    )


#: topic of the ROLLBACK filler records ``rmqdump repair --salvage filler`` writes over damaged
#: bytes (cut to fit small spans); their body starts with FILLER_BODY_PREFIX
FILLER_TOPIC = "rmqdump_filler"
FILLER_BODY_PREFIX = b"rmqdump repair filler:"


def is_filler(msg) -> bool:
    """Whether a decoded record looks like a repair filler (ROLLBACK, QUEUEOFFSET 0, filler topic)."""
    from rmqdump.codec.layout import TRANSACTION_ROLLBACK_TYPE, TRANSACTION_TYPE_MASK

    return (isinstance(msg, Message) and msg.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE
            and msg.queue_offset == 0 and msg.prepared_transaction_offset == 0
            and FILLER_TOPIC.encode().startswith(msg.topic_raw))


def encode_blank(bytes_to_end: int) -> bytes:
    """The 8-byte end-of-file blank: int32 distance to the end of the file + BLANK magic."""
    if bytes_to_end < END_FILE_MIN_BLANK_LENGTH:
        raise FormatError(f"a blank needs at least 8 bytes, {bytes_to_end} left")
    return TOTALSIZE_MAGIC.pack(bytes_to_end, BLANK_MAGIC_CODE)


def choose_magic(topic: str) -> int:
    """The broker's choice (5.1+ ``autoMessageVersionOnTopicLen``): V2 iff the topic's
    UTF-16 length exceeds 127; a V1 topic over 127 UTF-8 bytes is unreadable and refused."""
    units = len(topic.encode("utf-16-le", "surrogatepass")) // 2
    if units > TOPIC_MAX_LENGTH:
        return MESSAGE_MAGIC_CODE_V2
    if len(topic.encode("utf-8")) > TOPIC_MAX_LENGTH:
        raise FormatError(f"topic {topic!r} is over 127 UTF-8 bytes: a V1 record would be unreadable")
    return MESSAGE_MAGIC_CODE


def properties_bytes(props: dict[str, str], *, trailing_separator: bool = False) -> bytes:
    """Serialise properties as a 4.9.x broker stores them (no trailing 0x02 by default)."""
    for k, v in props.items():
        for part in (k, v):
            if NAME_VALUE_SEPARATOR in part or PROPERTY_SEPARATOR in part:
                raise FormatError(f"property {k!r} contains a separator character")
    s = "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items())
    if s and not trailing_separator:
        s = s[:-1]
    raw = s.encode("utf-8")
    if len(raw) > MAX_PROPERTIES_LENGTH:
        raise FormatError(f"properties are {len(raw)} bytes, over the {MAX_PROPERTIES_LENGTH} byte limit")
    return raw


def with_record_crc(record: bytes) -> bytes:
    """Append the 5.2+ ``__CRC32#`` whole-record CRC property to an encoded record (§3.3)."""
    total, magic = TOTALSIZE_MAGIC.unpack_from(record)
    if total != len(record):
        raise FormatError("record length does not match its TOTALSIZE")
    bh, sh = host_lengths(INT32.unpack_from(record, SYSFLAG_POSITION)[0])
    body_len = INT32.unpack_from(record, BODY_LENGTH_BASE + bh + sh)[0]
    q = BODY_LENGTH_BASE + 4 + bh + sh + max(body_len, 0)
    tl = topic_length_size(magic)
    topic_len = int.from_bytes(record[q:q + tl], "big")
    q += tl + topic_len
    props = record[q + 2:]
    text = props.decode("utf-8", "replace")
    if PROPERTY_CRC32 in parse_properties(text):  # drop an incoming CRC entry, as the broker does
        kept = [seg for seg in text.split(PROPERTY_SEPARATOR) if not seg.startswith(PROPERTY_CRC32 + NAME_VALUE_SEPARATOR)]
        props = PROPERTY_SEPARATOR.join(kept).encode("utf-8")
    if props and not props.endswith(PROPERTY_SEPARATOR.encode()):
        props += PROPERTY_SEPARATOR.encode()
    new_len = len(props) + CRC32_RESERVED_LEN
    if new_len > MAX_PROPERTIES_LENGTH:
        raise FormatError("properties too long for the CRC property")
    head = bytearray(record[:q]) + INT16.pack(new_len) + props
    INT32.pack_into(head, 0, len(head) + CRC32_RESERVED_LEN)
    crc = body_crc(head)
    tail = (PROPERTY_CRC32 + NAME_VALUE_SEPARATOR + encode_crc_property_value(crc) + PROPERTY_SEPARATOR).encode()
    return bytes(head) + tail
