"""Write records into a store the way the broker does: encode, roll segments, dispatch CQ and index.

:class:`StoreWriter` is the dispatching writer under fixtures, tests and the locked appender
(the appender adds the lock, the abort marker and recovery of the true end). It assigns
QUEUEOFFSET per topic-queue (PREPARED/ROLLBACK get 0), PHYSICALOFFSET, the store time,
body CRC, the end-of-file blank and new segments of the store's file size, ConsumeQueue
entries (NOT/COMMIT only) and index entries (all but ROLLBACK), as §14 describes.
"""

from __future__ import annotations

import itertools
import os
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from .encoder import choose_magic, encode_blank, encode_fields, properties_bytes, with_record_crc
from .errors import FormatError, StoreError
from .format import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    COMPRESSION_TYPE_BY_NAME,
    COMPRESSION_TYPE_COMPARATOR,
    END_FILE_MIN_BLANK_LENGTH,
    MAPPED_FILE_SIZE_COMMITLOG,
    MAPPED_FILE_SIZE_CONSUME_QUEUE,
    MAX_HASH_SLOT_NUM,
    MAX_INDEX_NUM,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    STORE_COMMITLOG_DIR,
    STORE_CONSUMEQUEUE_DIR,
    STORE_INDEX_DIR,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from .javahash import DEFAULT_DELAY_LEVELS_MS, dispatch_tags_code
from .msgid import parse_host
from .properties import parse_properties
from .segment import offset_to_file_name

_counter = itertools.count()


def make_uniq_key(ip: bytes, pid: int, classloader: int, epoch_ms: int, counter: int) -> str:
    """A client msgId in ``MessageClientIDSetter``'s layout (time since the UTC month start)."""
    t = time.gmtime(epoch_ms // 1000)
    month_start = int(time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)) - time.timezone) * 1000
    return (ip + struct.pack(">HiiH", pid & 0xFFFF, classloader, (epoch_ms - month_start) & 0x7FFFFFFF,
                             counter & 0xFFFF)).hex().upper()


