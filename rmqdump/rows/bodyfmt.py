"""Pluggable body decoders: how a message body is shown (``--body SPEC``).

SPEC is one of:

* ``none`` — no body (null);
* ``text`` or ``text:CHARSET`` — decoded text (UTF-8 by default; invalid bytes replaced);
* ``hex``, ``base64``;
* ``json`` — the body parsed as JSON (embedded as a value in JSON output, compact in
  tables); bodies that are not JSON fall back to UTF-8 text;
* ``MODULE:FUNCTION`` — a user callable, imported like ``python -c "import MODULE"`` (the
  current directory is on the path), called with the body ``bytes`` and returning a
  ``str``, ``bytes`` (shown as UTF-8 text), or any JSON-serialisable value.

The core has no CLI dependency; commands turn a SPEC into a :class:`BodyDecoder` with
:func:`parse_body_spec`.
"""

from __future__ import annotations

import base64
import codecs
import importlib
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from rmqdump.errors import RmqdumpError

BUILTIN = ("none", "text", "hex", "base64", "json")
#: How many decoder failures are reported individually before only counting them.
MAX_REPORTED_ERRORS = 5


class BodySpecError(RmqdumpError):
    """A ``--body`` specification that cannot be used."""


@dataclass
class BodyDecoder:
    """Turns stored body bytes into a JSON-ready value according to a spec."""

    spec: str
    mode: str  # none | text | hex | base64 | json | callable
    charset: str = "utf-8"
    func: Callable[[bytes], object] | None = None
    errors: int = 0
    error_messages: list[str] = field(default_factory=list)

    @property
    def needs_body(self) -> bool:
        """Whether the record bodies must be read at all."""
        return self.mode != "none"

    def note_error(self, message: str) -> None:
        """Count one record whose body could not be rendered as asked (kept: the first few messages)."""
        self.errors += 1
        if len(self.error_messages) < MAX_REPORTED_ERRORS:
            self.error_messages.append(message)

    def decode(self, body: bytes | None, where: str | None = None) -> object:
        """The body as a JSON-ready value (None for ``none`` or no body).

        A user callable that raises gives None; the failure is counted in ``errors`` and the
        first few are kept in ``error_messages`` (with ``where``, e.g. the record offset).
        """
        if body is None or self.mode == "none":
            return None
        if self.mode == "base64":
            return base64.b64encode(body).decode("ascii")
        if self.mode == "hex":
            return body.hex()
        if self.mode == "text":
            return body.decode(self.charset, "replace")
        if self.mode == "json":
            try:
                return json.loads(body.decode("utf-8"))
            except (UnicodeDecodeError, ValueError):
                return body.decode("utf-8", "replace")
        try:
            value = self.func(body)  # type: ignore[misc]
        except Exception as e:  # a user decoder failing on one body must not end the run
            self.errors += 1
            if len(self.error_messages) < MAX_REPORTED_ERRORS:
                self.error_messages.append(f"body decoder {self.spec} failed{' at ' + where if where else ''}: "
                                           f"{type(e).__name__}: {e}")
            return None
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value).decode("utf-8", "replace")
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
        return value

    def text(self, body: bytes | None, where: str | None = None) -> str | None:
        """:meth:`decode` as one string (JSON values compact), for tables and CSV."""
        v = self.decode(body, where)
        if v is None or isinstance(v, str):
            return v
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"))


def parse_body_spec(spec: str) -> BodyDecoder:
    """Build a decoder from a spec (see the module docs); :class:`BodySpecError` if unusable."""
    s = spec.strip()
    if s in BUILTIN:
        return BodyDecoder(s, s)
    if s.startswith("text:"):
        charset = s[5:]
        try:
            codecs.lookup(charset)
        except LookupError:
            raise BodySpecError(f"--body {spec}: unknown charset {charset!r}") from None
        return BodyDecoder(s, "text", charset=charset)
    if ":" in s:
        mod_name, _, func_name = s.partition(":")
        if not mod_name or not func_name:
            raise BodySpecError(f"--body {spec}: expected MODULE:FUNCTION")
        if "" not in sys.path and os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(mod_name)
        except Exception as e:  # ImportError or an error while importing user code
            raise BodySpecError(f"--body {spec}: cannot import {mod_name}: {type(e).__name__}: {e}") from None
        func = module
        for part in func_name.split("."):
            func = getattr(func, part, None)
            if func is None:
                raise BodySpecError(f"--body {spec}: {mod_name} has no attribute {func_name}")
        if not callable(func):
            raise BodySpecError(f"--body {spec}: {func_name} is not callable")
        return BodyDecoder(s, "callable", func=func)
    raise BodySpecError(f"--body {spec}: expected none, text, text:CHARSET, hex, base64, json or MODULE:FUNCTION")


def default_body_decoder(spec: str | None, fmt: str) -> BodyDecoder:
    """The decoder for ``--body`` (None: base64 in machine formats, none in tables)."""
    if spec:
        return parse_body_spec(spec)
    return BodyDecoder("none", "none") if fmt == "table" else BodyDecoder("base64", "base64")


def message_to_row(msg, decoder: BodyDecoder, decompress: bool = False, as_text: bool = False,
                   delay_levels_ms: list[int] | None = None) -> dict:
    """One record in the JSONL schema with its body rendered by ``decoder``.

    ``as_text`` renders JSON values compactly as strings (tables, CSV).
    """
    from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS
    from rmqdump.rows.schema import BodyErrors, message_to_dict, output_body

    row = message_to_dict(msg, "none", False, delay_levels_ms or DEFAULT_DELAY_LEVELS_MS)
    where = f"offset {msg.offset}"
    body = msg.body
    if decoder.needs_body and decompress:
        errors = BodyErrors()
        body = output_body(msg, True, errors)
        for _off, detail in errors.first:
            decoder.note_error(f"{where}: {detail}; body shown as stored ({msg.compression})")
    row["body"] = decoder.text(body, where) if as_text else decoder.decode(body, where)
    return row
