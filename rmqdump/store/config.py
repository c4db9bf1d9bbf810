"""Broker ``config/*.json`` files (spec §10.4): a lenient fastjson parser and typed loaders.

fastjson writes integer map keys unquoted (``{1:1,2:1,3:3}``) and accepts single-quoted
strings and bare identifier keys; :func:`parse_fastjson` accepts the same. Loaders fall back
to ``<name>.bak`` exactly when the broker's ``ConfigManager.load`` would.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from rmqdump.codec.layout import STORE_CONFIG_DIR
from rmqdump.disk.evidence import record_read
from rmqdump.disk.fileio import open_read
from rmqdump.errors import FormatError, StoreError

T = TypeVar("T")

TOPICS_JSON = "topics.json"
CONSUMER_OFFSET_JSON = "consumerOffset.json"
DELAY_OFFSET_JSON = "delayOffset.json"
SUBSCRIPTION_GROUP_JSON = "subscriptionGroup.json"
CONSUMER_FILTER_JSON = "consumerFilter.json"
BAK_SUFFIX = ".bak"
TOPIC_GROUP_SEPARATOR = "@"
#: nesting limit of the parser (hostile input must not exhaust the stack)
MAX_DEPTH = 256
#: config files larger than this are refused before reading (the broker reads them whole; the largest
#: real ones, consumerOffset.json of big clusters, are a few MB; parsing costs several times the size)
MAX_CONFIG_BYTES = 32 * 1024 * 1024

_WS = " \t\r\n\f\b\v"
_ESCAPES = {'"': '"', "'": "'", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t",
            "0": "\0", "v": "\v", "F": "\f"}
_BARE_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_$+-.")


# --- parser ----------------------------------------------------------------------------------


class _Parser:
    """Recursive-descent parser over ``str`` (decoded with surrogateescape)."""

    def __init__(self, text: str, file: str | os.PathLike | None):
        self.s = text
        self.i = 0
        self.file = file

    def error(self, message: str, pos: int | None = None) -> FormatError:
        pos = self.i if pos is None else pos
        byte_offset = len(self.s[:pos].encode("utf-8", "surrogateescape"))
        return FormatError(f"config JSON: {message}", self.file, byte_offset)

    def skip_ws(self) -> None:
        s, n = self.s, len(self.s)
        while self.i < n:
            c = s[self.i]
            if c in _WS or c == "\ufeff":
                self.i += 1
            elif s.startswith("//", self.i):
                j = s.find("\n", self.i)
                self.i = n if j < 0 else j + 1
            elif s.startswith("/*", self.i):
                j = s.find("*/", self.i + 2)
                if j < 0:
                    raise self.error("unterminated comment")
                self.i = j + 2
            else:
                return

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def parse_document(self) -> Any:
        self.skip_ws()
        if self.i >= len(self.s):
            return None
        value = self.value(0)
        self.skip_ws()
        if self.i < len(self.s):
            raise self.error("unexpected data after the JSON value")
        return value

    def value(self, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise self.error("nesting too deep")
        self.skip_ws()
        c = self.peek()
        if c == "":
            raise self.error("unexpected end of input")
        if c == "{":
            return self.obj(depth)
        if c == "[":
            return self.arr(depth)
        if c in "\"'":
            return self.string()
        return self.bare(as_key=False)

    def obj(self, depth: int) -> dict:
        self.i += 1
        out: dict = {}
        while True:
            self.skip_ws()
            c = self.peek()
            if c == "":
                raise self.error("unterminated object")
            if c == "}":
                self.i += 1
                return out
            if c == ",":  # fastjson tolerates stray commas
                self.i += 1
                continue
            key = self.string() if c in "\"'" else self.bare(as_key=True)
            self.skip_ws()
            if self.peek() != ":":
                raise self.error("expected ':' after object key")
            self.i += 1
            out[key] = self.value(depth + 1)
            self.skip_ws()
            c = self.peek()
            if c == ",":
                self.i += 1
            elif c != "}":
                raise self.error("expected ',' or '}' in object")

    def arr(self, depth: int) -> list:
        self.i += 1
        out: list = []
        while True:
            self.skip_ws()
            c = self.peek()
            if c == "":
                raise self.error("unterminated array")
            if c == "]":
                self.i += 1
                return out
            if c == ",":
                self.i += 1
                continue
            out.append(self.value(depth + 1))
            self.skip_ws()
            c = self.peek()
            if c == ",":
                self.i += 1
            elif c != "]":
                raise self.error("expected ',' or ']' in array")

    def string(self) -> str:
        quote = self.s[self.i]
        start = self.i
        self.i += 1
        parts: list[str] = []
        s, n = self.s, len(self.s)
        while True:
            j = self.i
            while j < n and s[j] != quote and s[j] != "\\":
                j += 1
            parts.append(s[self.i:j])
            if j >= n:
                raise self.error("unterminated string", start)
            if s[j] == quote:
                self.i = j + 1
                return "".join(parts)
            parts.append(self.escape(j))

    def escape(self, j: int) -> str:
        if j + 1 >= len(self.s):
            raise self.error("unterminated escape", j)
        c = self.s[j + 1]
        if c == "u":
            digits = self.s[j + 2:j + 6]
            if len(digits) != 4 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error("bad \\u escape", j)
            self.i = j + 6
            return chr(int(digits, 16))
        if c == "x":
            digits = self.s[j + 2:j + 4]
            if len(digits) != 2 or any(d not in "0123456789abcdefABCDEF" for d in digits):
                raise self.error("bad \\x escape", j)
            self.i = j + 4
            return chr(int(digits, 16))
        if c not in _ESCAPES:
            raise self.error(f"bad escape \\{c}", j)
        self.i = j + 2
        return _ESCAPES[c]

    def bare(self, as_key: bool) -> Any:
        start = self.i
        s, n = self.s, len(self.s)
        j = start
        while j < n and s[j] in _BARE_CHARS:
            j += 1
        token = s[start:j]
        if not token:
            raise self.error(f"unexpected character {s[start]!r}")
        self.i = j
        if token in ("true", "false", "null") and not as_key:
            return {"true": True, "false": False, "null": None}[token]
        number = _number(token)
        if number is not None:
            return number
        if as_key and (token[0].isalpha() or token[0] in "_$"):
            return token
        raise self.error(f"bad token {token!r}", start)


def _number(token: str) -> int | float | None:
    body = token[1:] if token[:1] in "+-" else token
    if not body or not (body[0].isdigit() or (body[0] == "." and body[1:2].isdigit())):
        return None
    if body[-1:] in "LlSsBbFfDd" and body[:-1]:
        token = token[:-1]  # fastjson type suffixes (1L, 2.0F)
    try:
        return int(token, 10)
    except ValueError:
        pass
    try:
        return float(token)
    except ValueError:
        return None


def parse_fastjson(data: str | bytes, file: str | os.PathLike | None = None) -> Any:
    """Parse fastjson output (unquoted/int keys, single quotes, comments); None for blank input."""
    text = data.decode("utf-8", "surrogateescape") if isinstance(data, bytes) else data
    try:
        return _Parser(text, file).parse_document()
    except RecursionError:
        raise FormatError("config JSON: nesting too deep", file) from None


# --- file loading with .bak fallback ----------------------------------------------------------


@dataclass
class Loaded(Generic[T]):
    """A decoded config file: ``path`` is the file used (main or .bak), None if neither exists."""

    data: T | None
    path: Path | None
    used_backup: bool = False
    main_error: FormatError | StoreError | None = None

    @property
    def value(self) -> T | None:
        """Alias of ``data``."""
        return self.data


def read_config_bytes(path: str | os.PathLike) -> bytes | None:
    """Bytes of a config file; None if it does not exist. A file over :data:`MAX_CONFIG_BYTES` is refused
    (StoreError) by its size, before anything is read."""
    path = Path(path)
    try:
        fd = open_read(path, follow=False)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StoreError(f"cannot open config file: {exc.strerror}", path) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise StoreError("config file is not a regular file", path)
        record_read(path)  # --evidence manifest
        if st.st_size > MAX_CONFIG_BYTES:
            raise StoreError(f"config file is {st.st_size} bytes (limit {MAX_CONFIG_BYTES})", path)
        chunks, pos = [], 0
        while True:
            chunk = os.pread(fd, 1 << 20, pos)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            pos += len(chunk)
    except OSError as exc:
        raise StoreError(f"cannot read config file: {exc.strerror}", path) from None
    finally:
        os.close(fd)


def keep(value: Any, path: Path) -> Any:
    """The decoder of a table taken as it parses (no shape checked)."""
    return value


#: (decoder, digest) of config bytes known to parse and decode: verify's config checks, the tables commands load
#: and the broker-start prediction (:func:`load_fails`) read the same files, and the pure-Python parser takes about
#: a second per 2.5 MB (a large consumerOffset.json) each time
_DECODED: set[tuple[Any, bytes]] = set()


def decode_config(raw: bytes, path: Path, decode: Callable[[Any, Path], T] = keep) -> T:
    """``decode(parse_fastjson(raw))`` (FormatError/StoreError as they raise), remembering that these bytes decode."""
    value = decode(parse_fastjson(raw, path), path)
    _DECODED.add((decode, _digest(raw)))
    return value


def _digest(raw: bytes) -> bytes:
    return hashlib.blake2b(raw, digest_size=16).digest()


def load_config_file(path: str | os.PathLike, decode: Callable[[Any, Path], T] = keep) -> Loaded[T]:
    """``ConfigManager.load``: main file, else ``.bak`` when the main is missing, empty or bad.

    Raises the main file's FormatError/StoreError if the backup cannot be used either.
    """
    main = Path(path)
    bak = main.with_name(main.name + BAK_SUFFIX)
    main_error: FormatError | StoreError | None = None
    raw: bytes | None = None
    try:
        raw = read_config_bytes(main)
        if raw:
            return Loaded(decode_config(raw, main, decode), main)
    except (FormatError, StoreError) as exc:
        main_error = exc
    bak_raw = read_config_bytes(bak) if main_error is None else _read_quietly(bak)
    if bak_raw:
        try:
            return Loaded(decode_config(bak_raw, bak, decode), bak, True, main_error)
        except (FormatError, StoreError) as exc:
            if main_error is None:
                raise
            raise main_error from exc
    if main_error is not None:
        raise main_error
    return Loaded(None, main if raw is not None else None)


def load_fails(path: str | os.PathLike, decode: Callable[[Any, Path], Any] = keep) -> bool:
    """Whether ``ConfigManager.load`` returns false for ``path`` (the broker does not start): only when the main
    file is missing, empty or bad and its ``.bak`` holds bytes that do not decode. A missing or empty ``.bak``
    loads as nothing: the broker starts with an empty table."""
    main = Path(path)
    try:
        raw = read_config_bytes(main)
        if raw:
            if (decode, _digest(raw)) not in _DECODED:
                decode_config(raw, main, decode)
            return False
    except (FormatError, StoreError):
        pass
    bak = main.with_name(main.name + BAK_SUFFIX)
    bak_raw = _read_quietly(bak)
    if not bak_raw:
        return False
    try:
        decode(parse_fastjson(bak_raw, bak), bak)
    except (FormatError, StoreError):
        return True
    return False


def _read_quietly(path: Path) -> bytes | None:
    try:
        return read_config_bytes(path)
    except StoreError:
        return None


def config_path(store_root: str | os.PathLike, name: str) -> Path:
    return Path(store_root) / STORE_CONFIG_DIR / name


# --- typed decoders ----------------------------------------------------------------------------


def _require(cond: bool, message: str, file: Path) -> None:
    if not cond:
        raise FormatError(message, file)


def _int_map(value: Any, what: str, file: Path) -> dict[int, int]:
    _require(isinstance(value, dict), f"{what} is not an object", file)
    out = {}
    for k, v in value.items():
        key = int(k) if isinstance(k, str) and k.lstrip("-").isdigit() else k
        _require(isinstance(key, int) and not isinstance(key, bool), f"{what}: key {k!r} is not an integer", file)
        _require(isinstance(v, int) and not isinstance(v, bool), f"{what}: value of {k!r} is not an integer", file)
        out[key] = v
    return out


@dataclass
class ConsumerOffsets:
    """``consumerOffset.json``: committed next offsets per (topic, group) and queue."""

    table: dict[str, dict[int, int]] = field(default_factory=dict)
    data_version: dict | None = None

    @staticmethod
    def split_key(key: str) -> tuple[str, str | None]:
        """``topic@group`` -> (topic, group); group None when the broker would ignore the key."""
        parts = key.split(TOPIC_GROUP_SEPARATOR)
        return (parts[0], parts[1]) if len(parts) == 2 else (key, None)

    def offsets(self, topic: str, group: str) -> dict[int, int]:
        return self.table.get(f"{topic}{TOPIC_GROUP_SEPARATOR}{group}", {})

    def rows(self) -> list[tuple[str, str | None, int, int]]:
        """(topic, group, queueId, offset) rows, sorted."""
        out = []
        for key, queues in self.table.items():
            topic, group = self.split_key(key)
            out.extend((topic, group, q, o) for q, o in queues.items())
        return sorted(out, key=lambda r: (r[0], r[1] or "", r[2]))


def decode_consumer_offsets(value: Any, file: Path) -> ConsumerOffsets:
    _require(isinstance(value, dict), "consumerOffset.json is not an object", file)
    table = value.get("offsetTable", {})
    _require(isinstance(table, dict), "offsetTable is not an object", file)
    out = {}
    for key, queues in table.items():
        _require(isinstance(key, str), f"offsetTable key {key!r} is not a string", file)
        out[key] = _int_map(queues, f"offsetTable[{key!r}]", file)
    dv = value.get("dataVersion")
    return ConsumerOffsets(out, dv if isinstance(dv, dict) else None)


def decode_delay_offsets(value: Any, file: Path) -> dict[int, int]:
    """``delayOffset.json`` -> {delay level: offset in SCHEDULE_TOPIC_XXXX queue level−1}."""
    _require(isinstance(value, dict), "delayOffset.json is not an object", file)
    return _int_map(value.get("offsetTable", {}), "offsetTable", file)


@dataclass
class TopicConfig:
    """One ``topicConfigTable`` entry."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = 6
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] = field(default_factory=dict)
    raw: dict = field(default_factory=dict)


