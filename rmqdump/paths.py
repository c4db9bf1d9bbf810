"""Untrusted names from store data (topics, keys) as path components that never escape a directory."""

from __future__ import annotations

import hashlib
from pathlib import Path

from .errors import StoreError

NAME_MAX = 255


def is_safe_component(name: str) -> bool:
    """Whether ``name`` can be used verbatim as one directory entry (as the broker would)."""
    if not name or name in (".", "..") or "/" in name or "\x00" in name or "\\" in name:
        return False
    return len(name.encode("utf-8", "surrogatepass")) <= NAME_MAX


def safe_child(base: Path, name: str) -> Path:
    """``base / name`` for a broker-compatible name; refuses names that would escape or fail."""
    if not is_safe_component(name):
        raise StoreError(f"refusing unsafe directory name {name!r} (path separator, NUL, dot entry or over "
                         f"{NAME_MAX} bytes)", base)
    return base / name


def encode_component(name: str) -> str:
    """A reversible-enough, always-safe directory name for any string (export partitions).

    Percent-encodes ``%``, ``/``, ``\\``, NUL and control characters, spells dot entries
    out, and shortens names over 200 bytes to a prefix plus a SHA-256 suffix.
    """
    out = []
    for ch in name:
        if ch in "%/\\" or ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append("".join(f"%{b:02X}" for b in ch.encode("utf-8")))
        else:
            out.append(ch)
    s = "".join(out)
    if s in ("", ".", ".."):
        s = "".join(f"%{b:02X}" for b in s.encode()) or "%00EMPTY"
    raw = s.encode("utf-8", "surrogatepass")
    if len(raw) > 200:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        s = raw[:180].decode("utf-8", "ignore") + "~" + digest
    return s
