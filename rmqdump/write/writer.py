"""Write records into a store the way the broker does: encode, roll segments, dispatch CQ and index.

:class:`StoreWriter` is the dispatching writer under fixtures, tests and the locked appender
(the appender adds the lock, the abort marker and recovery of the true end). It assigns
QUEUEOFFSET per topic-queue (PREPARED/ROLLBACK get 0), PHYSICALOFFSET, the store time,
body CRC, the end-of-file blank and new segments of the store's file size, ConsumeQueue
entries (NOT/COMMIT only) and index entries (all but ROLLBACK), as §14 describes.

Durability (:meth:`StoreWriter.sync`): records are buffered and written with ``pwrite``;
the first 8 bytes of a batch (TOTALSIZE + MAGIC of its first record or blank) are held
back until the rest of the batch is on disk, so a batch cut short by a crash is invisible
to recovery (it ends at zeros). ConsumeQueue and index entries are written only after the
commitlog bytes they point to are durable, so metadata never references lost data.
"""

from __future__ import annotations

import calendar
import errno
import functools
import itertools
import os
import secrets
import stat
import struct
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.encoder import choose_magic, encode_blank, encode_fields, properties_bytes, with_record_crc
from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS, dispatch_tags_code, java_string_hash
from rmqdump.codec.javahash import index_key_hash as index_hash  # noqa: F401 - the writer's name
from rmqdump.codec.javahash import index_key_hashes as index_hashes
from rmqdump.codec.layout import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    COMPRESSION_TYPE_BY_NAME,
    COMPRESSION_TYPE_COMPARATOR,
    END_FILE_MIN_BLANK_LENGTH,
    HOST_V4_LENGTH,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    INNER_BATCH_FLAG,
    MAPPED_FILE_SIZE_COMMITLOG,
    MAPPED_FILE_SIZE_CONSUME_QUEUE,
    MAX_HASH_SLOT_NUM,
    MAX_INDEX_NUM,
    MAX_PROPERTIES_LENGTH,
    MESSAGE_FIXED_OVERHEAD,
    MESSAGE_MAGIC_CODE_V2,
    MULTI_TAGS_FLAG,
    NEED_UNWRAP_FLAG,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    SCHEDULE_TOPIC,
    STORE_COMMITLOG_DIR,
    STORE_CONSUMEQUEUE_DIR,
    STORE_INDEX_DIR,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.codec.msgid import create_offset_msg_id, parse_host
from rmqdump.codec.properties import parse_properties
from rmqdump.disk.paths import is_safe_component
from rmqdump.disk.segment import offset_to_file_name
from rmqdump.errors import FormatError, StoreError

_counter = itertools.count()
#: records are written in chunks of at most this many buffered bytes
WRITE_CHUNK = 8 << 20
#: sysflag bits a caller may pass through (compression bits come from ``compressed_flags``)
_PASS_THROUGH_FLAGS = MULTI_TAGS_FLAG
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


@functools.lru_cache(maxsize=64)
def _month_start_ms(day: int) -> int:
    t = time.gmtime(day * 86400)
    return calendar.timegm((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)) * 1000