def decode_topics(value: Any, file: Path) -> dict[str, TopicConfig]:
    _require(isinstance(value, dict), "topics.json is not an object", file)
    table = value.get("topicConfigTable", {})
    _require(isinstance(table, dict), "topicConfigTable is not an object", file)
    out = {}
    for name, cfg in table.items():
        _require(isinstance(cfg, dict), f"topic {name!r} config is not an object", file)
        attrs = cfg.get("attributes") or {}
        _require(isinstance(attrs, dict), f"topic {name!r} attributes is not an object", file)
        try:
            out[str(name)] = TopicConfig(
                topic_name=str(cfg.get("topicName", name)),
                read_queue_nums=int(cfg.get("readQueueNums", 16)),
                write_queue_nums=int(cfg.get("writeQueueNums", 16)),
                perm=int(cfg.get("perm", 6)),
                topic_filter_type=str(cfg.get("topicFilterType", "SINGLE_TAG")),
                topic_sys_flag=int(cfg.get("topicSysFlag", 0)),
                order=bool(cfg.get("order", False)),
                attributes={str(k): str(v) for k, v in attrs.items()},
                raw=cfg,
            )
        except (TypeError, ValueError) as exc:
            raise FormatError(f"topic {name!r}: {exc}", file) from None
    return out


