"""Hosts, offsetMsgId (§5.1) and UNIQ_KEY (§5.2)."""

from __future__ import annotations

import calendar
import ipaddress
import struct
from dataclasses import dataclass
from datetime import datetime, timezone

from .errors import FormatError
from .format import OFFSET_MSG_ID_V4_HEX_LENGTH, OFFSET_MSG_ID_V6_HEX_LENGTH


def format_host(addr: bytes, port: int) -> str:
    """``ip:port``; IPv6 as ``[addr]:port`` in compressed form."""
    if len(addr) == 4:
        return f"{ipaddress.IPv4Address(addr)}:{port}"
    return f"[{ipaddress.IPv6Address(addr).compressed}]:{port}"


def parse_host(text: str) -> tuple[bytes, int]:
    """Inverse of :func:`format_host` (also accepts Java's ``ip|port`` spelling)."""
    text = text.strip().replace("|", ":") if "|" in text else text.strip()
    try:
        if text.startswith("["):
            addr, _, port = text[1:].partition("]:")
            return ipaddress.IPv6Address(addr).packed, int(port)
        addr, _, port = text.rpartition(":")
        ip = ipaddress.ip_address(addr)
        return ip.packed, int(port)
    except ValueError as e:
        raise FormatError(f"bad host {text!r}: {e}") from None


def create_offset_msg_id(store_addr: bytes, store_port: int, physical_offset: int) -> str:
    """``MessageDecoder.createMessageId``: upper-case hex of addr + int32 port + int64 offset."""
    return (store_addr + struct.pack(">iq", store_port, physical_offset)).hex().upper()


@dataclass(frozen=True)
class OffsetMsgId:
    """A decoded broker-side message id."""

    address: bytes
    port: int
    offset: int

    @property
    def host(self) -> str:
        return format_host(self.address, self.port)


def decode_offset_msg_id(msg_id: str) -> OffsetMsgId:
    """``MessageDecoder.decodeMessageId``; raises :class:`FormatError` on a malformed id."""
    s = msg_id.strip()
    if len(s) not in (OFFSET_MSG_ID_V4_HEX_LENGTH, OFFSET_MSG_ID_V6_HEX_LENGTH):
        raise FormatError(f"offsetMsgId {msg_id!r} must be 32 or 56 hex characters, got {len(s)}")
    try:
        raw = bytes.fromhex(s)
    except ValueError:
        raise FormatError(f"offsetMsgId {msg_id!r} is not hexadecimal") from None
    n = 4 if len(raw) == 16 else 16
    port, offset = struct.unpack(">iq", raw[n:])
    if offset < 0:
        raise FormatError(f"offsetMsgId {msg_id!r} encodes a negative offset {offset}")
    return OffsetMsgId(raw[:n], port, offset)


@dataclass(frozen=True)
class UniqKey:
    """A decoded client message id (``MessageClientIDSetter``)."""

    ip: str
    pid: int
    classloader: int
    time_in_month_ms: int
    counter: int
    timestamp: int | None  # epoch ms, month taken from a reference time (born timestamp)


def _month_start_ms(epoch_ms: int, months_back: int) -> int:
    dt = datetime.fromtimestamp(epoch_ms / 1000, tz=timezone.utc)
    y, m = dt.year, dt.month - months_back
    while m < 1:
        m += 12
        y -= 1
    return calendar.timegm((y, m, 1, 0, 0, 0)) * 1000


def decode_uniq_key(uniq_key: str, reference_ms: int | None = None) -> UniqKey:
    """Decode a 32- or 56-hex-char UNIQ_KEY; raises :class:`FormatError` if malformed.

    The month is not encoded: with ``reference_ms`` (the record's born timestamp) the month
    start M <= reference closest to it is chosen so that M + TIME lies near the reference
    (UTC months; a producer in another time zone shifts the result by its UTC offset).
    """
    s = uniq_key.strip()
    if len(s) not in (32, 56):
        raise FormatError(f"UNIQ_KEY {uniq_key!r} must be 32 or 56 hex characters")
    try:
        raw = bytes.fromhex(s)
    except ValueError:
        raise FormatError(f"UNIQ_KEY {uniq_key!r} is not hexadecimal") from None
    n = 4 if len(raw) == 16 else 16
    ip = str(ipaddress.ip_address(raw[:n]))
    pid, classloader, t, counter = struct.unpack(">HiiH", raw[n:])
    ts = None
    if reference_ms is not None and t >= 0:
        best = None
        for back in range(0, 3):
            cand = _month_start_ms(reference_ms, back) + t
            if best is None or abs(cand - reference_ms) < abs(best - reference_ms):
                best = cand
        ts = best
    return UniqKey(ip, pid, classloader, t, counter, ts)
