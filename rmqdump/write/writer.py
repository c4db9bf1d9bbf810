"""Write records into a store the way the broker does: encode, roll segments, dispatch CQ and index.

:class:`StoreWriter` is the dispatching writer under fixtures, tests and the locked appender
(the appender adds the lock, the abort marker and recovery of the true end). It assigns
QUEUEOFFSET per topic-queue (PREPARED/ROLLBACK get 0), PHYSICALOFFSET, the store time,
body CRC, the end-of-file blank and new segments of the store's file size, ConsumeQueue
entries (NOT/COMMIT only) and index entries (all but ROLLBACK), as §14 describes.

This module builds and places records (:meth:`StoreWriter.place`, the bulk encoder, and
:meth:`StoreWriter.encode`); the files they go to and their durability are
:class:`~rmqdump.write.storefiles.StoreFiles`, the writer's base class. The records' values
are in :mod:`rmqdump.write.message`, directory helpers in :mod:`rmqdump.write.storedir`.

Durability (:meth:`StoreWriter.sync`): records are buffered and written with ``pwrite``;
the first 8 bytes of a batch (TOTALSIZE + MAGIC of its first record or blank) are held
back until the rest of the batch is on disk, so a batch cut short by a crash is invisible
to recovery (it ends at zeros). ConsumeQueue and index entries are written only after the
commitlog bytes they point to are durable, so metadata never references lost data.
"""

from __future__ import annotations

import functools
import itertools
import os
import secrets
import time
import zlib
from pathlib import Path

from rmqdump.codec.encoder import choose_magic, encode_blank, encode_fields, with_record_crc
from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS, dispatch_tags_code, java_string_hash
from rmqdump.codec.javahash import index_key_hash as index_hash  # noqa: F401 - the writer's name
from rmqdump.codec.javahash import index_key_hashes as index_hashes  # noqa: F401 - the writer's name
from rmqdump.codec.layout import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    COMPRESSION_TYPE_COMPARATOR,
    CRC_MASK,
    END_FILE_MIN_BLANK_LENGTH,
    HOST_V4_LENGTH,
    INNER_BATCH_FLAG,
    INT16,
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
    RECORD_FIXED_V4V4,
    SCHEDULE_TOPIC,
    STORE_COMMITLOG_DIR,
    STORE_CONSUMEQUEUE_DIR,
    STORE_INDEX_DIR,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
    UINT8,
    UNIQ_ID_TAIL,
)
from rmqdump.codec.msgid import create_offset_msg_id, parse_host
from rmqdump.codec.properties import parse_properties
from rmqdump.errors import FormatError, StoreError
from rmqdump.write.message import (
    Appended,
    MessageSpec,
    _month_start_ms,
    compress_body,
    make_uniq_key,
)
from rmqdump.write.storedir import _read_next_queue_offset, ensure_store_dir
from rmqdump.write.storefiles import WRITE_CHUNK, StoreFiles, _IndexRoller

_counter = itertools.count()
#: sysflag bits a caller may pass through (compression bits come from ``compressed_flags``)
_PASS_THROUGH_FLAGS = MULTI_TAGS_FLAG

#: TOTALSIZE minus body, topic (with its length field) and properties for IPv4 hosts
_V4_OVERHEAD = MESSAGE_FIXED_OVERHEAD + 2 * HOST_V4_LENGTH
_choose_magic = functools.lru_cache(maxsize=4096)(choose_magic)
_FORKS = [0]  # bumped in a forked child: writers read their pid again
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: _FORKS.__setitem__(0, _FORKS[0] + 1))


@functools.lru_cache(maxsize=1024)
def _host(text: str) -> tuple[bytes, int]:
    return parse_host(text)


class StoreWriter(StoreFiles):
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

    # --- records -----------------------------------------------------------------------------
    def next_queue_offset(self, topic: str, queue_id: int) -> int:
        key = (topic, queue_id)
        if key not in self.queue_offsets:
            if self.dry_run:
                self.queue_offsets[key] = _read_next_queue_offset(self.root, topic, queue_id, self.cq_file_size)
            else:
                self.queue_offsets[key] = self._cq_writer(topic, queue_id).next_queue_offset
        return self.queue_offsets[key]


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
            prefix = (addr + UNIQ_ID_TAIL.pack(self._pid & 0xFFFF, self._classloader, 0, 0)[:6]).hex().upper()
            self._uniq_prefix[born_host] = prefix
        day = born_ts // 86_400_000
        if day != self._uniq_day:
            self._uniq_day, self._uniq_month_start = day, _month_start_ms(day)
        return f"{prefix}{(born_ts - self._uniq_month_start) & 0xFFFFFFFF:08X}{next(self._uniq_counter) & 0xFFFF:04X}"

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
                            else UINT8.pack(len(tb) & 0xFF)) + tb)
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
                buf += RECORD_FIXED_V4V4.pack(total, magic, zlib.crc32(body) & CRC_MASK, queue_id, spec.flag, qoff, phys,
                                     tran, born_ts, born_host[0], born_host[1], store_ts, store_host[0], store_host[1],
                                     spec.reconsume_times, spec.prepared_transaction_offset, blen)
                buf += body
                buf += tpart
                buf += INT16.pack(len(props_raw))
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

    def __enter__(self) -> StoreWriter:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is not None and self._failed:
            self.abandon()
        else:
            self.close()