def make_uniq_key(ip: bytes, pid: int, classloader: int, epoch_ms: int, counter: int) -> str:
    """A client msgId in ``MessageClientIDSetter``'s layout (time since the UTC month start)."""
    month_start = _month_start_ms(epoch_ms // 86_400_000)
    return (ip + _UNIQ_TAIL.pack(pid & 0xFFFF, classloader, (epoch_ms - month_start) & 0x7FFFFFFF,
                                 counter & 0xFFFF)).hex().upper()


_UNIQ_TAIL = struct.Struct(">HiiH")
#: a record's fields up to BODYLENGTH with IPv4 born and store hosts (encoder.encode_fields' layout)
_V4_HEAD = struct.Struct(">iIiiiqqiq4siq4siiqi")
_PROPS_LEN = struct.Struct(">h")
#: TOTALSIZE minus body, topic (with its length field) and properties for IPv4 hosts
_V4_OVERHEAD = MESSAGE_FIXED_OVERHEAD + 2 * HOST_V4_LENGTH
_choose_magic = functools.lru_cache(maxsize=4096)(choose_magic)
_FORKS = [0]  # bumped in a forked child: writers read their pid again
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


@functools.lru_cache(maxsize=1024)
def _host(text: str) -> tuple[bytes, int]:
    return parse_host(text)


@dataclass(slots=True)
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
    compression: str | None = None  # zlib | lz4 | zstd | "legacy-zlib": compress ``body`` first
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
    compressed_flags: int = 0  # body is already stored form: these COMPRESSED|type bits are set as-is
    extra_sys_flag: int = 0  # other sysflag bits to keep (only MULTI_TAGS_FLAG is passed through)
    source_offset: int | None = None  # offset in the store a copied record came from (re-points tx offsets)

    def properties_dict(self) -> dict[str, str]:
        """The properties as the broker's parser reads them back (``properties_raw`` is parsed)."""
        if self.properties_raw is not None:
            return parse_properties(self.properties_raw.decode("utf-8", "replace"))
        return {k: v for k, v in self._props().items() if len(k) + len(v) >= 2 and k and v}

    def build_properties(self) -> bytes:
        if self.properties_raw is not None:
            return self.properties_raw
        return properties_bytes(self._props())

    def _props(self) -> dict[str, str]:
        props: dict[str, str] = {}
        if self.keys:
            props[PROPERTY_KEYS] = self.keys if isinstance(self.keys, str) else " ".join(self.keys)
        if self.uniq_key:
            props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = self.uniq_key
        props.update(self.properties)
        if self.tags:
            props[PROPERTY_TAGS] = self.tags
        return props

    def has_uniq_key(self) -> bool:
        if self.uniq_key:
            return True
        if self.properties_raw is not None:
            return True  # raw properties are written verbatim: never add a key to them
        return PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX in self.properties


@dataclass
class Appended:
    """Where a record landed (``blank_at``: offset of the end-of-file blank written before it)."""

    offset: int
    size: int
    queue_offset: int
    msg_id: str
    uniq_key: str | None
    topic: str
    queue_id: int
    store_timestamp: int = 0
    blank_at: int | None = None


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


# --- durability helpers -------------------------------------------------------------------------


def fsync_fd(fd: int, what: str | os.PathLike) -> None:
    """fsync one descriptor; an error is a failure (never retried: the kernel may have dropped the data)."""
    try:
        os.fsync(fd)
    except OSError as e:
        raise StoreError(f"fsync failed: {e.strerror}; the data written since the last sync may be lost",
                         what) from None


def fsync_path(path: str | os.PathLike) -> None:
    """fsync a regular file by path (never following a symlink)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | _O_CLOEXEC)
    except OSError as e:
        raise StoreError(f"cannot open for fsync: {e.strerror}", path) from None
    try:
        fsync_fd(fd, path)
    finally:
        os.close(fd)


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory so new or removed entries in it are durable."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW | _O_CLOEXEC)
    except OSError as e:
        raise StoreError(f"cannot open directory for fsync: {e.strerror}", path) from None
    try:
        os.fsync(fd)
    except OSError as e:
        if e.errno not in (errno.EINVAL, errno.EROFS):  # some filesystems cannot fsync directories
            raise StoreError(f"directory fsync failed: {e.strerror}", path) from None
    finally:
        os.close(fd)


def ensure_store_dir(root: Path, *parts: str, create: bool = True) -> tuple[Path, list[Path]]:
    """``root/parts...`` as real directories (never a symlink), creating missing ones.

    Returns the path and the parents whose entries changed (to fsync). Raises
    :class:`StoreError` for a symlink, a non-directory or an unsafe name. With ``create=False``
    nothing is created: the full path is still returned (every existing component checked, every
    missing one only named) — callers must not assume it exists.
    """
    path = root
    changed: list[Path] = []
    missing = False
    for part in parts:
        if not is_safe_component(part):
            raise StoreError(f"refusing unsafe directory name {part!r}", path)
        nxt = path / part
        if missing:  # below a missing directory nothing exists
            path = nxt
            continue
        try:
            st = os.lstat(nxt)
        except FileNotFoundError:
            if not create:
                missing = True
                path = nxt
                continue
            try:
                os.mkdir(nxt, 0o755)
            except FileExistsError:
                st = os.lstat(nxt)
            except OSError as e:
                raise StoreError(f"cannot create directory: {e.strerror}", nxt) from None
            else:
                changed.append(path)
                path = nxt
                continue
        except OSError as e:
            raise StoreError(f"cannot stat: {e.strerror}", nxt) from None
        if stat.S_ISLNK(st.st_mode):
            raise StoreError("is a symlink; refusing to follow it out of the store", nxt)
        if not stat.S_ISDIR(st.st_mode):
            raise StoreError("is not a directory", nxt)
        path = nxt
    return path, changed


def _allocate_zeros(path: Path, start: int, length: int) -> None:
    """Write real zeros over ``path[start:start + length]``, a range of a file we just created (a hole).

    The content does not change; the blocks get allocated once. The hash-slot table of a new
    index file takes random 4-byte writes: filling those into holes of a sparse file costs a
    block allocation (and extent-tree churn) per touched page at every fsync.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | _O_CLOEXEC)
    except OSError as e:
        raise StoreError(f"cannot open index file: {e.strerror}", path) from None
    try:
        zeros = bytes(min(length, 1 << 22))
        pos, end = start, start + length
        while pos < end:
            pos += os.pwrite(fd, memoryview(zeros)[:end - pos], pos)
    except OSError as e:
        raise StoreError(f"write failed: {e.strerror}", path, pos) from None
    finally:
        os.close(fd)


