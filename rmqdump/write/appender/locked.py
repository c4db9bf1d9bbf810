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

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from rmqdump.codec.layout import (
    MAX_MESSAGE_SIZE,
    RMQ_SYS_TRANS_HALF_TOPIC,
    STORE_ABORT_FILE,
    STORE_CHECKPOINT_FILE,
    STORE_COMMITLOG_DIR,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.codec.msgid import create_offset_msg_id
from rmqdump.disk.durable import fsync_dir, fsync_fd, open_write
from rmqdump.errors import FormatError, LockError, StoreError, UnsupportedError
from rmqdump.write.appender.geometry import StoreGeometry, require_cq_file_size, store_geometry
from rmqdump.write.appender.liveness import ABORT_TAG, broker_evidence
from rmqdump.write.appender.state import StoreState, inspect_store
from rmqdump.write.message import Appended, MessageSpec
from rmqdump.write.writer import StoreWriter

DEFAULT_STORE_HOST = "127.0.0.1:10911"


def _refuse_multipath(root: Path) -> None:
    """A multi-path commitlog (``storePathCommitLog="a,b"``): the broker places each new file by its own rule
    (``MultiPathMappedFileQueue``: writable, not-full folders sorted, file index modulo their count), which
    depends on disk fullness rmqdump cannot see; so refuse rather than guess."""
    from rmqdump.store.inventory import other_commitlog_folders

    others = other_commitlog_folders(root) if Path(root).is_dir() else []
    if others:
        raise UnsupportedError("refusing to append: multi-path commitlog (storePathCommitLog has several folders; "
                               f"also {', '.join(str(o) for o in others)}); the broker's file placement depends on "
                               "which disks are full, so rmqdump does not write such a store", root)


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
        from rmqdump.broker.lock import DEFAULT_LOCK_TIMEOUT_S, StoreLock, describe_holder, probe_lock
        from rmqdump.store.dledger.files import refuse_dledger

        root = self.root
        refuse_dledger(root, "append")
        _refuse_multipath(root)
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
                raise LockError(f"store is locked by {describe_holder(pid)} (a running broker?)", root / "lock",
                                pid=pid)
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
            fd = open_write(path, create=True, exclusive=True)
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
