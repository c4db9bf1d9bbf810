"""Hosts, offsetMsgId (§5.1) and UNIQ_KEY (§5.2)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from rmqdump.codec.layout import (
    MSG_ID_STORE_TAIL,
    OFFSET_MSG_ID_V4_HEX_LENGTH,
    OFFSET_MSG_ID_V6_HEX_LENGTH,
    UNIQ_ID_TAIL,
)
from rmqdump.errors import FormatError

_HEX = frozenset("0123456789abcdefABCDEF")


def _strict_hex(s: str, what: str) -> bytes:
    """Hex to bytes with no tolerance for spaces or other characters (``bytes.fromhex`` skips spaces)."""
    if not _HEX.issuperset(s):
        raise FormatError(f"{what} {s!r} is not hexadecimal")
    return bytes.fromhex(s)


@functools.lru_cache(maxsize=4096)
def format_host(addr: bytes, port: int) -> str:
    """``ip:port``; IPv6 as ``[addr]:port`` in compressed form (cached: a store has few hosts)."""
    if len(addr) == 4:
        return f"{addr[0]}.{addr[1]}.{addr[2]}.{addr[3]}:{port}"  # = str(IPv4Address), without importing it
    import ipaddress

    return f"[{ipaddress.IPv6Address(addr).compressed}]:{port}"


def parse_host(text: str) -> tuple[bytes, int]:
    """Inverse of :func:`format_host` (also accepts Java's ``ip|port`` spelling)."""
    import ipaddress

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
    return (store_addr + MSG_ID_STORE_TAIL.pack(store_port, physical_offset)).hex().upper()


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
    raw = _strict_hex(s, "offsetMsgId")
    n = 4 if len(raw) == 16 else 16
    port, offset = MSG_ID_STORE_TAIL.unpack(raw[n:])
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
    timestamp: int | None  # epoch ms of creation, month and zone inferred from a reference time
    utc_offset_minutes: int | None  # the producer JVM's zone offset implied by the reference


_QUARTER_HOUR = 15 * 60_000
_MAX_ZONE = 14 * 3600_000


def _month_start_ms(year: int, month: int) -> int:
    while month < 1:
        month += 12
        year -= 1
    while month > 12:
        month -= 12
        year += 1
    import calendar

    return calendar.timegm((year, month, 1, 0, 0, 0)) * 1000


def _infer_creation(time_in_month: int, reference_ms: int) -> tuple[int, int] | None:
    """(creation epoch ms, zone offset minutes) from TIME and a nearby reference (born time).

    The client's TIME is ms since the start of the month in its own zone, so
    ``reference - TIME`` is close to that local month start; snapping it to a UTC month
    start shifted by a whole quarter hour (|offset| <= 14 h) recovers both.
    """
    from datetime import datetime, timezone

    est = reference_ms - time_in_month
    dt = datetime.fromtimestamp(est / 1000, tz=timezone.utc)
    best = None
    for dm in (-1, 0, 1):
        u = _month_start_ms(dt.year, dt.month + dm)
        off = round((u - est) / _QUARTER_HOUR) * _QUARTER_HOUR
        if abs(off) <= _MAX_ZONE:
            cand = u - off + time_in_month
            if best is None or abs(cand - reference_ms) < abs(best[0] - reference_ms):
                best = (cand, off // 60_000)
    return best


def decode_uniq_key(uniq_key: str, reference_ms: int | None = None) -> UniqKey:
    """Decode a 32- or 56-hex-char UNIQ_KEY; raises :class:`FormatError` if malformed.

    The month and zone are not encoded: with ``reference_ms`` (the record's born
    timestamp) they are inferred, giving the creation time as epoch ms.
    """
    s = uniq_key.strip()
    if len(s) not in (32, 56):
        raise FormatError(f"UNIQ_KEY {uniq_key!r} must be 32 or 56 hex characters")
    raw = _strict_hex(s, "UNIQ_KEY")
    n = 4 if len(raw) == 16 else 16
    import ipaddress

    ip = str(ipaddress.ip_address(raw[:n]))
    pid, classloader, t, counter = UNIQ_ID_TAIL.unpack(raw[n:])
    inferred = _infer_creation(t, reference_ms) if reference_ms is not None else None
    ts, zone = inferred if inferred else (None, None)
    return UniqKey(ip, pid, classloader, t, counter, ts, zone)
