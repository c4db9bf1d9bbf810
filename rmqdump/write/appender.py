"""Append records to a stopped broker's store, safely (spec §10, §11, §14).

:class:`LockedAppender` wraps :class:`~rmqdump.write.writer.StoreWriter` with what writing to a
broker's store needs: the broker's own lock (held on one descriptor for the whole run),
refusal when a broker is running or evidently starting, refusal of a store that already
has ``abort`` or a dirty tail (unless ``force``), the true end of data as the broker's
recovery finds it, the ``abort`` marker around the writes (so a crash mid-way makes the
broker run its abnormal recovery), and the checkpoint update.

Durability order of one commit: commitlog bytes → fsync → commitlog dir (new segment) →
the batch's held-back first 8 bytes → fsync (commit point) → ConsumeQueue / index writes →
fsync → directories; at the end: checkpoint → fsync → remove ``abort`` → fsync the store root.
A record is acknowledged only after its commit returned.
"""

from __future__ import annotations

import base64
import binascii
import errno
import json
import os
import stat
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import (
    COMPRESSED_FLAG,
    COMPRESSION_TYPE_BY_NAME,
    COMPRESSION_TYPE_COMPARATOR,
    INNER_BATCH_FLAG,
    MAPPED_FILE_SIZE_COMMITLOG,
    MAPPED_FILE_SIZE_CONSUME_QUEUE,
    MAX_HASH_SLOT_NUM,
    MAX_INDEX_NUM,
    MAX_MESSAGE_SIZE,
    MULTI_TAGS_FLAG,
    NEED_UNWRAP_FLAG,
    PROPERTY_CRC32,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    RMQ_SYS_TRANS_HALF_TOPIC,
    STORE_ABORT_FILE,
    STORE_CHECKPOINT_FILE,
    STORE_COMMITLOG_DIR,
    TRANSACTION_BY_NAME,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.codec.msgid import create_offset_msg_id
from rmqdump.disk.paths import is_safe_component
from rmqdump.errors import FormatError, LockError, RmqdumpError, StoreError, UnsupportedError
from rmqdump.write.writer import Appended, MessageSpec, StoreWriter, fsync_dir, fsync_fd

DEFAULT_STORE_HOST = "127.0.0.1:10911"
DEFAULT_BATCH_BYTES = 4 << 20
#: content of the ``abort`` marker rmqdump creates (the broker only checks that the file exists)
ABORT_TAG = b"rmqdump"
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


# --- geometry ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StoreGeometry:
    """File sizes a store uses (the broker refuses files of any other size)."""

    commitlog_file_size: int = MAPPED_FILE_SIZE_COMMITLOG
    cq_file_size: int = MAPPED_FILE_SIZE_CONSUME_QUEUE
    index_slots: int = MAX_HASH_SLOT_NUM
    index_entries: int = MAX_INDEX_NUM


def store_geometry(root: str | os.PathLike, *, commitlog_file_size: int | None = None, cq_file_size: int | None = None,
                   index_slots: int | None = None, index_entries: int | None = None) -> StoreGeometry:
    """The geometry of an existing store, read from its files; explicit values win, defaults fill gaps."""
    from rmqdump.store.commitlog import CommitLog
    from rmqdump.store.consumequeue import infer_store_cq_file_size
    from rmqdump.store.indexfile import infer_geometry, list_index_files

    root = Path(root)
    if commitlog_file_size is None and _has_segments(root):
        commitlog_file_size = CommitLog.open(root / STORE_COMMITLOG_DIR).file_size or None
    if cq_file_size is None:
        cq_file_size = infer_store_cq_file_size(root)
    if index_slots is None or index_entries is None:
        files = [f for f in list_index_files(root) if f.stat().st_size]  # zero-length: a crash artefact
        if files:
            geo = infer_geometry(files[-1].stat().st_size, index_slots, index_entries, files[-1])
            index_slots, index_entries = geo.hash_slot_num, geo.index_num
    d = StoreGeometry()
    return StoreGeometry(commitlog_file_size or d.commitlog_file_size, cq_file_size or d.cq_file_size,
                         index_slots or d.index_slots, index_entries or d.index_entries)


def require_cq_file_size(root: str | os.PathLike) -> None:
    """Refuse to guess the ConsumeQueue file size of an existing store none of whose CQ files tells it:
    a file of another size than the broker's mappedFileSizeConsumeQueue stops the broker from starting."""
    from rmqdump.store.consumequeue import infer_store_cq_file_size

    root = Path(root)
    if _has_segments(root) and infer_store_cq_file_size(root) is None:
        raise StoreError("no ConsumeQueue file of this store tells the broker's ConsumeQueue file size "
                         "(mappedFileSizeConsumeQueue), and a file of the wrong size stops the broker from starting: "
                         "pass --cq-file-size (the broker's default is 6000000)", root)


def _has_segments(root: Path) -> bool:
    from rmqdump.disk.segment import parse_file_name

    d = root / STORE_COMMITLOG_DIR
    try:
        return any(parse_file_name(n) is not None for n in os.listdir(d))
    except FileNotFoundError:
        return False
    except OSError as e:
        raise StoreError(f"cannot list directory: {e.strerror}", d) from None


# --- evidence of a running or starting broker ---------------------------------------------------


@dataclass
class AbortInfo:
    """The ``abort`` file: present, who wrote it, and whether it is newer than the last record."""

    path: Path
    content: bytes
    mtime_ms: int

    @property
    def ours(self) -> bool:
        return self.content.startswith(ABORT_TAG)

    @property
    def pid(self) -> int | None:
        """The PID a 5.x broker writes into ``abort`` (None for 4.x's empty file or ours)."""
        text = self.content.strip()
        return int(text) if text.isdigit() and 0 < len(text) <= 10 else None


def read_abort(root: Path) -> AbortInfo | None:
    path = root / STORE_ABORT_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | _O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StoreError("abort is a symlink; refusing to touch this store", path) from None
        raise StoreError(f"cannot open: {e.strerror}", path) from None
    try:
        st = os.fstat(fd)
        content = os.pread(fd, 256, 0) if stat.S_ISREG(st.st_mode) else b""
    finally:
        os.close(fd)
    return AbortInfo(path, content, st.st_mtime_ns // 1_000_000)


def _proc_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read(300).replace(b"\0", b" ").strip().decode("utf-8", "replace")
    except OSError:
        cmd = ""
    if not cmd:
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                cmd = f.read(64).strip().decode("utf-8", "replace")
        except OSError:
            cmd = "?"
    return cmd[:120]


def processes_using(root: str | os.PathLike) -> list[tuple[int, str, str]]:
    """Other processes with a file of the store open or mapped: (pid, command, one path).

    Reads ``/proc`` (Linux); processes of other users that cannot be inspected are skipped.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    real = os.path.realpath(root)
    prefix = real.rstrip("/") + "/"
    me = os.getpid()
    out = []
    try:
        pids = [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid == me:
            continue
        hit = None
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target == real or target.startswith(prefix):
                    hit = target
                    break
        except OSError:
            pass
        if hit is None:
            try:
                with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                    for line in f:
                        parts = line.split(None, 5)
                        if len(parts) == 6 and parts[5].strip().startswith(prefix):
                            hit = parts[5].strip()
                            break
            except OSError:
                pass
        if hit is not None:
            out.append((pid, _proc_name(pid), hit))
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def broker_evidence(root: Path, abort: AbortInfo | None) -> list[str]:
    """Reasons to believe a broker (or another writer) is running or starting on this store."""
    reasons = []
    for pid, cmd, path in processes_using(root):
        reasons.append(f"process {pid} ({cmd}) has {path} open: a broker may be starting or running")
    if abort is not None and abort.pid is not None and abort.pid != os.getpid() and pid_alive(abort.pid):
        reasons.append(f"abort names process {abort.pid} ({_proc_name(abort.pid)}), which is alive: "
                       "a 5.x broker may be starting")
    return reasons


# --- looking for the true end and a dirty tail --------------------------------------------------


def nonzero_span(path: str | os.PathLike, start: int, end: int) -> tuple[int, int] | None:
    """(first non-zero byte, end of the last non-zero byte) of ``path[start:end]``, or None.

    Skips holes with SEEK_DATA/SEEK_HOLE where the filesystem supports them.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | _O_CLOEXEC)
    except OSError as e:
        raise StoreError(f"cannot open: {e.strerror}", path) from None
    first = last = None
    try:
        pos = start
        while pos < end:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
                hole = os.lseek(fd, data, os.SEEK_HOLE)
            except OSError as e:
                if e.errno == errno.ENXIO:
                    break  # only a hole remains
                data, hole = pos, end
            if data >= end:
                break
            hole = min(hole, end)
            p = data
            while p < hole:
                chunk = os.pread(fd, min(1 << 20, hole - p), p)
                if not chunk:
                    break
                lead = len(chunk) - len(chunk.lstrip(b"\0"))
                if lead < len(chunk):
                    if first is None:
                        first = p + lead
                    last = p + len(chunk.rstrip(b"\0"))
                p += len(chunk)
            pos = max(hole, pos + 1)
    except OSError as e:
        raise StoreError(f"read failed: {e.strerror}", path) from None
    finally:
        os.close(fd)
    return None if first is None else (first, last)


@dataclass
class QueueTail:
    """What the commitlog says about one queue in the walked range."""

    next_queue_offset: int = 0
    last_end: int = -1  # offset + size of its last dispatchable record
    records: int = 0


@dataclass
class StoreState:
    """An existing store as the appender sees it before writing."""

    root: Path
    end: int  # where the next record goes (the broker's recovered end)
    new_store: bool = False
    last_store_timestamp: int = 0
    last_store_host: str | None = None
    abort: AbortInfo | None = None
    dirty: list[str] = field(default_factory=list)  # refusal reasons (override: force)
    overwrite: list[str] = field(default_factory=list)  # old bytes an append would destroy (no override)
    starting: list[str] = field(default_factory=list)  # signs of a broker starting up (no override)
    warnings: list[str] = field(default_factory=list)
    queue_tails: dict[tuple[str, int], QueueTail] = field(default_factory=dict)
    cq_next: dict[tuple[str, int], int] = field(default_factory=dict)
    prediction: object | None = None
    broker_model_reason: str | None = None  # why predict_recovery_auto chose its model
    batch_topics: set[str] = field(default_factory=set)  # 5.x BatchCQ topics (batchconsumequeue/): not appendable


def inspect_store(root: str | os.PathLike, *, use_mmap: bool = True) -> StoreState:
    """Find where the broker's recovery would put the end, and everything that makes the tail dirty."""
    from rmqdump.broker.recovery import MODE_REFUSES, consume_queue_states, predict_recovery_auto
    from rmqdump.codec.record import END_OF_DATA, Message
    from rmqdump.store.consumequeue import batch_cq_topics, check_not_rocksdb, open_batch_queues
    from rmqdump.store.root import Store

    root = Path(root)
    if not root.is_dir():
        raise StoreError("not a directory", root)
    check_not_rocksdb(root)
    if any(n.startswith("dledger-") for n in os.listdir(root)):
        raise UnsupportedError("DLedger commitlog mode: appending is not supported", root)
    abort = read_abort(root)
    if not _has_segments(root):
        st = StoreState(root, 0, new_store=True, abort=abort)
        if abort is not None:
            st.dirty.append("abort file present")
        return st
    store = Store.open(root)
    cl = store.commitlog
    states, cq_problems = consume_queue_states(store)
    pred, model_reason = predict_recovery_auto(store, queue_states=states, use_mmap=use_mmap)
    st = StoreState(root, pred.max_offset, abort=abort, prediction=pred, broker_model_reason=model_reason)
    if abort is not None:
        st.dirty.append("abort file present: the broker did not shut down cleanly"
                        + (" (left by an interrupted rmqdump run)" if abort.ours else ""))
    if pred.mode == MODE_REFUSES:
        st.dirty.append(f"the broker would refuse to start: {pred.load_errors[0]}")
    st.warnings += [p for p in cq_problems if p not in pred.load_errors]
    stop = pred.walk.stop if pred.walk else None
    if stop is not None and stop.kind != END_OF_DATA:
        st.dirty.append(f"recovery stops at offset {stop.offset} ({stop.kind}: {stop.detail})")
    if pred.dropped.count:
        st.dirty.append(f"{pred.dropped.count} records after the end at {pred.max_offset} would be dropped by "
                        "the broker's recovery")
    # bytes after the end: stale or torn data that later records would sit next to
    seg = cl.segment_for(st.end)
    if seg is not None:
        span = nonzero_span(seg.path, st.end - seg.start, seg.size)
        if span is not None:
            st.overwrite.append(f"{span[1] - span[0]} bytes of old data after the end in {seg.name} "
                                f"(from position {span[0]})")
    for s in cl.segments:
        if s.start > st.end and nonzero_span(s.path, 0, s.size) is not None:
            st.overwrite.append(f"segment {s.name} after the end holds data (the broker would delete it)")
    for q in pred.queues:
        st.dirty.append(f"ConsumeQueue {q.queue} has {q.count} entries at or after the end")
    # walk the recovered range for queue offsets and the last record
    walk = cl.walk(start=pred.start_offset, end=st.end, check_crc=False, read_body=False, use_mmap=use_mmap)
    tails: dict[tuple[str, int], QueueTail] = {}
    for rec in walk:
        if not isinstance(rec, Message):
            continue
        st.last_store_timestamp = rec.store_timestamp
        st.last_store_host = rec.store_host
        if rec.sys_flag & TRANSACTION_TYPE_MASK in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            t = tails.setdefault((rec.topic, rec.queue_id), QueueTail())
            t.next_queue_offset = max(t.next_queue_offset, rec.queue_offset + 1)
            t.last_end = rec.offset + rec.size
            t.records += 1
    st.queue_tails = tails
    by_name = {(s.topic, s.queue_id): s for s in states}
    batch_queues = open_batch_queues(root)  # a BatchCQ topic is dispatched there, not into consumequeue/
    st.batch_topics = batch_cq_topics(root)
    for key, t in sorted(tails.items()):
        if not is_safe_component(key[0]):
            continue  # the broker cannot create a consume queue for this topic either
        s = by_name.get(key)
        bq = batch_queues.get(key) if s is None else None
        if bq is not None:
            st.cq_next[key] = bq.max_offset
            cq_end = bq.max_physic_end
        else:
            st.cq_next[key] = s.max_offset if s else 0
            cq_end = s.max_physic_offset if s else -1
        if t.last_end > cq_end:
            st.dirty.append(f"ConsumeQueue {key[0]}/{key[1]} lacks entries for records up to offset {t.last_end} "
                            "(dispatch had not caught up)")
    _check_index(root, st)
    if abort is not None and not abort.ours and st.last_store_timestamp and \
            abort.mtime_ms > st.last_store_timestamp + 1000:
        st.starting.append(f"abort (written {_iso(abort.mtime_ms)}) is newer than the last record (stored "
                           f"{_iso(st.last_store_timestamp)}): a broker started after the last write and may be "
                           "recovering right now (it takes the lock only after its recovery)")
    return st


def _iso(ms: int) -> str:
    from rmqdump.store.checkpoint import ms_to_iso

    return ms_to_iso(ms)


def _check_index(root: Path, st: StoreState) -> None:
    from rmqdump.store.indexfile import IndexFile, list_index_files

    files = list_index_files(root)
    if not files:
        return
    try:
        with IndexFile(files[-1], strict=False) as f:
            h = f.header
    except RmqdumpError as e:
        st.dirty.append(f"last index file unreadable: {e}")
        return
    if h.entry_count > 0 and h.end_phy_offset >= st.end:
        st.dirty.append(f"index file {files[-1].name} references offset {h.end_phy_offset}, at or after the end")


# --- the locked appender -------------------------------------------------------------------------


def _batch_topic_refusal(topic: str) -> str:
    return (f"topic {topic!r} is a BatchCQ topic (batchconsumequeue/{topic}): appending to it is not supported "
            "(rmqdump writes ConsumeQueue entries, the broker reads BatchConsumeQueue units for this topic)")


def refusal_message(st: StoreState) -> str:
    return ("store is not clean: " + "; ".join(st.dirty + st.overwrite)
            + (f" [{'; '.join(st.warnings)}]" if st.warnings else "")
            + f"; run `rmqdump repair {st.root}` first (or --force to append anyway)")


class LockedAppender:
    """Append records to a stopped broker's store under its lock (see the module docstring).

    Use as a context manager; :meth:`append` buffers a record, :meth:`commit` makes every
    record appended so far durable and returns them (the acknowledgements). On a clean
    exit (or a validation error) everything appended is committed, the checkpoint updated
    and ``abort`` removed; after an I/O failure ``abort`` stays so the broker recovers.
    """

    def __init__(self, store: str | os.PathLike, *, force: bool = False, dry_run: bool = False,
                 create: bool = False, geometry: StoreGeometry | None = None, store_host: str | None = None,
                 clock: Callable[[], int] | None = None, lock_timeout: float | None = None,
                 max_message_size: int = MAX_MESSAGE_SIZE, use_mmap: bool = True, build_index: bool = True,
                 broker_version: str = "auto"):
        from rmqdump.broker.version import normalise

        self.root = Path(store)
        self.broker_version = normalise(broker_version)  # auto | 4.9 | 5: who must be able to read the store
        self.broker = None  # brokerversion.BrokerVersion, resolved by open()
        self.force = force
        self.dry_run = dry_run
        self.create = create
        self.geometry = geometry
        self.store_host = store_host
        self.clock = clock
        self.lock_timeout = lock_timeout
        self.max_message_size = max_message_size
        self.use_mmap = use_mmap
        self.build_index = build_index
        self.state: StoreState | None = None
        self.writer: StoreWriter | None = None
        self._lock = None
        self._abort_created = False
        self._unacked: list[Appended] = []
        self._placed = 0  # records placed since the last commit (append() and place())
        self._bytes_since_commit = 0
        self.acknowledged = 0
        self._tx_map: dict[int, int] = {}  # half message: source offset -> offset in this store
        self._batch_topics: set[str] = set()

    # -- lifecycle --------------------------------------------------------------------------------
    def open(self) -> LockedAppender:
        from rmqdump.broker.lock import DEFAULT_LOCK_TIMEOUT_S, StoreLock, probe_lock

        root = self.root
        if not root.exists():
            if not self.create:
                raise StoreError("no such store (use --init to create one)", root)
            if not self.dry_run:
                try:
                    root.mkdir(parents=True)
                except OSError as e:
                    raise StoreError(f"cannot create store directory: {e.strerror}", root) from None
        if self.dry_run:
            pid = probe_lock(root) if root.exists() else None
            if pid is not None:
                raise LockError(f"store is locked by process {pid} (a running broker?)", root / "lock", pid=pid)
        else:
            self._lock = StoreLock(root, timeout=self.lock_timeout or DEFAULT_LOCK_TIMEOUT_S).acquire()
        try:
            self._prepare()
        except BaseException:
            self._release()
            raise
        return self

    def _prepare(self) -> None:
        root = self.root
        st = inspect_store(root, use_mmap=self.use_mmap) if root.exists() else StoreState(root, 0, new_store=True)
        self.state = st
        self._batch_topics = st.batch_topics
        evidence = broker_evidence(root, st.abort) if root.exists() else []
        if evidence:
            raise LockError("refusing to write: " + "; ".join(evidence), root)
        if (st.dirty or st.overwrite) and not self.force:
            raise StoreError(refusal_message(st), root)
        if st.overwrite:  # never destroy bytes nobody can put back, not even with --force
            raise StoreError("appending would overwrite old data: " + "; ".join(st.overwrite)
                             + f"; run `rmqdump repair {root}` first (it keeps a backup of what it changes)", root)
        if st.starting:
            raise LockError("refusing to write: " + "; ".join(st.starting) + "; make sure no broker uses this store, "
                            f"then run `rmqdump repair {root}`", root)
        if st.new_store and not self.create and not (root / STORE_COMMITLOG_DIR).is_dir():
            raise StoreError("not a RocketMQ store (no commitlog/); use --init to create one", root)
        from rmqdump.broker.version import resolve

        pred = st.prediction
        self.broker = resolve(self.broker_version, model_version=getattr(pred, "version", None),
                              model_reason=st.broker_model_reason, root=root if root.exists() else None)
        if self.geometry is None and not st.new_store:
            require_cq_file_size(root)
        geo = self.geometry or store_geometry(root)
        self.geometry = geo
        host = self.store_host or st.last_store_host or DEFAULT_STORE_HOST
        queue_offsets = {}
        for key, t in st.queue_tails.items():  # never reuse a queue offset the commitlog already holds
            if t.next_queue_offset > st.cq_next.get(key, 0):
                queue_offsets[key] = t.next_queue_offset
        self.writer = StoreWriter(
            root, commitlog_file_size=geo.commitlog_file_size, cq_file_size=geo.cq_file_size,
            index_slots=geo.index_slots, index_entries=geo.index_entries, start_offset=st.end,
            queue_offsets=queue_offsets, store_host=host, clock=self.clock, build_index=self.build_index,
            dry_run=self.dry_run)

    def _create_abort(self) -> None:
        """The broker's marker: present while the store may be inconsistent."""
        if self.dry_run or self._abort_created or (self.state and self.state.abort is not None):
            return
        path = self.root / STORE_ABORT_FILE
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_CLOEXEC, 0o644)
        except FileExistsError:
            raise StoreError("abort appeared while we held the lock; refusing to continue", path) from None
        except OSError as e:
            raise StoreError(f"cannot create abort marker: {e.strerror}", path) from None
        try:
            os.write(fd, ABORT_TAG + f" append pid={os.getpid()}\n".encode())
            fsync_fd(fd, path)
        finally:
            os.close(fd)
        fsync_dir(self.root)
        self._abort_created = True

    def _remove_abort(self) -> None:
        if not self._abort_created:
            return
        path = self.root / STORE_ABORT_FILE
        try:
            os.unlink(path)
        except OSError as e:
            raise StoreError(f"cannot remove abort marker: {e.strerror}", path) from None
        fsync_dir(self.root)
        self._abort_created = False

    def _write_checkpoint(self) -> None:
        from rmqdump.store.checkpoint import Checkpoint, read_checkpoint, write_checkpoint

        w = self.writer
        if w is None or self.dry_run or w.max_store_timestamp == 0:
            return
        path = self.root / STORE_CHECKPOINT_FILE
        try:
            old = read_checkpoint(path)
        except StoreError:
            if path.exists() or path.is_symlink():
                raise
            old = Checkpoint()
        except FormatError:  # shorter than its fields (a kill while it was first written): the broker reads zeros
            old = Checkpoint()
        new = Checkpoint(max(old.physic_msg_timestamp, w.max_store_timestamp),
                         max(old.logics_msg_timestamp, w.max_cq_timestamp),
                         max(old.index_msg_timestamp, w.index_msg_timestamp),
                         old.master_flushed_offset, old.confirm_phy_offset)
        if new.fields() != old.fields() or not path.exists():
            write_checkpoint(path, new, fsync=True)

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def close(self) -> list[Appended]:
        """Commit, update the checkpoint, remove our ``abort``, release the lock."""
        acked: list[Appended] = []
        try:
            if self.writer is not None:
                acked = self.commit()
                self._write_checkpoint()
                self.writer.close()
                self.writer = None
                self._remove_abort()
        finally:
            self._release()
        return acked

    def fail(self) -> None:
        """Give up after an I/O failure: nothing more is written; ``abort`` stays for the broker."""
        try:
            if self.writer is not None:
                self.writer.abandon()
                self.writer = None
        finally:
            self._release()

    def __enter__(self) -> LockedAppender:
        return self.open() if self.state is None else self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None or (self.writer is not None and not self.writer._failed
                                and not isinstance(exc, StoreError)):
            try:
                self.close()
            except BaseException:
                self.fail()
                if exc_type is None:
                    raise
        else:
            self.fail()

    # -- records ------------------------------------------------------------------------------
    def append(self, spec: MessageSpec) -> Appended:
        """Place one record (not durable until :meth:`commit`)."""
        phys, size, qoff, uniq, store_ts, blank_at, host, topic, queue_id = self.place(spec)
        a = Appended(phys, size, qoff, create_offset_msg_id(host[0], host[1], phys), uniq, topic, queue_id,
                     store_ts, blank_at)
        self._unacked.append(a)
        return a

    def place(self, spec: MessageSpec) -> tuple:
        """:meth:`append` without an :class:`Appended` (the caller keeps the acknowledgement):
        returns :meth:`StoreWriter.place`'s tuple. :meth:`commit` makes it durable."""
        w = self.writer
        if w is None:
            raise StoreError("appender is not open", self.root)
        if len(spec.body) > self.max_message_size:
            raise FormatError(f"body of {len(spec.body)} bytes exceeds maxMessageSize {self.max_message_size}")
        if self.store_host and spec.store_host is None:
            spec.store_host = self.store_host
        if spec.transaction & TRANSACTION_TYPE_MASK in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE) and \
                spec.prepared_transaction_offset in self._tx_map:
            # a copied COMMIT/ROLLBACK points at its half message: follow the half message to its new offset
            spec.prepared_transaction_offset = self._tx_map[spec.prepared_transaction_offset]
        if self._batch_topics and spec.topic in self._batch_topics:
            raise UnsupportedError(_batch_topic_refusal(spec.topic))
        if not self.broker.reads_v2:
            self.check_spec(spec)
        if not self._abort_created:
            self._create_abort()
        row = w.place(spec)
        if spec.source_offset is not None and spec.topic == RMQ_SYS_TRANS_HALF_TOPIC:
            self._tx_map[spec.source_offset] = row[0]
        self._placed += 1
        self._bytes_since_commit += row[1]
        return row

    def place_batch(self, records: Iterator, limit_bytes: int, rows: list[tuple],
                    convert: Callable[[object], MessageSpec] | None = None) -> bool:
        """:meth:`place` records from the iterator ``records`` into ``rows`` until ``limit_bytes``
        are pending (``convert`` turns anything that is not a :class:`MessageSpec` into one).

        The bulk loop: the same checks as :meth:`place`, names bound once. Returns False
        when ``records`` is exhausted.
        """
        w = self.writer
        if w is None:
            raise StoreError("appender is not open", self.root)
        place = w.place
        max_size = self.max_message_size
        store_host = self.store_host
        tx_map = self._tx_map
        batch_topics = self._batch_topics
        add = rows.append
        pending = self._bytes_since_commit
        check = None if self.broker.reads_v2 else self.check_spec
        n = 0
        try:
            for spec in records:
                if convert is not None and not isinstance(spec, MessageSpec):
                    spec = convert(spec)
                if len(spec.body) > max_size:
                    raise FormatError(f"body of {len(spec.body)} bytes exceeds maxMessageSize {max_size}")
                if store_host and spec.store_host is None:
                    spec.store_host = store_host
                if tx_map and spec.transaction & TRANSACTION_TYPE_MASK in (TRANSACTION_COMMIT_TYPE,
                                                                          TRANSACTION_ROLLBACK_TYPE) \
                        and spec.prepared_transaction_offset in tx_map:
                    spec.prepared_transaction_offset = tx_map[spec.prepared_transaction_offset]
                if batch_topics and spec.topic in batch_topics:
                    raise UnsupportedError(_batch_topic_refusal(spec.topic))
                if check is not None:
                    check(spec)
                if not self._abort_created:
                    self._create_abort()
                row = place(spec)
                if spec.source_offset is not None and spec.topic == RMQ_SYS_TRANS_HALF_TOPIC:
                    tx_map[spec.source_offset] = row[0]
                add(row)
                n += 1
                pending += row[1]
                if pending >= limit_bytes:
                    return True
            return False
        finally:
            self._placed += n
            self._bytes_since_commit = pending

    # -- what the store's broker can read --------------------------------------------------------------
    def check_topic(self, topic: str, where: str = "") -> None:
        """Raise :class:`~rmqdump.broker.version.BrokerVersionError` if a record of ``topic`` would get the
        V2 magic and the store's broker is 4.x (``where`` prefixes the message, e.g. a JSONL line)."""
        from rmqdump.broker.version import refuse_v2
        from rmqdump.codec.layout import MESSAGE_MAGIC_CODE_V2
        from rmqdump.write.writer import _choose_magic

        if self.broker is None:
            raise StoreError("appender is not open", self.root)
        if not self.broker.reads_v2 and _choose_magic(topic) == MESSAGE_MAGIC_CODE_V2:
            raise refuse_v2(topic, self.broker, where)

    def check_spec(self, spec: MessageSpec, where: str = "") -> None:
        """:meth:`check_topic` for one record (an explicit ``spec.magic`` counts too)."""
        from rmqdump.broker.version import refuse_v2
        from rmqdump.codec.layout import MESSAGE_MAGIC_CODE_V2

        if spec.magic == MESSAGE_MAGIC_CODE_V2 and not self.broker.reads_v2:
            raise refuse_v2(spec.topic, self.broker, where)
        if spec.magic is None:
            self.check_topic(spec.topic, where)

    def check_rows(self, rows: Iterable[MessageSpec | dict]) -> None:
        """Check every record before anything is written: MessageSpecs, and the topic of scan-JSONL
        dicts (a dict without a string topic is left for the conversion to refuse, in order)."""
        if self.broker is None or self.broker.reads_v2:
            return
        for n, row in enumerate(rows):
            if isinstance(row, MessageSpec):
                self.check_spec(row, f"record {n}: ")
            elif isinstance(row, dict) and isinstance(row.get("topic"), str):
                self.check_topic(row["topic"], f"record {n}: ")

    @property
    def pending_bytes(self) -> int:
        return self._bytes_since_commit

    def commit(self) -> list[Appended]:
        """Make everything appended durable; returns those records (now acknowledged)."""
        if self.writer is None:
            return []
        self.writer.sync()
        acked, self._unacked = self._unacked, []
        self._bytes_since_commit = 0
        self.acknowledged += self._placed
        self._placed = 0
        return acked


