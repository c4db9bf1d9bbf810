"""What a producer sends (:class:`MessageSpec`), where a record landed (:class:`Appended`), client msgIds
(:func:`make_uniq_key`) and body compression (:func:`compress_body`): the writer's plain values."""

from __future__ import annotations

import calendar
import functools
import time
import zlib
from dataclasses import dataclass, field

from rmqdump.codec.encoder import properties_bytes
from rmqdump.codec.layout import (
    COMPRESSED_FLAG,
    COMPRESSION_TYPE_BY_NAME,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANSACTION_NOT_TYPE,
    UNIQ_ID_TAIL,
)
from rmqdump.codec.properties import parse_properties
from rmqdump.errors import FormatError


@functools.lru_cache(maxsize=64)
def _month_start_ms(day: int) -> int:
    """The UTC month start (epoch ms) of ``day`` (days since the epoch); FormatError outside the calendar."""
    try:
        t = time.gmtime(day * 86400)
        return calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)) * 1000
    except (OverflowError, OSError, ValueError):
        raise FormatError(f"born timestamp {day * 86_400_000} ms and after is outside the calendar: no client id "
                          "(UNIQ_KEY) can be made for it; give one") from None


def make_uniq_key(ip: bytes, pid: int, classloader: int, epoch_ms: int, counter: int) -> str:
    """A client msgId in ``MessageClientIDSetter``'s layout (time since the UTC month start)."""
    month_start = _month_start_ms(epoch_ms // 86_400_000)
    return (ip + UNIQ_ID_TAIL.pack(pid & 0xFFFF, classloader, (epoch_ms - month_start) & 0xFFFFFFFF,
                                 counter & 0xFFFF)).hex().upper()


@dataclass(slots=True)
class MessageSpec:
    """What a producer sends, plus the broker-side fields a forensic writer may pin."""

    topic: str
    body: bytes = b""
    queue_id: int = 0
    tags: str | None = None
    keys: str | list[str] | None = None
    properties: dict[str, str] = field(default_factory=dict)
    properties_raw: bytes | None = None  # exact stored properties string (overrides the above)
    flag: int = 0
    transaction: int = TRANSACTION_NOT_TYPE
    compression: str | None = None  # zlib | lz4 | zstd | "legacy-zlib": compress ``body`` first
    born_timestamp: int | None = None
    store_timestamp: int | None = None
    born_host: str = "127.0.0.1:34732"
    store_host: str | None = None
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    uniq_key: str | None = None
    auto_uniq_key: bool = True
    magic: int | None = None
    record_crc: bool = False  # 5.2+ __CRC32# property
    queue_offset: int | None = None  # pin (forensic copies); None = assign like the broker
    compressed_flags: int = 0  # body is already stored form: these COMPRESSED|type bits are set as-is
    extra_sys_flag: int = 0  # other sysflag bits to keep (only MULTI_TAGS_FLAG is passed through)
    source_offset: int | None = None  # offset in the store a copied record came from (re-points tx offsets)

    def properties_dict(self) -> dict[str, str]:
        """The properties as the broker's parser reads them back (``properties_raw`` is parsed)."""
        if self.properties_raw is not None:
            return parse_properties(self.properties_raw.decode("utf-8", "replace"))
        return {k: v for k, v in self._props().items() if len(k) + len(v) >= 2 and k and v}

    def build_properties(self) -> bytes:
        if self.properties_raw is not None:
            return self.properties_raw
        return properties_bytes(self._props())

    def _props(self) -> dict[str, str]:
        props: dict[str, str] = {}
        if self.keys:
            props[PROPERTY_KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        if self.uniq_key:
            props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = self.uniq_key
        props.update(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        return props

    def has_uniq_key(self) -> bool:
        if self.uniq_key:
            return True
        if self.properties_raw is not None:
            return True  # raw properties are written verbatim: never add a key to them
        return PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX in self.properties


@dataclass
class Appended:
    """Where a record landed (``blank_at``: offset of the end-of-file blank written before it)."""

    offset: int
    size: int
    queue_offset: int
    msg_id: str
    uniq_key: str | None
    topic: str
    queue_id: int
    store_timestamp: int = 0
    blank_at: int | None = None


def compress_body(body: bytes, compression: str | None) -> tuple[bytes, int]:
    """(stored body, sysflag bits) for a compression choice."""
    if not compression or compression == "none":
        return body, 0
    if compression == "legacy-zlib":
        return zlib.compress(body, 5), COMPRESSED_FLAG
    if compression == "zlib":
        return zlib.compress(body, 5), COMPRESSED_FLAG | COMPRESSION_TYPE_BY_NAME["zlib"]
    if compression == "lz4":
        import lz4.frame

        return lz4.frame.compress(body), COMPRESSED_FLAG | COMPRESSION_TYPE_BY_NAME["lz4"]
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(body), COMPRESSED_FLAG | COMPRESSION_TYPE_BY_NAME["zstd"]
    raise FormatError(f"unknown compression {compression!r}")