class _IndexRoller:
    """``IndexService`` for the writer: continue the last index file, roll full ones (fsynced first)."""

    def __init__(self, root: Path, slots: int, entries: int, name_clock, utc: bool):
        self.root = root
        self.slots = slots
        self.entries = entries
        self.name_clock = name_clock
        self.utc = utc
        self.writer = None
        self.full_end_timestamp = 0  # endTimestamp of the last full file made durable
        self.new_files: list[Path] = []
        self._opened = False

    def _current(self):
        from rmqdump.store.indexfile import IndexFileWriter, list_index_files

        if not self._opened:
            self._opened = True
            files = list_index_files(self.root)
            if files:
                self.writer = IndexFileWriter.open(files[-1], self.slots, self.entries)
        w = self.writer
        if w is not None and not w.is_full:
            return w
        end_phy, end_ts = (w.header.end_phy_offset, w.header.end_timestamp) if w else (0, 0)
        if w is not None:
            self._finish(w)
        index_dir, _ = ensure_store_dir(self.root, STORE_INDEX_DIR)
        self.writer = IndexFileWriter.create_in(index_dir, self.slots, self.entries, end_phy, end_ts,
                                                self.name_clock(), self.utc)
        self.new_files.append(self.writer.path)
        _allocate_zeros(self.writer.path, INDEX_HEADER_SIZE, self.slots * INDEX_HASH_SLOT_SIZE)
        return self.writer

    def _finish(self, w) -> None:
        """A full file: make it durable before closing it (the broker flushes it, then the checkpoint)."""
        try:
            w.fsync()
        except OSError as e:
            raise StoreError(f"fsync failed: {e.strerror}", w.path) from None
        self.full_end_timestamp = max(self.full_end_timestamp, w.header.end_timestamp)
        w.close()
        self.writer = None

    def put(self, hashes: list[int], phys: list[int], tss: list[int]) -> None:
        done, n = 0, len(hashes)
        while done < n:
            w = self._current()
            if done == 0 and phys[0] < w.header.end_phy_offset:
                # ``buildIndex`` skips records below the file's endPhyOffset (already indexed)
                skip = next((i for i, p in enumerate(phys) if p >= w.header.end_phy_offset), n)
                done = skip
                continue
            done += w.bulk_put(hashes[done:], phys[done:], tss[done:])

    def fsync(self) -> None:
        if self.writer is not None:
            try:
                self.writer.fsync()
            except OSError as e:
                raise StoreError(f"fsync failed: {e.strerror}", self.writer.path) from None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


