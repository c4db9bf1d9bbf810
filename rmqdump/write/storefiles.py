"""The files under a :class:`~rmqdump.write.writer.StoreWriter`: commitlog segments, ConsumeQueue and index
dispatch, and the order that makes them durable.

:class:`StoreFiles` is the writer's base class (the state it uses is set up by ``StoreWriter.__init__``):
records are buffered and written with ``pwrite``, the batch's first 8 bytes held back until the rest is on
disk (:meth:`StoreFiles.sync`); ConsumeQueue units and index entries (:class:`_IndexRoller`, the writer's
``IndexService``) are written only once the commitlog bytes they point to are durable.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rmqdump.codec.javahash import index_key_hashes as index_hashes
from rmqdump.codec.layout import (
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    STORE_COMMITLOG_DIR,
    STORE_CONSUMEQUEUE_DIR,
    STORE_INDEX_DIR,
)
from rmqdump.disk.durable import fsync_dir, fsync_fd, fsync_path, open_write
from rmqdump.disk.segment import offset_to_file_name
from rmqdump.errors import StoreError
from rmqdump.write.storedir import _allocate_zeros, ensure_store_dir

#: records are written in chunks of at most this many buffered bytes
WRITE_CHUNK = 8 << 20


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


class StoreFiles:
    """Commitlog segments, ConsumeQueue and index writers, and :meth:`sync` of a :class:`StoreWriter`."""

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
        try:
            fd = open_write(path, read=True, create=True, exclusive=True)
            try:
                os.ftruncate(fd, self.file_size)
            except OSError:
                os.close(fd)
                raise
            self._new_segment = True
        except FileExistsError:
            try:
                fd = open_write(path, read=True)
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
