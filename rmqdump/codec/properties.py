"""The properties string (§4): ``name\\x01value\\x02`` pairs, parsed as RocketMQ parses them."""

from __future__ import annotations

from rmqdump.codec.layout import KEY_SEPARATOR, NAME_VALUE_SEPARATOR, PROPERTY_SEPARATOR


def decode_properties_text(raw: bytes) -> str:
    """UTF-8 decode as Java does (malformed sequences become U+FFFD)."""
    return raw.decode("utf-8", "replace")


def parse_properties(text: str) -> dict[str, str]:
    """``MessageDecoder.string2messageProperties``.

    Split on 0x02; segments shorter than 3 chars are ignored; the first 0x01 must sit after
    position 0 and before the last char; later duplicates overwrite earlier ones.
    """
    out: dict[str, str] = {}
    if not text:
        return out
    for seg in text.split(PROPERTY_SEPARATOR):
        if len(seg) < 3:
            continue
        i = seg.find(NAME_VALUE_SEPARATOR)
        if 0 < i < len(seg) - 1:
            out[seg[:i]] = seg[i + 1:]
    return out


def serialize_properties(props: dict[str, str], trailing_separator: bool = False) -> str:
    """Build a properties string; 4.9.x brokers store it without the final 0x02."""
    s = "".join(f"{k}{NAME_VALUE_SEPARATOR}{v}{PROPERTY_SEPARATOR}" for k, v in props.items() if v is not None)
    if s and not trailing_separator:
        s = s[:-1]
    return s


def split_keys(keys: str | None) -> list[str]:
    """KEYS as the index dispatcher uses them: split on one space, empty elements dropped."""
    if not keys:
        return []
    return [k for k in keys.split(KEY_SEPARATOR) if k]
