"""Untrusted names from store data (topics, keys, file names) as path components.

Everything a store holds is attacker-controlled: a topic can be ``../../x``, an absolute
path, hold a NUL, control characters or lone surrogates, or be longer than a file name may
be (RocketMQ writes such topics to the commitlog and then fails to create their consume
queue). Two policies:

* :func:`safe_child` / :func:`is_safe_component` - use the name verbatim, as the broker
  would, or refuse it (:class:`~rmqdump.errors.StoreError`). For writers that must
  reproduce the broker's layout (``repair --rebuild-cq``, the appender).
* :func:`encode_component` - always produce a safe, injective directory name (percent
  encoding, ``~`` + SHA-256 for long names). For output trees (exports); reversed by
  :func:`decode_component` unless the name was shortened.

:func:`ensure_within` and :func:`check_no_symlinks` guard a path that is about to be written.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
from pathlib import Path

from rmqdump.errors import StoreError

#: longest file name (bytes) on Linux/macOS file systems
NAME_MAX = 255
#: encoded names longer than this many bytes are shortened (room for ``~`` + 16 hex digits)
ENCODED_MAX = 200
_HASH_HEX = 16
_EMPTY = "~"  # the encoding of "": never produced for a non-empty name ('~' is always escaped)


def _fs_bytes(name: str) -> bytes | None:
    """``name`` as the OS would encode it (``os.fsencode``); None if it cannot be encoded."""
    try:
        return name.encode(sys.getfilesystemencoding(), "surrogateescape")
    except UnicodeError:
        return None


def is_safe_component(name: str) -> bool:
    """Whether ``name`` can be used verbatim as one directory entry (as the broker would).

    Refuses the empty name, ``.``, ``..``, names holding ``/``, ``\\`` or NUL, names the
    OS cannot encode (lone surrogates) and names over :data:`NAME_MAX` encoded bytes.
    """
    if not isinstance(name, str) or not name or name in (".", ".."):
        return False
    if "/" in name or "\x00" in name or "\\" in name:
        return False
    raw = _fs_bytes(name)
    return raw is not None and len(raw) <= NAME_MAX


def safe_child(base: str | os.PathLike, name: str, *, allow_symlink: bool = False) -> Path:
    """``base / name`` for a broker-compatible name; refuses names that would escape or fail.

    Unless ``allow_symlink``, an existing entry ``base/name`` that is a symlink is refused
    too (a writer must never follow a link planted in the store out of it).
    """
    base = Path(base)
    if not is_safe_component(name):
        raise StoreError(f"refusing unsafe directory name {name!r} (path separator, NUL, dot entry, "
                         f"unencodable or over {NAME_MAX} bytes)", base)
    child = base / name
    if not allow_symlink:
        try:
            st = os.lstat(child)
        except FileNotFoundError:
            return child
        except OSError as e:
            raise StoreError(f"cannot stat: {e.strerror}", child) from None
        if stat.S_ISLNK(st.st_mode):
            raise StoreError("is a symlink; refusing to follow it", child)
    return child


def _escape_char(ch: str) -> str:
    if "\ud800" <= ch <= "\udfff":  # lone surrogate (e.g. an undecodable byte of a file name)
        return f"%u{ord(ch):04X}"
    return "".join(f"%{b:02X}" for b in ch.encode("utf-8"))


def _needs_escape(ch: str) -> bool:
    c = ord(ch)
    return (ch in "%/\\~" or c < 0x20 or 0x7F <= c <= 0x9F or 0xD800 <= c <= 0xDFFF
            or c in (0x2028, 0x2029) or 0x202A <= c <= 0x202E or 0x2066 <= c <= 0x2069 or c == 0xFEFF)


def encode_component(name: str) -> str:
    """An always-safe, injective directory name for any string (export partitions).

    Percent-encodes ``%``, ``/``, ``\\``, ``~``, NUL, C0/C1 control characters and bidi
    controls (``%XX`` per UTF-8 byte) and lone surrogates (``%uXXXX``); spells the dot
    entries out (``%2E``); the empty name becomes ``~``. Names whose encoding passes
    :data:`ENCODED_MAX` bytes are cut at a character boundary and suffixed with ``~`` and
    16 hex digits of the SHA-256 of the name. The result is never empty, ``.`` or ``..``,
    holds no ``/`` or NUL, and is at most :data:`NAME_MAX` bytes.
    """
    if name == "":
        return _EMPTY
    units = [_escape_char(ch) if _needs_escape(ch) else ch for ch in name]
    s = "".join(units)
    if s in (".", ".."):
        s = "%2E" * len(s)
    if len(s.encode("utf-8")) > ENCODED_MAX:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_HEX]
        budget = ENCODED_MAX - 1 - _HASH_HEX
        out, used = [], 0
        for u in units:
            n = len(u.encode("utf-8"))
            if used + n > budget:
                break
            out.append(u)
            used += n
        s = "".join(out) + "~" + digest
    return s


def decode_component(encoded: str) -> str | None:
    """The name :func:`encode_component` encoded, or None for a shortened (hashed) name."""
    if encoded == _EMPTY:
        return ""
    if "~" in encoded:
        return None
    out: list[str] = []
    pending = bytearray()
    i = 0
    while i < len(encoded):
        c = encoded[i]
        if c == "%" and encoded[i + 1:i + 2] == "u" and _is_hex(encoded[i + 2:i + 4]) and _is_hex(encoded[i + 4:i + 6]):
            out.append(pending.decode("utf-8", "replace"))
            pending.clear()
            out.append(chr(int(encoded[i + 2:i + 6], 16)))
            i += 6
        elif c == "%" and _is_hex(encoded[i + 1:i + 3]):
            pending.append(int(encoded[i + 1:i + 3], 16))
            i += 3
        else:
            pending += c.encode("utf-8")
            i += 1
    out.append(pending.decode("utf-8", "replace"))
    return "".join(out)


def _is_hex(s: str) -> bool:
    return len(s) == 2 and all(c in "0123456789ABCDEFabcdef" for c in s)


def ensure_within(base: str | os.PathLike, path: str | os.PathLike) -> Path:
    """``path`` if it stays inside ``base`` once symlinks and ``..`` are resolved, else StoreError."""
    b = Path(os.path.realpath(base))
    p = Path(os.path.realpath(path))
    if p != b and b not in p.parents:
        raise StoreError(f"refusing to write outside {b}", path)
    return Path(path)


def check_no_symlinks(base: str | os.PathLike, path: str | os.PathLike) -> None:
    """Refuse (StoreError) if any existing component of ``path`` below ``base`` is a symlink.

    ``path`` must be ``base`` or lie lexically under it; missing components are fine.
    """
    b, p = Path(base), Path(path)
    try:
        rel = p.relative_to(b)
    except ValueError:
        raise StoreError(f"path is not under {b}", p) from None
    cur = b
    for part in rel.parts:
        if part in ("", ".", ".."):
            raise StoreError(f"refusing path component {part!r}", p)
        cur = cur / part
        try:
            st = os.lstat(cur)
        except FileNotFoundError:
            return
        except OSError as e:
            raise StoreError(f"cannot stat: {e.strerror}", cur) from None
        if stat.S_ISLNK(st.st_mode):
            raise StoreError("is a symlink; refusing to follow it out of the store", cur)