@dataclass
class MessageSpec:
    """What a producer sends, plus the broker-side fields a forensic writer may pin."""

    topic: str
    body: bytes = b""
    queue_id: int = 0
    tags: str | None = None
    keys: str | list[str] | None = None
    properties: dict[str, str] = field(default_factory=dict)
    properties_raw: bytes | None = None  # exact stored properties string (overrides the above)
    flag: int = 0
    transaction: int = TRANSACTION_NOT_TYPE
    compression: str | None = None  # zlib | lz4 | zstd | "legacy-zlib"
    born_timestamp: int | None = None
    store_timestamp: int | None = None
    born_host: str = "127.0.0.1:34732"
    store_host: str | None = None
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    uniq_key: str | None = None
    auto_uniq_key: bool = True
    magic: int | None = None
    record_crc: bool = False  # 5.2+ __CRC32# property
    queue_offset: int | None = None  # pin (forensic copies); None = assign like the broker

    def build_properties(self) -> bytes:
        if self.properties_raw is not None:
            return self.properties_raw
        props: dict[str, str] = {}
        if self.keys:
            props[PROPERTY_KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        if self.uniq_key:
            props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = self.uniq_key
        props.update(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        return properties_bytes(props)


@dataclass
class Appended:
    """Where a record landed."""

    offset: int
    size: int
    queue_offset: int
    msg_id: str
    uniq_key: str | None
    topic: str
    queue_id: int


def compress_body(body: bytes, compression: str | None) -> tuple[bytes, int]:
    """(stored body, sysflag bits) for a compression choice."""
    if not compression or compression == "none":
        return body, 0
    if compression == "legacy-zlib":
        return zlib.compress(body, 5), COMPRESSED_FLAG
    if compression == "zlib":
        return zlib.compress(body, 5), COMPRESSED_FLAG | COMPRESSION_TYPE_BY_NAME["zlib"]
    if compression == "lz4":
        import lz4.frame

        return lz4.frame.compress(body), COMPRESSED_FLAG | COMPRESSION_TYPE_BY_NAME["lz4"]
    if compression == "zstd":
        import zstandard

        return zstandard.ZstdCompressor(level=3).compress(body), COMPRESSED_FLAG | COMPRESSION_TYPE_BY_NAME["zstd"]
    raise FormatError(f"unknown compression {compression!r}")


class StoreWriter:
    """Append records to a store directory (creating it if needed), dispatching CQ and index.

    ``start_offset`` is where the next record goes (the end of valid data of an existing
    store); ``queue_offsets`` maps ``(topic, queue_id)`` to the next QUEUEOFFSET (read from
    the ConsumeQueues when omitted). The caller is responsible for locking and durability
    order (:meth:`sync` fsyncs data, then metadata, then directories).
    """

    def __init__(self, root: str | os.PathLike, *, commitlog_file_size: int = MAPPED_FILE_SIZE_COMMITLOG,
                 cq_file_size: int = MAPPED_FILE_SIZE_CONSUME_QUEUE, index_slots: int = MAX_HASH_SLOT_NUM,
                 index_entries: int = MAX_INDEX_NUM, start_offset: int = 0,
                 queue_offsets: dict[tuple[str, int], int] | None = None, store_host: str = "127.0.0.1:10911",
                 clock=None, delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS, build_index: bool = True,
                 index_name_clock=None):
        self.root = Path(root)
        self.file_size = commitlog_file_size
        self.cq_file_size = cq_file_size
        self.index_slots = index_slots
        self.index_entries = index_entries
        self.offset = start_offset
        self.queue_offsets = dict(queue_offsets or {})
        self.store_host = store_host
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.index_name_clock = index_name_clock or self.clock
        self.delay_levels_ms = delay_levels_ms
        self.build_index = build_index
        for d in (STORE_COMMITLOG_DIR, STORE_CONSUMEQUEUE_DIR, STORE_INDEX_DIR):
            (self.root / d).mkdir(parents=True, exist_ok=True)
        self._seg_fd: int | None = None
        self._seg_start = -1
        self._cq: dict[tuple[str, int], object] = {}
        self._index = None
        self._dirty_segments: set[int] = set()
        self._new_files: set[Path] = set()
        self.last_store_timestamp = 0
        self.last_cq_timestamp = 0

    # --- commitlog ---------------------------------------------------------------------------
    def _segment_fd(self, start: int) -> int:
        if self._seg_start == start and self._seg_fd is not None:
            return self._seg_fd
        if self._seg_fd is not None:
            os.close(self._seg_fd)
            self._seg_fd = None
        path = self.root / STORE_COMMITLOG_DIR / offset_to_file_name(start)
        flags = os.O_RDWR | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            os.ftruncate(fd, self.file_size)
            self._new_files.add(path)
        except FileExistsError:
            fd = os.open(path, flags)
            if os.fstat(fd).st_size != self.file_size:
                os.close(fd)
                raise StoreError(f"segment is not the store's file size {self.file_size}", path) from None
        except OSError as e:
            raise StoreError(f"cannot create segment: {e.strerror}", path) from None
        self._seg_fd, self._seg_start = fd, start
        return fd

    def _pwrite(self, data: bytes, offset: int) -> None:
        start = offset - offset % self.file_size
        fd = self._segment_fd(start)
        try:
            os.pwrite(fd, data, offset - start)
        except OSError as e:
            raise StoreError(f"write failed: {e.strerror}", self.root / STORE_COMMITLOG_DIR / offset_to_file_name(start),
                             offset - start) from None
        self._dirty_segments.add(start)

    # --- records -----------------------------------------------------------------------------
    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        key = (topic, queue_id)
        if key not in self.queue_offsets:
            cq = self._cq_writer(topic, queue_id)
            self.queue_offsets[key] = cq.next_queue_offset
        return self.queue_offsets[key]

    def _cq_writer(self, topic: str, queue_id: int):
        from .consumequeue import ConsumeQueueWriter
        from .paths import safe_child

        key = (topic, queue_id)
        w = self._cq.get(key)
        if w is None:
            qdir = safe_child(self.root / STORE_CONSUMEQUEUE_DIR, topic) / str(queue_id)
            w = ConsumeQueueWriter(qdir, self.cq_file_size)
            self._cq[key] = w
        return w

    def encode(self, spec: MessageSpec, physical_offset: int, queue_offset: int, store_ts: int) -> bytes:
        body, sys_flag = compress_body(spec.body, spec.compression)
        sys_flag |= spec.transaction & TRANSACTION_TYPE_MASK
        born_addr, born_port = parse_host(spec.born_host)
        store_addr, store_port = parse_host(spec.store_host or self.store_host)
        if len(born_addr) == 16:
            sys_flag |= BORNHOST_V6_FLAG
        if len(store_addr) == 16:
            sys_flag |= STOREHOSTADDRESS_V6_FLAG
        if spec.compression in ("lz4", "zstd", "zlib") and sys_flag & COMPRESSION_TYPE_COMPARATOR == 0:
            raise FormatError("compression bits lost")
        magic = spec.magic if spec.magic is not None else choose_magic(spec.topic)
        rec = encode_fields(
            topic=spec.topic.encode("utf-8"), body=body, properties=spec.build_properties(),
            queue_id=spec.queue_id, flag=spec.flag, queue_offset=queue_offset, physical_offset=physical_offset,
            sys_flag=sys_flag, born_timestamp=spec.born_timestamp if spec.born_timestamp is not None else store_ts,
            born_addr=born_addr, born_port=born_port, store_timestamp=store_ts, store_addr=store_addr,
            store_port=store_port, reconsume_times=spec.reconsume_times,
            prepared_transaction_offset=spec.prepared_transaction_offset, magic=magic,
        )
        return with_record_crc(rec) if spec.record_crc else rec

    def append(self, spec: MessageSpec) -> Appended:
        """Encode, place (rolling to a new segment when needed) and dispatch one record."""
        if spec.uniq_key is None and spec.auto_uniq_key and spec.properties_raw is None:
            spec.uniq_key = make_uniq_key(b"\x7f\x00\x00\x01", os.getpid(), 0x5EED, self.clock(), next(_counter))
        store_ts = spec.store_timestamp if spec.store_timestamp is not None else self.clock()
        tran = spec.transaction & TRANSACTION_TYPE_MASK
        dispatchable = tran in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)
        if spec.queue_offset is not None:
            qoff = spec.queue_offset
        else:
            qoff = self.next_queue_offset(spec.topic, spec.queue_id) if dispatchable else 0
        rec = self.encode(spec, self.offset, qoff, store_ts)
        remaining = self.file_size - self.offset % self.file_size
        if len(rec) + END_FILE_MIN_BLANK_LENGTH > self.file_size:
            raise FormatError(f"record of {len(rec)} bytes cannot fit a {self.file_size} byte segment")
        if len(rec) + END_FILE_MIN_BLANK_LENGTH > remaining:
            self._pwrite(encode_blank(remaining), self.offset)
            self.offset += remaining
            rec = self.encode(spec, self.offset, qoff, store_ts)
        phys = self.offset
        self._pwrite(rec, phys)
        self.offset += len(rec)
        self.last_store_timestamp = store_ts
        if dispatchable:
            self.queue_offsets[(spec.topic, spec.queue_id)] = qoff + 1
        self._dispatch(spec, rec, phys, qoff, store_ts, tran)
        from .msgid import create_offset_msg_id

        store_addr, store_port = parse_host(spec.store_host or self.store_host)
        props = parse_properties(spec.build_properties().decode("utf-8", "replace"))
        return Appended(phys, len(rec), qoff, create_offset_msg_id(store_addr, store_port, phys),
                        props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX), spec.topic, spec.queue_id)

    def _dispatch(self, spec: MessageSpec, rec: bytes, phys: int, qoff: int, store_ts: int, tran: int) -> None:
        props = parse_properties(spec.build_properties().decode("utf-8", "replace"))
        if tran in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            try:
                tags_code = dispatch_tags_code(spec.topic, props, store_ts, self.delay_levels_ms)
            except ValueError:
                raise FormatError(f"malformed {PROPERTY_DELAY_TIME_LEVEL} property") from None
            self._cq_writer(spec.topic, spec.queue_id).put_message_position_info(phys, len(rec), tags_code, qoff)
            self.last_cq_timestamp = store_ts
        if self.build_index and tran != TRANSACTION_ROLLBACK_TYPE:
            self._put_index(spec.topic, props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX), props.get(PROPERTY_KEYS),
                            phys, store_ts, tran)

    def _put_index(self, topic, uniq, keys, phys, store_ts, tran) -> None:
        from .indexfile import IndexBuilder, IndexFileWriter, list_index_files

        if self._index is None:
            self._index = IndexBuilder(self.root / STORE_INDEX_DIR, self.index_slots, self.index_entries,
                                       clock_ms=self.index_name_clock, utc=True)
            files = list_index_files(self.root)
            if files:
                self._index.writer = IndexFileWriter.open(files[-1], self.index_slots, self.index_entries)
        before = self._index.writer
        self._index.add_message(topic, uniq, keys, phys, store_ts, tran)
        if self._index.writer is not before:
            self._new_files.add(self._index.writer.path)

    # --- durability ----------------------------------------------------------------------------
    def sync(self) -> None:
        """fsync written segments, CQ files, the index file, then the directories of new files."""
        if self._seg_fd is not None and self._seg_start in self._dirty_segments:
            os.fsync(self._seg_fd)
        for start in self._dirty_segments - {self._seg_start}:
            path = self.root / STORE_COMMITLOG_DIR / offset_to_file_name(start)
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        self._dirty_segments.clear()
        for w in self._cq.values():
            w.fsync()
        if self._index is not None and self._index.writer is not None:
            self._index.writer.fsync()
        for d in {p.parent for p in self._new_files} | {self.root / STORE_COMMITLOG_DIR}:
            fsync_dir(d)
        self._new_files.clear()

    def close(self) -> None:
        if self._seg_fd is not None:
            os.close(self._seg_fd)
            self._seg_fd = None
        for w in self._cq.values():
            w.close()
        self._cq.clear()
        if self._index is not None:
            self._index.close()
            self._index = None

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def fsync_dir(path: Path) -> None:
    """fsync a directory so new entries in it are durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