# --- JSONL (scan schema) -> MessageSpec ----------------------------------------------------------


def decode_body(value, encoding: str) -> bytes:
    """A JSONL body field in ``base64`` (scan's default), ``text`` or ``hex``."""
    if value is None:
        raise FormatError("record has no body (scan with --body base64 to copy bodies)")
    if not isinstance(value, str):
        raise FormatError(f"body must be a string, not {type(value).__name__}")
    try:
        if encoding == "base64":
            return base64.b64decode(value, validate=True)
        if encoding == "hex":
            return bytes.fromhex(value)
        if encoding == "text":
            return value.encode("utf-8")
    except (binascii.Error, ValueError) as e:
        raise FormatError(f"body is not valid {encoding}: {e}") from None
    raise FormatError(f"unknown body encoding {encoding!r}")


def _looks_compressed(body: bytes, kind: int) -> bool:
    try:
        if kind in (0, 3):
            zlib.decompress(body)
        elif kind == 1:
            import lz4.frame

            lz4.frame.decompress(body)
        elif kind == 2:
            import zstandard

            zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 30)
        else:
            return False
    except Exception:  # any codec error: not a compressed stream of this kind
        return False
    return True


def _int(row: dict, name: str, default: int = 0) -> int:
    v = row.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise FormatError(f"{name} must be an integer")
    return v


