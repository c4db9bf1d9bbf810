"""Java ``String.hashCode`` and the values RocketMQ derives from it (§7, §9.4)."""

from __future__ import annotations

import sys
from array import array
from operator import mul

from rmqdump.codec.layout import MESSAGE_DELAY_LEVEL, SCHEDULE_TOPIC

_POW31: list[int] = [1]  # 31**i mod 2**32, grown on demand
_LITTLE = sys.byteorder == "little"


def java_hash_u32(s: str) -> int:
    """Java ``String.hashCode()`` as an unsigned 32-bit value: the Horner sum over UTF-16 code units, done as a
    C-level dot product with powers of 31 (the one Python implementation; the JSONL kernels carry a numba twin)."""
    units = array("H", s.encode("utf-16-be", "surrogatepass"))
    if _LITTLE:
        units.byteswap()
    n = len(units)
    while len(_POW31) < n:
        _POW31.append(_POW31[-1] * 31 & 0xFFFFFFFF)
    return sum(map(mul, units, _POW31[n - 1::-1] if n else ())) & 0xFFFFFFFF


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode()``: over UTF-16 code units, 32-bit wrap, signed."""
    h = java_hash_u32(s)
    return h - 0x100000000 if h & 0x80000000 else h


def index_key_hash(key: str) -> int:
    """IndexFile keyHash (``indexKeyHashMethod``): ``abs(hashCode)``, and 0 for ``Integer.MIN_VALUE``."""
    h = java_string_hash(key)
    if h == -0x80000000:
        return 0
    return -h if h < 0 else h


_POW31_NP: list = []  # 31**i mod 2**32 as a numpy uint64 array


def index_key_hashes(keys: list[str]):
    """:func:`index_key_hash` of many keys at once (numpy int64 array; a list without numpy): the Horner sum
    vectorised, unit * 31**(units after it) mod 2**32, summed per key."""
    try:
        import numpy as np
    except ImportError:  # pragma: no cover - numpy is optional
        return [index_key_hash(k) for k in keys]
    n = len(keys)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    joined = "".join(keys)
    if joined.isascii():
        units = np.frombuffer(joined.encode("ascii"), dtype=np.uint8)
        lens = np.fromiter(map(len, keys), dtype=np.int64, count=n)
    else:
        units = np.frombuffer(joined.encode("utf-16-be", "surrogatepass"), dtype=">u2")
        lens = np.fromiter((len(k.encode("utf-16-be", "surrogatepass")) >> 1 for k in keys), dtype=np.int64, count=n)
    longest = int(lens.max())
    if not _POW31_NP or len(_POW31_NP[0]) <= longest:
        size = max(longest + 1, 256)
        pw = np.empty(size, dtype=np.uint64)
        v = 1
        for i in range(size):
            pw[i] = v
            v = v * 31 & 0xFFFFFFFF
        _POW31_NP[:] = [pw]
    ends = np.cumsum(lens)
    exps = np.repeat(ends, lens) - np.arange(1, len(units) + 1, dtype=np.int64)
    prod = (units.astype(np.uint64) * _POW31_NP[0][exps]) & np.uint64(0xFFFFFFFF)
    h = np.zeros(n, dtype=np.uint64)
    nonempty = lens > 0
    if len(units):
        h[nonempty] = np.add.reduceat(prod, (ends - lens)[nonempty])
    h &= np.uint64(0xFFFFFFFF)
    neg = (h & np.uint64(0x80000000)) != 0
    h = np.where(neg, np.uint64(0x100000000) - h, h)
    h = np.where(h == np.uint64(0x80000000), np.uint64(0), h)  # abs(Integer.MIN_VALUE) -> 0
    return h.astype(np.int64)


def index_key(topic: str, key: str) -> str:
    """The string the broker indexes: ``topic#key``."""
    return f"{topic}#{key}"


def tags_hash(tags: str | None) -> int:
    """``tagsString2tagsCode``: 0 for no tags, else the tag string's hashCode (sign-extended)."""
    if not tags:
        return 0
    return java_string_hash(tags)


def parse_delay_levels(spec: str = MESSAGE_DELAY_LEVEL) -> list[int]:
    """Parse a ``messageDelayLevel`` string ("1s 5s ... 2h") into milliseconds per level."""
    units = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
    out = []
    for item in spec.split():
        out.append(int(item[:-1]) * units[item[-1]])
    return out


DEFAULT_DELAY_LEVELS_MS = parse_delay_levels()


def dispatch_tags_code(topic: str, properties: dict[str, str], store_timestamp: int,
                       delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS) -> int:
    """The tagsCode the broker's dispatcher writes into the ConsumeQueue for a record.

    Tag hash, except for ``SCHEDULE_TOPIC_XXXX`` records with a ``DELAY`` property, where it
    is the delivery time (store time + the level's delay; unknown level -> +1000 ms).
    A malformed ``DELAY`` there makes the broker's check throw; we raise ``ValueError``.
    """
    if topic == SCHEDULE_TOPIC:
        delay = properties.get("DELAY")
        if delay is not None:
            level = min(int(delay), len(delay_levels_ms))
            if level > 0:
                ms = delay_levels_ms[level - 1] if level <= len(delay_levels_ms) else 1000
                return store_timestamp + ms
    return tags_hash(properties.get("TAGS"))
