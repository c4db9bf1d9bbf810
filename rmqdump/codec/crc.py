"""RocketMQ's CRC: standard CRC-32 masked with 0x7FFFFFFF (§3).

``crcmod``'s predefined CRC-32 is the reference implementation; ``zlib.crc32`` (identical
results, several times faster) serves the hot path. Tests check one against the other.
"""

from __future__ import annotations

import zlib

from rmqdump.codec.layout import CRC_MASK


def body_crc(data) -> int:
    """Masked CRC-32 of ``data`` as RocketMQ stores it (``UtilAll.crc32``); 0 for empty."""
    return zlib.crc32(data) & CRC_MASK


def reference_crc32(data) -> int:
    """Unmasked CRC-32 via crcmod's predefined ``crc-32`` (slow; for cross-checks)."""
    import crcmod.predefined

    fn = crcmod.predefined.mkPredefinedCrcFun("crc-32")
    return fn(bytes(data))


def reference_body_crc(data) -> int:
    """Masked CRC-32 via the crcmod reference."""
    return reference_crc32(data) & CRC_MASK


def encode_crc_property_value(crc: int) -> str:
    """``MessageDecoder.createCrc32``: 10 digits, least-significant first, '0'-padded."""
    return str(crc)[::-1].ljust(10, "0")


def decode_crc_property_value(value: str) -> int:
    """Inverse of :func:`encode_crc_property_value` (last char is the most significant)."""
    if len(value) != 10 or not value.isdigit():
        raise ValueError(f"malformed {value!r}")
    return int(value[::-1])
