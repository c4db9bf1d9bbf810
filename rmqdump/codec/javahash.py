"""Java ``String.hashCode`` and the values RocketMQ derives from it (§7, §9.4)."""

from __future__ import annotations

from rmqdump.codec.layout import MESSAGE_DELAY_LEVEL, SCHEDULE_TOPIC


def java_string_hash(s: str) -> int:
    """Java ``String.hashCode()``: over UTF-16 code units, 32-bit wrap, signed."""
    h = 0
    data = s.encode("utf-16-be", "surrogatepass")
    for i in range(0, len(data), 2):
        h = (31 * h + ((data[i] << 8) | data[i + 1])) & 0xFFFFFFFF
    return h - 0x100000000 if h & 0x80000000 else h


def index_key_hash(key: str) -> int:
    """IndexFile keyHash: ``abs(hashCode)``, and 0 for ``Integer.MIN_VALUE``."""
    h = java_string_hash(key)
    if h == -0x80000000:
        return 0
    return -h if h < 0 else h


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