def record_to_spec(row: dict, *, body_encoding: str = "base64", keep_store_time: bool = False,
                   keep_store_host: bool = False, topic: str | None = None, queue_id: int | None = None
                   ) -> MessageSpec:
    """One record in the scan JSONL schema as a :class:`MessageSpec`.

    Kept: topic, queue_id, flag, properties (exactly; KEYS/TAGS/UNIQ_KEY inside them win
    over the top-level keys/tags/uniq_key fields), body (as stored, with its compression
    bits; a body that was decompressed by ``scan --decompress`` is compressed again),
    transaction type, born host/timestamp, reconsume times, prepared-transaction offset.
    New: QUEUEOFFSET, PHYSICALOFFSET, store timestamp (unless ``keep_store_time``), store
    host (the target store's unless ``keep_store_host``), body CRC and a 5.2+ ``__CRC32#``
    property if the record had one. A record with no ``properties`` field gets a generated
    UNIQ_KEY like a client would.
    """
    if not isinstance(row, dict):
        raise FormatError("a JSONL record must be an object")
    t = topic if topic is not None else row.get("topic")
    if not isinstance(t, str) or not t:
        raise FormatError("record has no topic")
    body = decode_body(row.get("body"), body_encoding)
    props_in = row.get("properties")
    props: dict[str, str] = {}
    if props_in is not None:
        if not isinstance(props_in, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in props_in.items()):
            raise FormatError("properties must be an object of strings")
        props = dict(props_in)
    record_crc = props.pop(PROPERTY_CRC32, None) is not None
    keys = row.get("keys")
    if keys and PROPERTY_KEYS not in props:
        if isinstance(keys, list) and all(isinstance(k, str) for k in keys):
            props[PROPERTY_KEYS] = " ".join(keys)
        elif isinstance(keys, str):
            props[PROPERTY_KEYS] = keys
        else:
            raise FormatError("keys must be a string or a list of strings")
    tags = row.get("tags")
    if tags and PROPERTY_TAGS not in props:
        if not isinstance(tags, str):
            raise FormatError("tags must be a string")
        props[PROPERTY_TAGS] = tags
    uniq = row.get("uniq_key")
    if uniq and PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX not in props:
        if not isinstance(uniq, str):
            raise FormatError("uniq_key must be a string")
        props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
    tran_name = row.get("transaction") or "none"
    if tran_name not in TRANSACTION_BY_NAME:
        raise FormatError(f"unknown transaction type {tran_name!r}")
    sys_flag = _int(row, "sys_flag", -1)
    compression = row.get("compression") or "none"
    if sys_flag >= 0:
        if sys_flag & (INNER_BATCH_FLAG | NEED_UNWRAP_FLAG):
            raise UnsupportedError("inner-batch records (BatchConsumeQueue topics) cannot be appended")
        comp_flags = sys_flag & (COMPRESSED_FLAG | COMPRESSION_TYPE_COMPARATOR)
        extra = sys_flag & MULTI_TAGS_FLAG
    else:
        if compression not in ("none", *COMPRESSION_TYPE_BY_NAME):
            raise FormatError(f"unknown compression {compression!r}")
        comp_flags = 0 if compression == "none" else COMPRESSED_FLAG | COMPRESSION_TYPE_BY_NAME[compression]
        extra = 0
    spec = MessageSpec(
        topic=t, body=body, queue_id=queue_id if queue_id is not None else _int(row, "queue_id"),
        properties=props, flag=_int(row, "flag"), transaction=TRANSACTION_BY_NAME[tran_name],
        born_timestamp=row.get("born_timestamp") if isinstance(row.get("born_timestamp"), int) else None,
        reconsume_times=_int(row, "reconsume_times"),
        prepared_transaction_offset=_int(row, "prepared_transaction_offset"),
        auto_uniq_key=props_in is None, record_crc=record_crc, extra_sys_flag=extra,
        source_offset=row.get("offset") if isinstance(row.get("offset"), int) else None,
    )
    if isinstance(row.get("born_host"), str):
        spec.born_host = row["born_host"]
    if keep_store_time and isinstance(row.get("store_timestamp"), int):
        spec.store_timestamp = row["store_timestamp"]
    if keep_store_host and isinstance(row.get("store_host"), str):
        spec.store_host = row["store_host"]
    if comp_flags:
        kind = (comp_flags & COMPRESSION_TYPE_COMPARATOR) >> 8
        if _looks_compressed(body, kind):
            spec.compressed_flags = comp_flags
        else:  # the body was printed decompressed: compress it again with the record's codec
            spec.compression = {0: "legacy-zlib", 1: "lz4", 2: "zstd", 3: "zlib"}.get(kind)
            if spec.compression is None:
                raise FormatError(f"unknown compression type {kind}")
    return spec


