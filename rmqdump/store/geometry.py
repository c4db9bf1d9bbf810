"""Store geometry: the broker settings that shape the files but are not written in them.

Commitlog and ConsumeQueue file sizes are the sizes of their files; an IndexFile's slot
and entry counts follow from its size with RocketMQ's default ratio maxIndexNum = 4 ×
maxHashSlotNum, i.e. slots = (size − 40) / 84 (§9.1). Every inference is checked against
the data (slot values within the entry count, chain entries hanging from the slot their
hash selects) and can be overridden by explicit values or a ``broker.conf`` (Java
properties, read like ``BrokerStartup`` reads it).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import (
    CQ_STORE_UNIT_SIZE,
    INDEX_ENTRY,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    INDEX_SIZE,
    MAPPED_FILE_SIZE_COMMITLOG,
    MAPPED_FILE_SIZE_CONSUME_QUEUE,
    MAX_HASH_SLOT_NUM,
    MAX_INDEX_NUM,
    MAX_MESSAGE_SIZE,
    MAX_RECORD_SIZE,
    MESSAGE_DELAY_LEVEL,
    STORE_INDEX_DIR,
    hash_slots,
)
from rmqdump.disk.fileio import open_read
from rmqdump.errors import FormatError, RmqdumpError, StoreError

#: broker.conf keys rmqdump uses (MessageStoreConfig field names)
CONF_KEYS = ("mappedFileSizeCommitLog", "mappedFileSizeConsumeQueue", "maxHashSlotNum", "maxIndexNum",
             "messageDelayLevel", "maxMessageSize")
#: slots read from the start of the slot table by the quick data check
QUICK_CHECK_SLOTS = 2048
#: non-empty slots whose head entry the quick check reads
QUICK_CHECK_HEADS = 16
_JAVA_INT = re.compile(r"[+-]?[0-9]+")
_INT32 = (-(1 << 31), (1 << 31) - 1)
_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


# --- broker.conf -------------------------------------------------------------------------


def parse_java_properties(text: str) -> dict[str, str]:
    """``java.util.Properties.load`` on already decoded text.

    Comment lines start with ``#`` or ``!``; a line ending in an odd number of backslashes
    continues (leading blanks of the next line dropped); the key ends at the first unescaped
    ``=``, ``:`` or blank; ``\\t \\n \\r \\f \\uXXXX`` and ``\\x`` → ``x`` are unescaped.
    Values keep trailing blanks, as Java does. Later keys overwrite earlier ones.
    """
    out: dict[str, str] = {}
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    i = 0
    while i < len(lines):
        line = lines[i].lstrip(" \t\f")
        i += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and i < len(lines):
            line = line[:-1] + lines[i].lstrip(" \t\f")
            i += 1
        if _continues(line):
            line = line[:-1]
        key, value = _split_property(line)
        out[_unescape(key)] = _unescape(value)
    return out


def _continues(line: str) -> bool:
    n = len(line) - len(line.rstrip("\\"))
    return n % 2 == 1


def _split_property(line: str) -> tuple[str, str]:
    j = 0
    n = len(line)
    while j < n:
        c = line[j]
        if c == "\\":
            j += 2
            continue
        if c in "=: \t\f":
            break
        j += 1
    key = line[:j]
    k = j
    while k < n and line[k] in " \t\f":
        k += 1
    if k < n and line[k] in "=:":
        k += 1
        while k < n and line[k] in " \t\f":
            k += 1
    return key, line[k:]


def _unescape(s: str) -> str:
    if "\\" not in s:
        return s
    out = []
    j = 0
    while j < len(s):
        c = s[j]
        if c != "\\" or j + 1 >= len(s):
            out.append(c)
            j += 1
            continue
        nxt = s[j + 1]
        if nxt == "u":
            digits = s[j + 2:j + 6]
            if len(digits) == 4 and all(ch in "0123456789abcdefABCDEF" for ch in digits):
                out.append(chr(int(digits, 16)))
                j += 6
                continue
            raise FormatError(f"malformed \\uxxxx escape {s[j:j + 6]!r}")
        out.append(_ESCAPES.get(nxt, nxt))
        j += 2
    return "".join(out)


@dataclass
class BrokerConf:
    """The store settings of a broker.conf; ``None`` where the file does not set them.

    ``problems`` lists values the broker would ignore (``Integer.parseInt`` failures are
    swallowed by ``MixAll.properties2Object``, so the default stays in force).
    """

    path: Path
    properties: dict[str, str]
    mapped_file_size_commit_log: int | None = None
    mapped_file_size_consume_queue: int | None = None
    max_hash_slot_num: int | None = None
    max_index_num: int | None = None
    message_delay_level: str | None = None
    max_message_size: int | None = None
    problems: list[str] = field(default_factory=list)

    @property
    def delay_levels_ms(self) -> list[int] | None:
        if self.message_delay_level is None:
            return None
        from rmqdump.codec.javahash import parse_delay_levels

        return parse_delay_levels(self.message_delay_level)


def parse_broker_conf(path: str | os.PathLike) -> BrokerConf:
    """Read a broker.conf (Java properties, ISO-8859-1 like ``Properties.load(InputStream)``)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise StoreError(f"cannot read broker config: {exc.strerror}", p) from None
    try:
        props = parse_java_properties(data.decode("latin-1"))
    except FormatError as exc:
        raise FormatError(exc.message, p) from None
    conf = BrokerConf(p, props)
    for key, attr in (("mappedFileSizeCommitLog", "mapped_file_size_commit_log"),
                      ("mappedFileSizeConsumeQueue", "mapped_file_size_consume_queue"),
                      ("maxHashSlotNum", "max_hash_slot_num"), ("maxIndexNum", "max_index_num"),
                      ("maxMessageSize", "max_message_size")):
        raw = props.get(key)
        if raw is None:
            continue
        if not _JAVA_INT.fullmatch(raw) or not _INT32[0] <= int(raw) <= _INT32[1]:
            conf.problems.append(f"{p}: {key}={raw!r} is not a Java int; the broker ignores it and keeps "
                                 "the default")
            continue
        value = int(raw)
        if key == "mappedFileSizeConsumeQueue":
            value = -(-value // CQ_STORE_UNIT_SIZE) * CQ_STORE_UNIT_SIZE  # the getter rounds up
        setattr(conf, attr, value)
    levels = props.get("messageDelayLevel")
    if levels is not None:
        try:
            from rmqdump.codec.javahash import parse_delay_levels

            if not parse_delay_levels(levels):
                raise ValueError("empty")
            conf.message_delay_level = levels
        except (KeyError, ValueError, IndexError):
            conf.problems.append(f"{p}: messageDelayLevel={levels!r} does not parse; using the default levels")
    return conf


# --- geometry ----------------------------------------------------------------------------


@dataclass
class StoreGeometry:
    """File sizes and limits of one store, each with where it came from.

    ``sources`` maps ``commitlog``, ``consumequeue``, ``index``, ``max_message_size`` and
    ``delay_levels`` to ``files`` (inferred from file sizes), ``option``, ``broker.conf``
    or ``default``. ``problems`` lists disagreements between a source and the data.
    """

    commitlog_file_size: int | None = None
    cq_file_size: int | None = None
    index_hash_slot_num: int | None = None
    index_num: int | None = None
    max_message_size: int = MAX_MESSAGE_SIZE
    delay_levels_ms: list[int] | None = None
    sources: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    #: explicit index geometry (option or broker.conf): used even if a file disagrees
    index_given: bool = False

    @property
    def max_record_size(self) -> int:
        """Largest whole record: body limit + 64 KiB (§1.1)."""
        return self.max_message_size + (MAX_RECORD_SIZE - MAX_MESSAGE_SIZE)

    def as_dict(self) -> dict:
        return {"commitlog_file_size": self.commitlog_file_size, "cq_file_size": self.cq_file_size,
                "index_hash_slot_num": self.index_hash_slot_num, "index_num": self.index_num,
                "max_message_size": self.max_message_size, "delay_levels_ms": self.delay_levels_ms,
                "sources": dict(self.sources), "problems": list(self.problems)}


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    return INDEX_HEADER_SIZE + hash_slot_num * INDEX_HASH_SLOT_SIZE + index_num * INDEX_SIZE


def resolve_geometry(store_root: str | os.PathLike | None, *, commitlog_file_size: int | None = None,
                     index_slots: int | None = None, index_entries: int | None = None,
                     broker_conf: BrokerConf | None = None, max_message_size: int | None = None,
                     parts: tuple[str, ...] = ("commitlog", "consumequeue", "index")) -> StoreGeometry:
    """Geometry of a store: options, then broker.conf, then file sizes, then defaults.

    Only the ``parts`` asked for are inferred (listing every queue directory costs time).
    ``commitlog_file_size`` is the size :class:`~rmqdump.store.commitlog.CommitLog` inferred.
    Explicit index values that do not fit an index file raise :class:`FormatError`; a
    broker.conf that disagrees with the files is reported in ``problems`` and the files win.
    """
    g = StoreGeometry()
    conf = broker_conf
    if conf is not None:
        g.problems.extend(conf.problems)
    # limits
    if max_message_size is not None:
        g.max_message_size, g.sources["max_message_size"] = max_message_size, "option"
    elif conf is not None and conf.max_message_size is not None:
        g.max_message_size, g.sources["max_message_size"] = conf.max_message_size, "broker.conf"
    else:
        g.sources["max_message_size"] = "default"
    if conf is not None and conf.message_delay_level is not None:
        g.delay_levels_ms, g.sources["delay_levels"] = conf.delay_levels_ms, "broker.conf"
    else:
        from rmqdump.codec.javahash import parse_delay_levels

        g.delay_levels_ms, g.sources["delay_levels"] = parse_delay_levels(MESSAGE_DELAY_LEVEL), "default"
    if "commitlog" in parts:
        _commitlog(g, commitlog_file_size, conf)
    root = Path(store_root) if store_root is not None else None
    if "consumequeue" in parts:
        _consumequeue(g, root, conf)
    if "index" in parts:
        _index(g, root, index_slots, index_entries, conf)
    return g


def _commitlog(g: StoreGeometry, size: int | None, conf: BrokerConf | None) -> None:
    conf_size = conf.mapped_file_size_commit_log if conf else None
    if size:
        g.commitlog_file_size, g.sources["commitlog"] = size, "files"
        if conf_size is not None and conf_size != size:
            g.problems.append(f"broker.conf mappedFileSizeCommitLog={conf_size} but the commitlog files are "
                              f"{size} bytes; using the files")
    elif conf_size is not None:
        g.commitlog_file_size, g.sources["commitlog"] = conf_size, "broker.conf"
    else:
        g.commitlog_file_size, g.sources["commitlog"] = MAPPED_FILE_SIZE_COMMITLOG, "default"


def _consumequeue(g: StoreGeometry, root: Path | None, conf: BrokerConf | None) -> None:
    size = None
    if root is not None:
        from rmqdump.store.consumequeue import infer_store_cq_file_size, is_rocksdb_consumequeue

        if not is_rocksdb_consumequeue(root):
            try:
                size = infer_store_cq_file_size(root)
            except RmqdumpError as exc:
                g.problems.append(f"consume queue file size: {exc}")
    conf_size = conf.mapped_file_size_consume_queue if conf else None
    if size:
        g.cq_file_size, g.sources["consumequeue"] = size, "files"
        if conf_size is not None and conf_size != size:
            g.problems.append(f"broker.conf mappedFileSizeConsumeQueue={conf_size} but the consume queue files are "
                              f"{size} bytes; using the files")
    elif conf_size is not None:
        g.cq_file_size, g.sources["consumequeue"] = conf_size, "broker.conf"
    else:
        g.cq_file_size, g.sources["consumequeue"] = MAPPED_FILE_SIZE_CONSUME_QUEUE, "default"


def _index_sizes(root: Path | None) -> dict[str, int]:
    if root is None:
        return {}
    from rmqdump.store.indexfile import list_index_files

    out = {}
    for p in list_index_files(root):
        try:
            out[p.name] = p.stat().st_size
        except OSError as exc:
            raise StoreError(f"cannot stat index file: {exc.strerror}", p) from None
    return out


def _index(g: StoreGeometry, root: Path | None, slots: int | None, entries: int | None,
           conf: BrokerConf | None) -> None:
    from rmqdump.store.indexfile import geometry_from_entries, infer_geometry

    sizes = _index_sizes(root)
    size = None
    sample = None  # a file of the common size, whose entries can tell the geometry
    if sizes:
        counts: dict[int, int] = {}
        for s in sizes.values():
            counts[s] = counts.get(s, 0) + 1
        size = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
        sample = [root / STORE_INDEX_DIR / n for n, s in sorted(sizes.items(), reverse=True) if s == size]
        odd = sorted(n for n, s in sizes.items() if s != size)
        if odd:
            g.problems.append(f"index files of another size than {size} bytes: {', '.join(odd)}")
    if slots is not None or entries is not None:
        if size is not None:
            geo = infer_geometry(size, slots, entries)  # FormatError if the values do not fit
            slots, entries = geo.hash_slot_num, geo.index_num
        elif slots is None or entries is None:
            slots = slots if slots is not None else MAX_HASH_SLOT_NUM
            entries = entries if entries is not None else MAX_INDEX_NUM
        g.index_hash_slot_num, g.index_num, g.sources["index"], g.index_given = slots, entries, "option", True
        return
    if conf is not None and (conf.max_hash_slot_num is not None or conf.max_index_num is not None):
        cs = conf.max_hash_slot_num if conf.max_hash_slot_num is not None else MAX_HASH_SLOT_NUM
        ce = conf.max_index_num if conf.max_index_num is not None else MAX_INDEX_NUM
        if size is None or index_file_size(cs, ce) == size:
            g.index_hash_slot_num, g.index_num, g.sources["index"], g.index_given = cs, ce, "broker.conf", True
            return
        g.problems.append(f"broker.conf maxHashSlotNum={cs} maxIndexNum={ce} gives index files of "
                          f"{index_file_size(cs, ce)} bytes, but they are {size} bytes; inferring from the files")
    if size is None:
        g.index_hash_slot_num, g.index_num, g.sources["index"] = MAX_HASH_SLOT_NUM, MAX_INDEX_NUM, "default"
        return
    try:
        geo = next((g2 for p in (sample or [])[:8] if (g2 := geometry_from_entries(p, size)) is not None), None)
        geo = geo or infer_geometry(size)
    except FormatError as exc:
        g.problems.append(f"index geometry: {exc.message}")
        return
    g.index_hash_slot_num, g.index_num, g.sources["index"] = geo.hash_slot_num, geo.index_num, "files"


# --- checks against the data ------------------------------------------------------------------


def check_index_file(f, max_slots: int | None = QUICK_CHECK_SLOTS, max_heads: int | None = QUICK_CHECK_HEADS
                     ) -> list[str]:
    """Problems showing that an :class:`~rmqdump.store.indexfile.IndexFile`'s geometry does not fit its data.

    Reads the first ``max_slots`` slots (all with None): every value must be 0 or a written
    entry number (< indexCount); for up to ``max_heads`` non-empty slots the head entry must
    hash to that slot, have a non-negative timeDiff and a prevIndex below its own number.
    Cheap with the defaults (two or three dozen small reads).
    """
    problems: list[str] = []
    geo = f.geometry
    count = f.index_count
    with _Reader(f.path) as r:
        _check_index_slots(f, r, geo, count, max_slots, max_heads, problems)
    return problems


class _Reader:
    """pread access to one file (read-only, no symlinks); short reads raise FormatError."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.fd = open_read(self.path, follow=False)
        except OSError as exc:
            raise StoreError(f"cannot open: {exc.strerror}", self.path) from None

    def read(self, pos: int, n: int) -> bytes:
        try:
            data = os.pread(self.fd, n, pos)
        except OSError as exc:
            raise StoreError(f"read failed: {exc.strerror}", self.path, pos) from None
        if len(data) != n:
            raise FormatError("file ends early (truncated while open?)", self.path, pos)
        return data

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self.fd)


def _check_index_slots(f, r: _Reader, geo, count: int, max_slots: int | None, max_heads: int | None,
                       problems: list[str]) -> None:
    n = geo.hash_slot_num if max_slots is None else min(max_slots, geo.hash_slot_num)
    heads: list[tuple[int, int]] = []
    bad = 0
    chunk = 16384
    for first in range(0, n, chunk):
        m = min(chunk, n - first)
        values = hash_slots(m).unpack(r.read(geo.slot_pos(first), m * INDEX_HASH_SLOT_SIZE))
        if not any(values):
            continue
        for i, v in enumerate(values):
            if v == 0:
                continue
            if v < 0 or v >= count:
                bad += 1
                if bad <= 3:
                    problems.append(f"{f.name}: slot {first + i} = {v}, outside [0, indexCount {count})")
            elif max_heads is None or len(heads) < max_heads:
                heads.append((first + i, v))
    if bad > 3:
        problems.append(f"{f.name}: {bad} slots outside [0, indexCount {count})")
    for slot, number in heads:
        if number >= geo.index_num:
            continue
        data = r.read(geo.entry_pos(number), INDEX_SIZE)
        key_hash, _phy, time_diff, prev = INDEX_ENTRY.unpack(data)
        if key_hash < 0 or key_hash % geo.hash_slot_num != slot:
            problems.append(f"{f.name}: entry {number} (head of slot {slot}) has keyHash {key_hash}, which "
                            f"selects slot {key_hash % geo.hash_slot_num}")
        elif prev < 0 or prev >= number:
            problems.append(f"{f.name}: entry {number} prevIndex {prev} is not an earlier entry")
        elif time_diff < 0:
            problems.append(f"{f.name}: entry {number} has a negative timeDiff {time_diff}")
        if len(problems) >= 8:
            break


def geometry_hint() -> str:
    return "pass --index-slots/--index-entries or --broker-config with the broker's maxHashSlotNum/maxIndexNum"


def layout_summary(store: str | os.PathLike | None) -> dict:
    """Sizes that define how the store is laid out, from file sizes only (no data is read): the evidence
    manifest's ``geometry``."""
    if store is None:
        return {}
    geo: dict = {}
    try:
        from rmqdump.store.commitlog import CommitLog

        cl = CommitLog.open(store)
        geo["commitlog"] = {"directory": str(cl.location), "file_size": cl.file_size,
                            "segments": len(cl.segments), "min_offset": cl.min_offset,
                            "max_end": cl.segments[-1].end if cl.segments else 0}
    except RmqdumpError as e:
        geo["commitlog"] = {"error": str(e)}
    root = Path(store)
    if root.is_dir() and (root / "commitlog").is_dir():
        try:
            from rmqdump.store.consumequeue import infer_store_cq_file_size

            geo["consumequeue_file_size"] = infer_store_cq_file_size(root)
        except RmqdumpError as e:
            geo["consumequeue_file_size"] = {"error": str(e)}
        try:
            from rmqdump.store.indexfile import infer_geometry, list_index_files

            files = list_index_files(root)
            if files:
                g = infer_geometry(files[0].stat().st_size, file=files[0])
                geo["index"] = {"files": len(files), "hash_slot_num": g.hash_slot_num, "index_num": g.index_num,
                                "file_size": g.file_size}
            else:
                geo["index"] = {"files": 0}
        except (RmqdumpError, OSError) as e:
            geo["index"] = {"error": str(e)}
    return geo