def decode_subscription_groups(value: Any, file: Path) -> dict[str, dict]:
    _require(isinstance(value, dict), "subscriptionGroup.json is not an object", file)
    table = value.get("subscriptionGroupTable", {})
    _require(isinstance(table, dict), "subscriptionGroupTable is not an object", file)
    for name, cfg in table.items():
        _require(isinstance(cfg, dict), f"group {name!r} config is not an object", file)
    return {str(k): v for k, v in table.items()}


def _rocksdb_table(store_root: str | os.PathLike, table: str, wrap: str,
                   decode: Callable[[Any, Path], T]) -> Loaded[T] | None:
    """A 5.x RocksDB config table (``config/rdb/`` or ``config/<table>/``) decoded as its JSON file would be;
    None when the store has none (:mod:`rmqdump.store.rocksdb.config`: the broker reads those, not the JSON)."""
    from rmqdump.store.rocksdb.config import read_config_table

    found = read_config_table(store_root, table)
    if found is None:
        return None
    path, rows = found
    out = {}
    for name, raw in rows.items():
        value = parse_fastjson(raw, path) if isinstance(raw, bytes) else raw
        if table == "consumerOffsets" and isinstance(raw, bytes):
            _require(isinstance(value, dict), f"consumer offset {name!r} is not an object", path)
            value = value.get("offsetTable", {})  # v1: RocksDBOffsetSerializeWrapper
        out[name] = value
    return Loaded(decode({wrap: out}, path), path)


def load_topics(store_root: str | os.PathLike) -> Loaded[dict[str, TopicConfig]]:
    rocks = _rocksdb_table(store_root, "topics", "topicConfigTable", decode_topics)
    return rocks or load_config_file(config_path(store_root, TOPICS_JSON), decode_topics)


def load_consumer_offsets(store_root: str | os.PathLike) -> Loaded[ConsumerOffsets]:
    rocks = _rocksdb_table(store_root, "consumerOffsets", "offsetTable", decode_consumer_offsets)
    return rocks or load_config_file(config_path(store_root, CONSUMER_OFFSET_JSON), decode_consumer_offsets)


def load_delay_offsets(store_root: str | os.PathLike) -> Loaded[dict[int, int]]:
    return load_config_file(config_path(store_root, DELAY_OFFSET_JSON), decode_delay_offsets)


def load_subscription_groups(store_root: str | os.PathLike) -> Loaded[dict[str, dict]]:
    rocks = _rocksdb_table(store_root, "subscriptionGroups", "subscriptionGroupTable", decode_subscription_groups)
    return rocks or load_config_file(config_path(store_root, SUBSCRIPTION_GROUP_JSON), decode_subscription_groups)