class StoreWriter:
    """Append records to a store directory (creating it if needed), dispatching CQ and index.

    ``start_offset`` is where the next record goes (the end of valid data of an existing
    store); ``queue_offsets`` maps ``(topic, queue_id)`` to the next QUEUEOFFSET (read from
    the ConsumeQueues when omitted). The caller is responsible for locking; :meth:`sync`
    makes everything appended so far durable (data, then metadata, then directories).
    With ``dry_run`` nothing is created or written: :meth:`append` only reports placement.
    """

    def __init__(self, root: str | os.PathLike, *, commitlog_file_size: int = MAPPED_FILE_SIZE_COMMITLOG,
                 cq_file_size: int = MAPPED_FILE_SIZE_CONSUME_QUEUE, index_slots: int = MAX_HASH_SLOT_NUM,
                 index_entries: int = MAX_INDEX_NUM, start_offset: int = 0,
                 queue_offsets: dict[tuple[str, int], int] | None = None, store_host: str = "127.0.0.1:10911",
                 clock=None, delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS, build_index: bool = True,
                 index_name_clock=None, index_utc: bool = True, dry_run: bool = False,
                 commit_header_last: bool = True):
        self.root = Path(root)
        if commitlog_file_size <= END_FILE_MIN_BLANK_LENGTH:
            raise FormatError(f"bad commitlog file size {commitlog_file_size}")
        self.file_size = commitlog_file_size
        self.cq_file_size = cq_file_size
        self.index_slots = index_slots
        self.index_entries = index_entries
        self.offset = start_offset
        self.queue_offsets = dict(queue_offsets or {})
        self.store_host = store_host
        self._store_addr = _host(store_host)
        self._store_addr3 = (*self._store_addr, len(self._store_addr[0]) == 4)
        self.clock = clock or (lambda: int(time.time() * 1000))
        self.index_name_clock = index_name_clock or self.clock
        self.delay_levels_ms = delay_levels_ms
        self.build_index = build_index
        self.dry_run = dry_run
        self.commit_header_last = commit_header_last
        self._classloader = int.from_bytes(secrets.token_bytes(4), "big", signed=True)
        self._uniq_counter = itertools.count(secrets.randbelow(1 << 16))
        self._failed: str | None = None
        self._seg_fd: int | None = None
        self._seg_start = -1
        self._cq: dict[tuple[str, int], object] = {}
        self._cq_dirty: set[tuple[str, int]] = set()
        self._index: _IndexRoller | None = None
        self._dirty_segments: set[int] = set()
        self._new_segment = False
        self._dirs_to_sync: set[Path] = set()
        self._buf = bytearray()
        self._buf_off = start_offset
        self._head: tuple[int, bytes] | None = None  # held-back first 8 bytes of the current batch
        self._batch_started = False
        # dispatch queued until sync(): CQ units per queue (flat offset, size, tagsCode, queue offset),
        # store times of dispatchable records, index keys with their offsets and store times
        self._pend_cq: dict[tuple[str, int], list[int]] = {}
        self._pend_cq_ts: list[int] = []
        self._pend_keys: list[str] = []
        self._pend_kphys: list[int] = []
        self._pend_kts: list[int] = []
        self._uniq_prefix: dict[str, str] = {}  # born host -> uniq-key prefix (IP, pid, class loader)
        self._forks, self._pid = _FORKS[0], os.getpid()
        self._uniq_day = self._uniq_month_start = -1
        self._hosts: dict[str, tuple[bytes, int]] = {}
        self._pool = None  # threads for concurrent metadata fsyncs (created on first use)
        self._topics: dict[str, tuple[int, bytes]] = {}
        self._tags_codes: dict[str, int] = {}
        self.last_store_timestamp = 0
        self.last_cq_timestamp = 0
        self.max_store_timestamp = 0
        self.max_cq_timestamp = 0
        self.durable_offset = start_offset  # end of the records made durable by sync()
        if not dry_run:
            if not self.root.exists():
                try:
                    self.root.mkdir(parents=True)
                except OSError as e:
                    raise StoreError(f"cannot create store directory: {e.strerror}", self.root) from None
            for d in (STORE_COMMITLOG_DIR, STORE_CONSUMEQUEUE_DIR, STORE_INDEX_DIR):
                _, changed = ensure_store_dir(self.root, d)
                self._dirs_to_sync.update(changed)

    # --- state ---------------------------------------------------------------------------------
    @property
    def index_msg_timestamp(self) -> int:
        """endTimestamp of the last index file that filled up and was made durable (0: none)."""
        return self._index.full_end_timestamp if self._index else 0

    @property
    def new_index_files(self) -> list[Path]:
        return list(self._index.new_files) if self._index else []

    def _check_usable(self) -> None:
        if self._failed:
            raise StoreError(f"writer unusable after an earlier failure: {self._failed}", self.root)

    def _fail(self, exc: StoreError) -> StoreError:
        self._failed = str(exc)
        return exc

    # --- commitlog -----------------------------------------------------------------------------
    def _segment_path(self, start: int) -> Path:
        return self.root / STORE_COMMITLOG_DIR / offset_to_file_name(start)

    def _segment_fd(self, start: int) -> int:
        if self._seg_start == start and self._seg_fd is not None:
            return self._seg_fd
        if self._seg_fd is not None:
            os.close(self._seg_fd)
            self._seg_fd = None
        path = self._segment_path(start)
        flags = os.O_RDWR | os.O_NOFOLLOW | _O_CLOEXEC
        try:
            fd = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.ftruncate(fd, self.file_size)
            except OSError:
                os.close(fd)
                raise
            self._new_segment = True
        except FileExistsError:
            try:
                fd = os.open(path, flags)
            except OSError as e:
                raise StoreError(f"cannot open segment: {e.strerror}", path) from None
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_size != self.file_size:
                os.close(fd)
                raise StoreError(f"segment is not a regular file of the store's file size {self.file_size}",
                                 path) from None
        except OSError as e:
            raise StoreError(f"cannot create segment: {e.strerror}", path) from None
        self._seg_fd, self._seg_start = fd, start
        return fd

    def _pwrite(self, data, offset: int) -> None:
        start = offset - offset % self.file_size
        fd = self._segment_fd(start)
        view = memoryview(data)
        pos = offset - start
        try:
            while view:
                n = os.pwrite(fd, view, pos)
                view, pos = view[n:], pos + n
        except OSError as e:
            raise self._fail(StoreError(f"write failed: {e.strerror}", self._segment_path(start), pos)) from None
        self._dirty_segments.add(start)

    def _buffer(self, data: bytes, offset: int) -> None:
        """Queue bytes for ``offset`` (contiguous with the buffer, same segment), flushing as needed."""
        if self._buf and (offset != self._buf_off + len(self._buf)
                          or offset // self.file_size != self._buf_off // self.file_size):
            self._flush_buffer()
        if not self._buf:
            self._buf_off = offset
        self._buf += data
        if len(self._buf) >= WRITE_CHUNK:
            self._flush_buffer()

    def _flush_buffer(self) -> None:
        if not self._buf:
            return
        buf, off = self._buf, self._buf_off
        self._buf = bytearray()
        self._write_out(buf, off)

    def _write_out(self, buf: bytearray, off: int) -> None:
        if not buf:
            return
        if self.commit_header_last and not self._batch_started:
            # the batch's first 8 bytes are written last: until then recovery sees zeros here
            self._head = (off, bytes(buf[:8]))
            self._batch_started = True
            if len(buf) > 8:
                self._pwrite(memoryview(buf)[8:], off + 8)
            else:
                self._segment_fd(off - off % self.file_size)
        else:
            self._batch_started = True
            self._pwrite(buf, off)

    # --- records -----------------------------------------------------------------------------
    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        key = (topic, queue_id)
        if key not in self.queue_offsets:
            if self.dry_run:
                self.queue_offsets[key] = _read_next_queue_offset(self.root, topic, queue_id, self.cq_file_size)
            else:
                self.queue_offsets[key] = self._cq_writer(topic, queue_id).next_queue_offset
        return self.queue_offsets[key]

    def _cq_writer(self, topic: str, queue_id: int):
        from rmqdump.store.consumequeue import ConsumeQueueWriter

        key = (topic, queue_id)
        w = self._cq.get(key)
        if w is None:
            qdir, changed = ensure_store_dir(self.root, STORE_CONSUMEQUEUE_DIR, topic, str(queue_id))
            self._dirs_to_sync.update(changed)
            w = ConsumeQueueWriter(qdir, self.cq_file_size)
            self._cq[key] = w
        return w

    def encode(self, spec: MessageSpec, physical_offset: int, queue_offset: int, store_ts: int,
               properties: bytes | None = None) -> bytes:
        if spec.compressed_flags:
            if spec.compression:
                raise FormatError("compression and compressed_flags are exclusive")
            body = spec.body
            sys_flag = spec.compressed_flags & (COMPRESSED_FLAG | COMPRESSION_TYPE_COMPARATOR)
        else:
            body, sys_flag = compress_body(spec.body, spec.compression)
        if spec.extra_sys_flag & (INNER_BATCH_FLAG | NEED_UNWRAP_FLAG):
            raise FormatError("inner-batch records (BatchConsumeQueue topics) cannot be appended")
        sys_flag |= spec.extra_sys_flag & _PASS_THROUGH_FLAGS
        sys_flag |= spec.transaction & TRANSACTION_TYPE_MASK
        born_addr, born_port = _host(spec.born_host)
        store_addr, store_port = _host(spec.store_host) if spec.store_host else self._store_addr
        if len(born_addr) == 16:
            sys_flag |= BORNHOST_V6_FLAG
        if len(store_addr) == 16:
            sys_flag |= STOREHOSTADDRESS_V6_FLAG
        if spec.compression in ("lz4", "zstd", "zlib") and sys_flag & COMPRESSION_TYPE_COMPARATOR == 0:
            raise FormatError("compression bits lost")
        magic = spec.magic if spec.magic is not None else _choose_magic(spec.topic)
        rec = encode_fields(
            topic=spec.topic.encode("utf-8"), body=body,
            properties=spec.build_properties() if properties is None else properties,
            queue_id=spec.queue_id, flag=spec.flag, queue_offset=queue_offset, physical_offset=physical_offset,
            sys_flag=sys_flag, born_timestamp=spec.born_timestamp if spec.born_timestamp is not None else store_ts,
            born_addr=born_addr, born_port=born_port, store_timestamp=store_ts, store_addr=store_addr,
            store_port=store_port, reconsume_times=spec.reconsume_times,
            prepared_transaction_offset=spec.prepared_transaction_offset, magic=magic,
        )
        return with_record_crc(rec) if spec.record_crc else rec

    def _generate_uniq_key(self, spec: MessageSpec, born_ts: int) -> str:
        addr, _ = _host(spec.born_host)
        return make_uniq_key(addr, os.getpid(), self._classloader, born_ts, next(self._uniq_counter))

    def _new_uniq_key(self, born_host: str, born_ts: int) -> str:
        """:func:`make_uniq_key` with the constant prefix (IP, pid, class loader) cached."""
        if self._forks != _FORKS[0]:  # forked since the pid was read
            self._forks, self._pid = _FORKS[0], os.getpid()
            self._uniq_prefix.clear()
        prefix = self._uniq_prefix.get(born_host)
        if prefix is None:
            addr, _ = _host(born_host)
            prefix = (addr + struct.pack(">Hi", self._pid & 0xFFFF, self._classloader)).hex().upper()
            self._uniq_prefix[born_host] = prefix
        day = born_ts // 86_400_000
        if day != self._uniq_day:
            self._uniq_day, self._uniq_month_start = day, _month_start_ms(day)
        return f"{prefix}{(born_ts - self._uniq_month_start) & 0x7FFFFFFF:08X}{next(self._uniq_counter) & 0xFFFF:04X}"

    def _host_entry(self, text: str) -> tuple[bytes, int, bool]:
        if len(self._hosts) > 4096:
            self._hosts.clear()
        addr, port = _host(text)
        entry = self._hosts[text] = (addr, port, len(addr) == 4)
        return entry

    def _topic_part(self, topic: str) -> tuple[int, bytes]:
        """(magic, TOPICLENGTH + TOPIC bytes) of a topic (the broker's magic choice)."""
        info = self._topics.get(topic)
        if info is None:
            magic = _choose_magic(topic)
            tb = topic.encode("utf-8")
            info = (magic, (len(tb).to_bytes(2, "big") if magic == MESSAGE_MAGIC_CODE_V2
                            else struct.pack(">B", len(tb) & 0xFF)) + tb)
            self._topics[topic] = info
        return info

    def _tags_code(self, tags: str | None) -> int:
        if not tags:
            return 0
        code = self._tags_codes.get(tags)
        if code is None:
            code = java_string_hash(tags)  # signed int32, sign-extended
            if len(self._tags_codes) < 65536:
                self._tags_codes[tags] = code
        return code

    def append(self, spec: MessageSpec) -> Appended:
        """Encode, place (rolling to a new segment when needed) and queue the dispatch of one record.

        Nothing is durable (nor dispatched) until :meth:`sync`. Validation errors are raised
        before any byte of the record is written.
        """
        phys, size, qoff, uniq, store_ts, blank_at, host, topic, queue_id = self.place(spec)
        return Appended(phys, size, qoff, create_offset_msg_id(host[0], host[1], phys), uniq, topic, queue_id,
                        store_ts, blank_at)

    def place(self, spec: MessageSpec) -> tuple:
        """:meth:`append` without building an :class:`Appended`: returns ``(offset, size,
        queue_offset, uniq_key, store_timestamp, blank_at, (store_addr, store_port, is_ipv4), topic,
        queue_id)``. The bulk path; same bytes, same checks, same order of errors."""
        if self._failed:
            self._check_usable()
        store_ts = spec.store_timestamp
        if store_ts is None:
            store_ts = self.clock()
        born_ts = spec.born_timestamp
        if born_ts is None:
            born_ts = store_ts
        topic = spec.topic
        props = None
        props_raw = None
        if spec.properties_raw is None and not spec.properties:
            # the common producer record: KEYS, UNIQ_KEY, TAGS only (order of MessageSpec._props)
            uniq = spec.uniq_key
            if not uniq and spec.auto_uniq_key:
                uniq = spec.uniq_key = self._new_uniq_key(spec.born_host, born_ts)
            keys = spec.keys
            tags = spec.tags
            kp = None
            if keys:
                kp = keys if isinstance(keys, str) else " ".join(keys)
                if uniq:
                    text, nparts = "KEYS\x01" + kp + "\x02UNIQ_KEY\x01" + uniq, 2
                else:
                    text, nparts = "KEYS\x01" + kp, 1
            elif uniq:
                text, nparts = "UNIQ_KEY\x01" + uniq, 1
            else:
                text, nparts = "", 0
            if tags:
                if nparts:
                    text += "\x02TAGS\x01" + tags
                else:
                    text = "TAGS\x01" + tags
                nparts += 1
            # no separator inside a name or value (else properties_bytes raises below)
            if text.count("\x01") == nparts and text.count("\x02") == (nparts - 1 if nparts else 0):
                props_raw = text.encode("utf-8")
                if len(props_raw) > MAX_PROPERTIES_LENGTH:
                    props_raw = None
            if props_raw is None:
                props_raw = spec.build_properties()  # raises the separator / length error
            uniq = uniq or None
        else:
            if spec.auto_uniq_key and not spec.has_uniq_key():
                spec.uniq_key = self._generate_uniq_key(spec, born_ts)
            props_raw = spec.build_properties()
            props = spec.properties_dict() if spec.properties_raw is None else \
                parse_properties(props_raw.decode("utf-8", "replace"))
            uniq = props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX)
            kp = props.get(PROPERTY_KEYS)
            tags = props.get(PROPERTY_TAGS)
        queue_id = spec.queue_id
        tran = spec.transaction & TRANSACTION_TYPE_MASK
        dispatchable = tran == TRANSACTION_NOT_TYPE or tran == TRANSACTION_COMMIT_TYPE
        if spec.queue_offset is not None:
            qoff = spec.queue_offset
        elif dispatchable:
            qoff = self.queue_offsets.get((topic, queue_id))
            if qoff is None:
                qoff = self.next_queue_offset(topic, queue_id)
        else:
            qoff = 0
        tags_code = None
        if dispatchable:
            if topic != SCHEDULE_TOPIC:
                tags_code = self._tags_code(tags) if tags else 0
            else:
                if props is None:
                    props = spec.properties_dict()
                try:
                    tags_code = dispatch_tags_code(topic, props, store_ts, self.delay_levels_ms)
                except ValueError:
                    raise FormatError(f"malformed {PROPERTY_DELAY_TIME_LEVEL} property") from None
        hosts = self._hosts  # host text -> (address, port, is IPv4)
        born_host = hosts.get(spec.born_host)
        if born_host is None:
            born_host = self._host_entry(spec.born_host)
        store_host = spec.store_host
        if store_host:
            h = hosts.get(store_host)
            store_host = h if h is not None else self._host_entry(store_host)
        else:
            store_host = self._store_addr3
        fs = self.file_size
        rec = None
        if (born_host[2] and store_host[2] and not spec.compressed_flags and not spec.compression
                and not spec.extra_sys_flag and not spec.record_crc and spec.magic is None):
            info = self._topics.get(topic)
            magic, tpart = info if info is not None else self._topic_part(topic)
            body = spec.body
            blen = len(body)
            total = _V4_OVERHEAD + blen + len(tpart) + len(props_raw)
        else:
            rec = self.encode(spec, self.offset, qoff, store_ts, props_raw)
            total = len(rec)
        if total + END_FILE_MIN_BLANK_LENGTH > fs:
            raise FormatError(f"record of {total} bytes cannot fit a {fs} byte segment")
        phys = self.offset
        remaining = fs - phys % fs
        blank_at = None
        dry = self.dry_run
        if total + END_FILE_MIN_BLANK_LENGTH > remaining:
            blank_at = phys
            if not dry:
                self._buffer(encode_blank(remaining), phys)
            phys += remaining
            if rec is not None:
                rec = self.encode(spec, phys, qoff, store_ts, props_raw)
        if not dry:
            buf = self._buf
            if not buf or phys != self._buf_off + len(buf) or phys // fs != self._buf_off // fs:
                self._buffer(b"", phys)
                buf = self._buf
            if rec is None:
                buf += _V4_HEAD.pack(total, magic, zlib.crc32(body) & 0x7FFFFFFF, queue_id, spec.flag, qoff, phys,
                                     tran, born_ts, born_host[0], born_host[1], store_ts, store_host[0], store_host[1],
                                     spec.reconsume_times, spec.prepared_transaction_offset, blen)
                buf += body
                buf += tpart
                buf += _PROPS_LEN.pack(len(props_raw))
                buf += props_raw
            else:
                buf += rec
            if len(buf) >= WRITE_CHUNK:
                self._flush_buffer()
        self.offset = phys + total
        self.last_store_timestamp = store_ts
        if store_ts > self.max_store_timestamp:
            self.max_store_timestamp = store_ts
        if dispatchable:
            self.queue_offsets[(topic, queue_id)] = qoff + 1
        if not dry:
            if tags_code is not None:
                cq = self._pend_cq.get((topic, queue_id))
                if cq is None:
                    cq = self._pend_cq[(topic, queue_id)] = []
                cq += (phys, total, tags_code, qoff)
                self._pend_cq_ts.append(store_ts)
            if self.build_index and tran != TRANSACTION_ROLLBACK_TYPE:
                if uniq is not None:
                    self._pend_keys.append(f"{topic}#{uniq}")
                    self._pend_kphys.append(phys)
                    self._pend_kts.append(store_ts)
                if kp:
                    if " " in kp:
                        ks = [f"{topic}#{k}" for k in kp.split(" ") if k]
                        self._pend_keys += ks
                        self._pend_kphys += [phys] * len(ks)
                        self._pend_kts += [store_ts] * len(ks)
                    else:
                        self._pend_keys.append(f"{topic}#{kp}")
                        self._pend_kphys.append(phys)
                        self._pend_kts.append(store_ts)
        return phys, total, qoff, uniq, store_ts, blank_at, store_host, topic, queue_id

    # --- dispatch --------------------------------------------------------------------------------
    def _take_pending(self) -> tuple:
        pend = (self._pend_cq, self._pend_cq_ts, self._pend_keys, self._pend_kphys, self._pend_kts)
        self._pend_cq, self._pend_cq_ts, self._pend_keys, self._pend_kphys, self._pend_kts = {}, [], [], [], []
        return pend

    def _dispatch_pending(self, pend: tuple | None = None) -> None:
        """CQ and index entries for the records appended since the last dispatch (one write per file)."""
        pend_cq, cq_ts, keys, phys, tss = self._take_pending() if pend is None else pend
        try:
            for key, units in pend_cq.items():
                self._cq_writer(*key).put_many(units)
                self._cq_dirty.add(key)
            if cq_ts:
                self.last_cq_timestamp = cq_ts[-1]
                self.max_cq_timestamp = max(self.max_cq_timestamp, max(cq_ts))
            if keys:
                hashes = index_hashes(keys)
                if self._index is None:
                    self._index = _IndexRoller(self.root, self.index_slots, self.index_entries,
                                               self.index_name_clock, True)
                before = len(self._index.new_files)
                self._index.put(hashes, phys, tss)
                if len(self._index.new_files) > before:
                    self._dirs_to_sync.add(self.root / STORE_INDEX_DIR)
        except StoreError as e:
            raise self._fail(e) from None
        except OSError as e:
            raise self._fail(StoreError(f"dispatch failed: {e.strerror}", self.root)) from None

    # --- durability ----------------------------------------------------------------------------
    def sync(self) -> None:
        """Make every record appended so far durable, then dispatch and make the metadata durable.

        Order: commitlog bytes (all but the batch's first 8) → fsync segments → commitlog
        directory if a segment was created → the held-back 8 bytes → fsync (the commit
        point: recovery now sees the batch) → ConsumeQueue and index writes → fsync of
        those files, concurrently, all finished before going on (full index files were
        fsynced when they filled) → fsync of the directories that gained entries. Any failure is raised and the writer refuses
        further use.
        """
        self._check_usable()
        if self.dry_run:
            return
        self._commit_batch(*self._take_batch())

    def _take_batch(self) -> tuple:
        buf, off = self._buf, self._buf_off
        self._buf = bytearray()
        self._buf_off = off + len(buf)
        return buf, off, self._take_pending(), self.offset

    def _commit_batch(self, buf: bytearray, off: int, pend: tuple, end: int) -> None:
        try:
            self._write_out(buf, off)
            self._sync_segments()
            if self._new_segment:
                fsync_dir(self.root / STORE_COMMITLOG_DIR)
                self._new_segment = False
            if self._head is not None:
                head_off, head = self._head
                self._head = None
                self._pwrite(head, head_off)
                self._sync_segments()
            self._batch_started = False
            self.durable_offset = end
            self._dispatch_pending(pend)
            syncs = [self._cq[key].fsync for key in sorted(self._cq_dirty)]
            if self._index is not None:
                syncs.append(self._index.fsync)
            self._run_all(syncs)
            self._cq_dirty.clear()
            for d in sorted(self._dirs_to_sync, key=lambda p: -len(p.parts)):
                fsync_dir(d)
            self._dirs_to_sync.clear()
        except StoreError as e:
            raise self._fail(e) from None
        except OSError as e:
            raise self._fail(StoreError(f"sync failed: {e.strerror}", self.root)) from None

    def _run_all(self, calls: list) -> None:
        """Run independent fsyncs concurrently (the filesystem can share one journal commit
        among them); returns when all are done, raising the first error in ``calls`` order."""
        if len(calls) <= 1:
            for call in calls:
                call()
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="rmqdump-fsync")
        futures = [self._pool.submit(call) for call in calls]
        for f in futures:
            f.exception()  # wait for every one before raising any error
        for f in futures:
            f.result()

    def _sync_segments(self) -> None:
        for start in sorted(self._dirty_segments):
            if start == self._seg_start and self._seg_fd is not None:
                fsync_fd(self._seg_fd, self._segment_path(start))
            else:
                fsync_path(self._segment_path(start))
        self._dirty_segments.clear()

    def close(self) -> None:
        """Write out buffered records and pending dispatches (no fsync: call :meth:`sync` first)."""
        try:
            if not self.dry_run and not self._failed:
                self._flush_buffer()
                if self._head is not None:
                    off, head = self._head
                    self._head = None
                    self._pwrite(head, off)
                self._batch_started = False
                self._dispatch_pending()
        finally:
            if self._seg_fd is not None:
                os.close(self._seg_fd)
                self._seg_fd = None
            for w in self._cq.values():
                w.close()
            self._cq.clear()
            if self._index is not None:
                self._index.close()
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None

    def abandon(self) -> None:
        """Close every descriptor without writing anything still buffered or pending."""
        self._buf = bytearray()
        self._head = None
        self._pend_cq, self._pend_cq_ts, self._pend_keys, self._pend_kphys, self._pend_kts = {}, [], [], [], []
        self._failed = self._failed or "abandoned"
        self.close()

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and self._failed:
            self.abandon()
        else:
            self.close()


def _read_next_queue_offset(root: Path, topic: str, queue_id: int, cq_file_size: int) -> int:
    """The next QUEUEOFFSET of a queue as the broker would assign it (read-only)."""
    from rmqdump.store.consumequeue import ConsumeQueue

    if not is_safe_component(topic):
        raise StoreError(f"refusing unsafe topic directory name {topic!r}", root / STORE_CONSUMEQUEUE_DIR)
    qdir = root / STORE_CONSUMEQUEUE_DIR / topic / str(queue_id)
    if not qdir.is_dir() or qdir.is_symlink():
        return 0
    return ConsumeQueue(qdir, topic, queue_id, cq_file_size).max_offset