def read_jsonl(lines: Iterable[str | bytes], **kwargs) -> Iterator[MessageSpec]:
    """MessageSpecs from JSONL lines (blank lines skipped); errors name the line number."""
    for n, line in enumerate(lines, 1):
        if isinstance(line, bytes):
            line = line.decode("utf-8")
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            yield record_to_spec(row, **kwargs)
        except json.JSONDecodeError as e:
            raise FormatError(f"JSONL line {n}: {e.msg}") from None
        except RmqdumpError as e:
            raise type(e)(f"JSONL line {n}: {e.message}", e.file, e.offset) from None


# --- bulk ------------------------------------------------------------------------------------------


@dataclass
class BulkResult:
    """What :func:`bulk_append` did."""

    records: int = 0
    bytes: int = 0
    first_offset: int | None = None
    end_offset: int = 0
    commits: int = 0
    seconds: float = 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def bulk_append(store: str | os.PathLike, records: Iterable[MessageSpec | dict], batch_bytes: int = DEFAULT_BATCH_BYTES,
                *, on_ack: Callable[[Appended], None] | None = None, body_encoding: str = "base64",
                keep_store_time: bool = False, **appender_kwargs) -> BulkResult:
    """Append many records under one lock, committing (fsync) every ``batch_bytes`` bytes.

    ``records`` are :class:`MessageSpec` objects or dicts in the scan JSONL schema.
    ``on_ack`` is called for each record once it is durable. Keyword arguments go to
    :class:`LockedAppender` (``force``, ``geometry``, ``clock``, ``broker_version`` ...); a missing store is
    created (``create=True`` by default here, with ``geometry`` or the broker defaults). When the store's
    broker is 4.x, every record is checked before anything is written (an iterator is read fully first):
    one it cannot read (V2 magic) refuses the whole call.
    """
    appender_kwargs.setdefault("create", True)
    res = BulkResult()
    t0 = time.perf_counter()
    rows: list[tuple] = []  # placed, not yet reported (in commitlog order)
    app = LockedAppender(store, **appender_kwargs)
    callback_failed = False

    def report() -> None:
        """Report the records the appender has acknowledged (made durable) since the last call."""
        nonlocal callback_failed
        n = app.acknowledged - res.records
        if n <= 0:
            return
        acked = rows[:n]
        del rows[:n]
        if res.first_offset is None:
            res.first_offset = acked[0][0]
        res.end_offset = acked[-1][0] + acked[-1][1]
        res.records += n
        res.bytes += sum(row[1] for row in acked)
        if on_ack is not None:
            callback_failed = True
            for phys, size, qoff, uniq, store_ts, blank_at, host, topic, queue_id in acked:
                on_ack(Appended(phys, size, qoff, create_offset_msg_id(host[0], host[1], phys), uniq, topic,
                                queue_id, store_ts, blank_at))
            callback_failed = False

    try:
        with app:
            if not app.broker.reads_v2:  # refuse what the store's 4.x broker cannot read before writing anything
                if not isinstance(records, (list, tuple)):
                    records = list(records)
                app.check_rows(records)
            it = iter(records)

            def convert(row: object) -> MessageSpec:
                return record_to_spec(row, body_encoding=body_encoding, keep_store_time=keep_store_time)

            while app.place_batch(it, batch_bytes, rows, convert):
                app.commit()
                res.commits += 1
                report()
            app.close()
            res.commits += 1
    finally:
        if not callback_failed:
            report()  # also after an error: what the appender made durable is acknowledged
    res.seconds = time.perf_counter() - t0
    return res


__all__ = [
    "AbortInfo", "BulkResult", "LockedAppender", "StoreGeometry", "StoreState", "bulk_append", "broker_evidence",
    "decode_body", "inspect_store", "nonzero_span", "processes_using", "read_jsonl", "record_to_spec",
    "store_geometry",
]
