"""Repair a damaged store before the broker's recovery throws data away (spec §8.1, §9, §10, §11).

:func:`plan_repair` reads the store (nothing is written) and says what to change so the
store ends where the broker's own recovery would end it (:mod:`rmqdump.broker.recovery`), with
the same consume queues and a consistent index — minus the losses the broker would cause:
intact records after damage in the middle can be kept (``salvage="filler"``: a damaged record
a ConsumeQueue entry points at becomes a tombstone of its own topic, queue and queue offset; other
damaged bytes become ROLLBACK filler records or an end-of-file BLANK), index entries are rebuilt
from the commitlog instead of deleting the index file, and records the dispatch had not
caught up with get their ConsumeQueue and index entries.

Every change is a per-file final state (:class:`Change`: ``write`` byte ranges,
``create`` a file, ``delete`` a file); changes never overlap. :func:`apply_plan` copies
every byte range and file it will change into a backup directory with a manifest (sha256
before/after) *before* changing anything, holds the broker's lock and the ``abort``
marker while writing, and fsyncs data, then metadata, then directories.
:func:`undo_backup` restores the store byte for byte and verifies the sha256s.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import stat
import struct
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.broker.systopics import LMQ_PREFIX, multi_dispatch_targets
from rmqdump.codec.encoder import FILLER_BODY_PREFIX, FILLER_TOPIC
from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS, dispatch_tags_code
from rmqdump.codec.layout import (
    CHECKPOINT,
    CQ_STORE_UNIT_SIZE,
    CQ_UNIT,
    END_FILE_MIN_BLANK_LENGTH,
    INDEX_ENTRY,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    INNER_BATCH_FLAG,
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_INNER_MULTI_QUEUE_OFFSET,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    STORE_ABORT_FILE,
    STORE_CHECKPOINT_FILE,
    STORE_COMMITLOG_DIR,
    STORE_CONSUMEQUEUE_DIR,
    STORE_INDEX_DIR,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.disk.paths import is_safe_component
from rmqdump.errors import FormatError, LockError, RmqdumpError, StoreError
from rmqdump.store.consumequeue import batch_cq_topics, open_batch_queues
from rmqdump.write.writer import ensure_store_dir, fsync_dir, fsync_fd

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "rmqdump-repair-backup/1"
SALVAGE_CHOICES = ("truncate", "filler", "recrc")
#: smallest record (V1, IPv4 hosts, empty topic/body/properties): the smallest filler
MIN_FILLER = 91
_CHUNK = 1 << 20
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

# --- the change model ------------------------------------------------------------------------------------


@dataclass
class Change:
    """One file's change. ``write``: bytes at ``offset`` (``data``, or ``length`` zeros when
    ``data`` is None); ``create``: a new file of ``size`` bytes with ``pieces`` (or the
    non-zero extents of the staged file ``source``); ``delete``: remove the file."""

    op: str
    path: str  # relative to the store root
    offset: int = 0
    length: int = 0
    data: bytes | None = None
    size: int = 0
    pieces: list[tuple[int, bytes]] = field(default_factory=list)
    source: Path | None = None
    group: str = ""
    why: str = ""

    def to_dict(self) -> dict:
        d = {"op": self.op, "path": self.path, "group": self.group, "why": self.why}
        if self.op == "write":
            d.update(offset=self.offset, length=self.length, zero=self.data is None)
        elif self.op == "create":
            d.update(size=self.size)
        return d


@dataclass
class RepairPlan:
    """What :func:`apply_plan` would do, and why (``to_dict`` is the stable JSON form)."""

    store: Path
    mode: str = ""
    reason: str = ""
    broker_end: int | None = None  # where the broker's recovery would end the commitlog
    end: int | None = None  # where the repaired commitlog ends
    records_kept: int = 0
    records_lost: int = 0  # intact records the plan discards
    broker_would_lose: int = 0  # intact records the broker's recovery would discard
    salvage_needed: bool = False
    salvage: str | None = None
    choices: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)  # human-level actions
    changes: list[Change] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    blocked: str | None = None  # why nothing can be applied
    abort_present: bool = False
    stage_dir: Path | None = None
    prediction: object | None = None

    @property
    def needs_repair(self) -> bool:
        return bool(self.changes) or self.abort_present

    def step(self, group: str, action: str, **info) -> None:
        self.steps.append({"group": group, "action": action, **info})

    def to_dict(self) -> dict:
        pred = self.prediction
        return {
            "store": str(self.store), "mode": self.mode, "reason": self.reason, "broker_end": self.broker_end,
            "end": self.end, "records_kept": self.records_kept, "records_lost": self.records_lost,
            "broker_would_lose": self.broker_would_lose, "salvage_needed": self.salvage_needed,
            "salvage": self.salvage, "choices": self.choices, "steps": self.steps,
            "changes": [c.to_dict() for c in self.changes],
            "bytes_changed": sum(c.length if c.op == "write" else c.size for c in self.changes),
            "warnings": self.warnings, "blocked": self.blocked, "abort_present": self.abort_present,
            "needs_repair": self.needs_repair,
            "broker_recovery": pred.to_dict() if pred is not None else None,
        }

    def cleanup(self) -> None:
        if self.stage_dir is not None:
            shutil.rmtree(self.stage_dir, ignore_errors=True)
            self.stage_dir = None


# --- file helpers ----------------------------------------------------------------------------------------


def _open(path: Path, flags: int = os.O_RDONLY) -> int:
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | _O_CLOEXEC)
    except OSError as e:
        raise StoreError(f"cannot open: {e.strerror}", path) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise StoreError("not a regular file", path)
    return fd


def _pread_all(fd: int, length: int, offset: int) -> bytes:
    out = bytearray()
    while len(out) < length:
        chunk = os.pread(fd, min(_CHUNK, length - len(out)), offset + len(out))
        if not chunk:
            break
        out += chunk
    return bytes(out)


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        view, offset = view[n:], offset + n


def _data_extents(fd: int, size: int):
    """(start, end) extents that may hold data (holes skipped where SEEK_DATA works)."""
    pos = 0
    while pos < size:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
            hole = os.lseek(fd, data, os.SEEK_HOLE)
        except OSError:
            if pos == 0:
                yield 0, size
            return
        if data >= size:
            return
        yield data, min(hole, size)
        pos = hole


def sha256_range(path: Path, offset: int, length: int) -> str:
    h = hashlib.sha256()
    fd = _open(path)
    try:
        done = 0
        while done < length:
            chunk = os.pread(fd, min(_CHUNK, length - done), offset + done)
            if not chunk:
                raise StoreError(f"file ends inside the range [{offset}, {offset + length})", path)
            h.update(chunk)
            done += len(chunk)
    finally:
        os.close(fd)
    return h.hexdigest()


def sha256_file(path: Path) -> str:
    return sha256_range(path, 0, os.stat(path, follow_symlinks=False).st_size)


def _zero_sha(length: int) -> str:
    h = hashlib.sha256()
    z = bytes(min(_CHUNK, length))
    done = 0
    while done < length:
        n = min(len(z), length - done)
        h.update(z[:n])
        done += n
    return h.hexdigest()


def _nonzero_chunks(fd: int, size: int):
    """(position, bytes) of the chunks of ``fd``'s data extents that hold a non-zero byte."""
    for a, b in _data_extents(fd, size):
        p = a
        while p < b:
            chunk = os.pread(fd, min(_CHUNK, b - p), p)
            if not chunk:
                return
            if chunk.count(0) != len(chunk):
                yield p, chunk
            p += len(chunk)


def _copy_extents(src: Path, dst_fd: int) -> None:
    """Copy the non-zero chunks of ``src`` into ``dst_fd`` at the same positions."""
    fd = _open(src)
    try:
        for p, chunk in _nonzero_chunks(fd, os.fstat(fd).st_size):
            _pwrite_all(dst_fd, chunk, p)
    finally:
        os.close(fd)


def diff_files(original: Path, staged: Path, unit: int = 4096) -> list[tuple[int, bytes]]:
    """Byte ranges (offset, new bytes) where ``staged`` differs from ``original`` (same size)."""
    out: list[tuple[int, bytes]] = []
    fa, fb = _open(original), _open(staged)
    try:
        size = os.fstat(fa).st_size
        if os.fstat(fb).st_size != size:
            raise StoreError("staged file differs in size", staged)
        pos = 0
        while pos < size:
            n = min(_CHUNK, size - pos)
            a, b = os.pread(fa, n, pos), os.pread(fb, n, pos)
            if a != b:
                for i in range(0, n, unit):
                    if a[i:i + unit] != b[i:i + unit]:
                        piece = b[i:i + unit]
                        if out and out[-1][0] + len(out[-1][1]) == pos + i:
                            out[-1] = (out[-1][0], out[-1][1] + piece)
                        else:
                            out.append((pos + i, piece))
            pos += n
    finally:
        os.close(fa)
        os.close(fb)
    return out


def _writes_from_overlay(original: bytes, base: int, final: bytes, unit: int) -> list[tuple[int, bytes]]:
    """Ranges where ``final`` differs from ``original`` (both starting at file position ``base``)."""
    out: list[tuple[int, bytes]] = []
    for i in range(0, len(final), unit):
        if original[i:i + unit] != final[i:i + unit]:
            piece = final[i:i + unit]
            if out and out[-1][0] + len(out[-1][1]) == base + i:
                out[-1] = (out[-1][0], out[-1][1] + piece)
            else:
                out.append((base + i, piece))
    return out


# --- commitlog tail ---------------------------------------------------------------------------------------


@dataclass
class TailItem:
    """After the broker's end: an intact record or a damaged range (``kind``)."""

    start: int
    end: int
    kind: str  # "record" or an Invalid kind
    store_ts: int = 0
    detail: str = ""


def analyse_tail(cl, start: int, use_mmap: bool = True) -> list[TailItem]:
    """Intact records and damaged ranges from ``start`` to the last data (keep-going walk)."""
    from rmqdump.codec.record import END_OF_DATA, Blank, Message
    from rmqdump.store.commitlog import Skipped

    items: list[TailItem] = []
    if not cl.segments or start >= cl.segments[-1].end:
        return items
    walk = cl.walk(start=start, check_crc=True, read_body=False, keep_going=True, use_mmap=use_mmap)
    for rec in walk:
        if isinstance(rec, Message):
            items.append(TailItem(rec.offset, rec.offset + rec.size, "record", rec.store_timestamp))
        elif isinstance(rec, Skipped):
            items.append(TailItem(rec.start, rec.end, rec.reason.kind, 0, rec.reason.detail))
        elif isinstance(rec, Blank):
            items.append(TailItem(rec.offset, rec.offset + rec.size, "blank"))
    stop = walk.stop
    if stop is not None and stop.kind != END_OF_DATA:
        seg = cl.segment_for(stop.offset)
        items.append(TailItem(stop.offset, seg.end if seg else stop.offset, stop.kind, 0, stop.detail))
    return items


def filler_record(offset: int, length: int, store_ts: int, store_host: str = "127.0.0.1:10911",
                  note: str = "") -> bytes:
    """A well-formed ROLLBACK record of exactly ``length`` bytes at ``offset`` (§11.6).

    Recovery accepts it; neither the ConsumeQueue nor the index dispatcher uses ROLLBACK
    records; QUEUEOFFSET 0. The body explains the repair and pads to the length.
    """
    from rmqdump.codec.encoder import encode_fields
    from rmqdump.codec.msgid import parse_host

    if length < MIN_FILLER:
        raise FormatError(f"a filler record needs at least {MIN_FILLER} bytes, the span has {length}")
    topic = FILLER_TOPIC.encode()[:length - MIN_FILLER]
    body_len = length - MIN_FILLER - len(topic)
    text = FILLER_BODY_PREFIX + (f" {length} damaged bytes at offset {offset} replaced. {note}").encode()
    body = (text + b" " * body_len)[:body_len]
    addr, port = parse_host(store_host)
    if len(addr) != 4:
        addr, port = b"\x7f\x00\x00\x01", 10911
    rec = encode_fields(topic=topic, body=body, properties=b"", queue_id=0, flag=0, queue_offset=0,
                        physical_offset=offset, sys_flag=TRANSACTION_ROLLBACK_TYPE, born_timestamp=store_ts,
                        born_addr=addr, born_port=port, store_timestamp=store_ts, store_addr=addr, store_port=port)
    assert len(rec) == length
    return rec


def tombstone_record(offset: int, length: int, topic: str, queue_id: int, queue_offset: int, store_ts: int,
                     store_host: str = "127.0.0.1:10911", note: str = "", properties: bytes = b"") -> bytes:
    """A record of exactly ``length`` bytes that takes the place of a destroyed message its ConsumeQueue
    entry still points at: same topic, queue id and queue offset, an ordinary (dispatchable) message
    whose body says what was lost. The queue stays consistent: consumers at that offset get this
    notice instead of another topic's bytes. V2 magic only for topics longer than 127 bytes (5.x).
    ``properties``: what survives of the message's own (TAGS, LMQ dispatch), already serialised."""
    from rmqdump.codec.encoder import encode_fields
    from rmqdump.codec.layout import MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2
    from rmqdump.codec.msgid import parse_host

    raw_topic = topic.encode()
    magic = MESSAGE_MAGIC_CODE_V2 if len(raw_topic) > 127 else MESSAGE_MAGIC_CODE
    fixed = len(encode_fields(topic=raw_topic, body=b"", properties=properties, magic=magic))
    if length < fixed:
        raise FormatError(f"a tombstone for {topic} needs at least {fixed} bytes, the record has {length}")
    body_len = length - fixed
    text = FILLER_BODY_PREFIX + (f" the message at offset {offset} ({topic}/{queue_id} queue offset "
                                 f"{queue_offset}) was destroyed. {note}").encode()
    body = (text + b" " * body_len)[:body_len]
    addr, port = parse_host(store_host)
    if len(addr) != 4:
        addr, port = b"\x7f\x00\x00\x01", 10911
    rec = encode_fields(topic=raw_topic, body=body, properties=properties, queue_id=queue_id, flag=0,
                        queue_offset=queue_offset, physical_offset=offset, sys_flag=0, born_timestamp=store_ts,
                        born_addr=addr, born_port=port, store_timestamp=store_ts, store_addr=addr, store_port=port,
                        magic=magic)
    assert len(rec) == length
    return rec


def _tombstone_properties(cl, offset: int, size: int, topic: str, lmq: list[tuple]) -> bytes:
    """Properties for a tombstone: the destroyed record's TAGS when its bytes still decode (a body bit
    flip, a damaged magic), and the LMQ queues whose entries point at it."""
    from rmqdump.codec.encoder import properties_bytes
    from rmqdump.codec.layout import MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2
    from rmqdump.codec.record import Message, decode_record

    props: dict[str, str] = {}
    seg = cl.segment_for(offset)
    try:
        with open(seg.path, "rb") as f:
            f.seek(offset - seg.start)
            raw = bytearray(f.read(size))
    except OSError:
        raw = bytearray()
    for magic in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2):
        if len(raw) != size or size < 8:
            break
        raw[4:8] = magic.to_bytes(4, "big")
        try:
            rec = decode_record(bytes(raw), 0, size, offset - seg.start, seg.start, seg.name, check_crc=False)
        except RmqdumpError:
            continue
        if isinstance(rec, Message) and rec.size == size and rec.topic == topic:
            try:
                tags = rec.properties.get("TAGS")
            except RmqdumpError:
                tags = None
            if tags and "\x01" not in tags and "\x02" not in tags:
                props["TAGS"] = tags
            break
    if lmq:
        props[PROPERTY_INNER_MULTI_DISPATCH] = ",".join(e[2] for e in lmq)
        props[PROPERTY_INNER_MULTI_QUEUE_OFFSET] = ",".join(str(e[4]) for e in lmq)
    return properties_bytes(props)


def _span_pieces(start: int, stop: int, entries: list[tuple], at_file_end: bool) -> list[tuple] | None:
    """Cut a damaged span into tombstones (one per ConsumeQueue entry pointing into it, at its offset and
    size) and neutral fillers between them; None when the entries do not tile the span cleanly."""
    pieces: list[tuple] = []
    pos = start
    by_offset: dict[int, list[tuple]] = {}
    for e in entries:
        by_offset.setdefault(e[0], []).append(e)
    for offset in sorted(by_offset):
        group = by_offset[offset]
        own = [e for e in group if not e[2].startswith(LMQ_PREFIX)]
        if len(own) != 1 or len({e[1] for e in group}) != 1:
            return None  # two queues claim one record, or an LMQ entry alone: nothing to rebuild it as
        size = own[0][1]
        if offset < pos or offset + size > stop or 0 < offset - pos < MIN_FILLER:
            return None
        if offset > pos:
            pieces.append(("filler", pos, offset, None))
        pieces.append(("tombstone", offset, offset + size, (own[0], [e for e in group if e is not own[0]])))
        pos = offset + size
    if pos < stop:
        if stop - pos < (8 if at_file_end else MIN_FILLER):
            return None
        pieces.append(("blank" if at_file_end else "filler", pos, stop, None))
    return pieces


# --- ConsumeQueue simulation ----------------------------------------------------------------------------


class _QueueEdit:
    """One consume queue's final state: existing files with overlays, deletions and new files."""

    def __init__(self, root: Path, topic: str, queue_id: int, qdir: Path, file_size: int, files: list,
                 write_units: int, max_phys: int):
        self.root = root
        self.topic = topic
        self.queue_id = queue_id
        self.qdir = qdir
        self.file_size = file_size
        self.existing = {f.start: f for f in files}
        self.write_units = write_units
        self.max_phys = max_phys
        self.zero_from: dict[int, int] = {}  # file start -> position from which original bytes become zero
        self.deleted: set[int] = set()
        self.units: dict[int, bytes] = {}  # logical byte offset -> 20-byte unit
        self.dropped = 0
        self.added = 0
        self.holes: list[tuple[int, int]] = []  # byte ranges of files missing between kept ones

    @property
    def name(self) -> str:
        return f"{self.topic}/{self.queue_id}"

    def truncate(self, new_end_units: int, dropped: int) -> None:
        cut = new_end_units * CQ_STORE_UNIT_SIZE
        for start in self.existing:
            if start >= cut:
                self.deleted.add(start)
                self.zero_from[start] = 0
            elif start + self.file_size > cut:
                self.zero_from[start] = cut - start
        self.write_units = min(self.write_units, new_end_units)
        self.dropped += dropped

    def put(self, offset: int, size: int, tags_code: int, queue_offset: int) -> bool:
        """``putMessagePositionInfo`` (skip already-built and duplicate positions); a record whose queue
        offset lies in a file missing between kept ones gets its unit back at that position."""
        expect = queue_offset * CQ_STORE_UNIT_SIZE
        if any(a <= expect < b for a, b in self.holes):
            if expect not in self.units:
                self.units[expect] = CQ_UNIT.pack(offset, size, tags_code)
                self.added += 1
            return True
        if offset + size <= self.max_phys:
            return False
        expect = queue_offset * CQ_STORE_UNIT_SIZE
        live = [s for s in self.existing if s not in self.deleted]
        if not live and not self.units and expect != 0 and self.write_units * CQ_STORE_UNIT_SIZE != expect:
            start = expect - expect % self.file_size  # fillPreBlank for a queue created mid-way
            for pos in range(start, expect, CQ_STORE_UNIT_SIZE):
                self.units[pos] = CQ_UNIT.pack(0, 0x7FFFFFFF, 0)
            self.write_units = expect // CQ_STORE_UNIT_SIZE
        cur = self.write_units * CQ_STORE_UNIT_SIZE
        if expect < cur:
            return False
        self.units[cur] = CQ_UNIT.pack(offset, size, tags_code)
        self.write_units += 1
        self.max_phys = offset + size
        self.added += 1
        fs = cur - cur % self.file_size
        self.deleted.discard(fs)
        return True

    def changes(self) -> list[Change]:
        from rmqdump.store.consumequeue import file_name

        out: list[Change] = []
        rel_dir = self.qdir.relative_to(self.root).as_posix()
        by_file: dict[int, dict[int, bytes]] = {}
        for pos, unit in self.units.items():
            fs = pos - pos % self.file_size
            by_file.setdefault(fs, {})[pos - fs] = unit
        wrong_size = {fs for fs, f in self.existing.items() if f.size != self.file_size}
        touched = set(by_file) | set(self.zero_from) | self.deleted | wrong_size
        for fs in sorted(touched):
            rel = f"{rel_dir}/{file_name(fs)}"
            units = by_file.get(fs, {})
            if fs in self.deleted and not units:
                out.append(Change("delete", rel, group="consumequeue",
                                  why=f"{self.name}: file after the new end"))
                continue
            if fs not in self.existing:
                pieces = _merge_units(units)
                out.append(Change("create", rel, size=self.file_size, pieces=pieces, group="consumequeue",
                                  why=f"{self.name}: new file"))
                continue
            f = self.existing[fs]
            zero_at = self.zero_from.get(fs)
            if fs in wrong_size:
                if f.size == 0 and not units and fs == max(self.existing):
                    out.append(Change("delete", rel, group="consumequeue", why=f"{self.name}: zero-length last "
                                      "file: a crash between creating and extending it"))
                else:
                    out += self._replace(f, rel, zero_at, units)
                continue
            lo = min([*units, *([zero_at] if zero_at is not None else [])])
            hi = f.size
            fd = _open(f.path)
            try:
                original = _pread_all(fd, hi - lo, lo)
            finally:
                os.close(fd)
            final = bytearray(original)
            if zero_at is not None:
                final[zero_at - lo:] = bytes(hi - zero_at)
            for p, u in units.items():
                final[p - lo:p - lo + CQ_STORE_UNIT_SIZE] = u
            for off, data in _writes_from_overlay(original, lo, bytes(final), CQ_STORE_UNIT_SIZE):
                out.append(Change("write", rel, offset=off, length=len(data),
                                  data=None if data.count(0) == len(data) else data, group="consumequeue",
                                  why=f"{self.name}: entries"))
        return out


    def _replace(self, f, rel: str, zero_at: int | None, units: dict[int, bytes]) -> list[Change]:
        """A file of the wrong size (a crash between create and extend, or a cut copy): the broker's
        load refuses it, so it is replaced by a full-size file holding its bytes (backed up by the delete)."""
        keep = min(f.size, self.file_size, self.file_size if zero_at is None else zero_at)
        fd = _open(f.path)
        try:
            final = bytearray(_pread_all(fd, keep, 0))
        finally:
            os.close(fd)
        final.extend(bytes(self.file_size - len(final)))
        for p, u in units.items():
            final[p:p + CQ_STORE_UNIT_SIZE] = u
        why = f"{self.name}: {f.size} bytes, not the queue file size {self.file_size} (the broker refuses to load it)"
        return [Change("delete", rel, group="consumequeue", why=why),
                Change("create", rel, size=self.file_size, pieces=_nonzero_pieces(final), group="consumequeue",
                       why=why)]


def _regrow_plan(store, pred, commitlog_file_size: int | None, short: str | None) -> tuple[tuple | None, str | None]:
    """When the broker refuses a store only because commitlog files are not its file size — the one where
    recovery ends was cut short (a copy or a disk that filled up), later ones are deleted by the repair
    anyway — the segment to restore to full length: ((segment, size), None). (None, why) when the
    size is needed but unknown or wrong; (None, None) when something else stops the broker."""
    cl = store.commitlog
    target = commitlog_file_size or (cl.file_size if len(cl.segments) > 1 else None)
    end = pred.max_offset
    hold = next((sg for sg in cl.segments if sg.start <= end <= sg.end and 0 < sg.size), None)
    fixable = {sg.name for sg in cl.segments if sg.start > end or (sg.size == 0 and sg is cl.segments[-1])}
    if hold is not None and target and 0 < hold.size < target:
        fixable.add(hold.name)
    covered = all(any(e.startswith(f"{STORE_COMMITLOG_DIR}/{n} is ") for n in fixable) for e in pred.load_errors)
    if target is None and short:
        return None, f"{short}: pass --commitlog-file-size (the broker's mappedFileSizeCommitLog)"
    if not covered or hold is None:
        return None, None
    if hold.size >= (target or 0):
        return None, None
    if commitlog_file_size and len(cl.segments) > 1 and cl.file_size != commitlog_file_size:
        return None, (f"--commitlog-file-size {commitlog_file_size} differs from the size of the store's other "
                      f"commitlog files ({cl.file_size})")
    return (hold, target), None


def _nonzero_pieces(buf: bytearray, unit: int = 4096) -> list[tuple[int, bytes]]:
    """The ``unit``-aligned runs of ``buf`` holding a non-zero byte, as (offset, bytes)."""
    runs: list[list[int]] = []
    view = memoryview(buf)
    zeros = bytes(unit)
    for off in range(0, len(buf), unit):
        chunk = view[off:off + unit]
        if chunk == zeros[:len(chunk)]:
            continue
        if runs and runs[-1][1] == off:
            runs[-1][1] = min(off + unit, len(buf))
        else:
            runs.append([off, min(off + unit, len(buf))])
    return [(a, bytes(view[a:b])) for a, b in runs]


def _merge_units(units: dict[int, bytes]) -> list[tuple[int, bytes]]:
    pieces: list[tuple[int, bytes]] = []
    for pos in sorted(units):
        if pieces and pieces[-1][0] + len(pieces[-1][1]) == pos:
            pieces[-1] = (pieces[-1][0], pieces[-1][1] + units[pos])
        else:
            pieces.append((pos, units[pos]))
    return pieces


# --- index rebuild ---------------------------------------------------------------------------------------


def _index_keys_of(rec) -> list[str]:
    from rmqdump.store.indexfile import build_index_keys

    if rec.sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_ROLLBACK_TYPE:
        return []
    props = rec.properties
    return build_index_keys(rec.topic, props.get(PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX), props.get(PROPERTY_KEYS))


def build_index_files(cl, out_dir: Path, slots: int, entries: int, *, start: int, end: int, first_name: str | None,
                      seed_phy: int = 0, seed_ts: int = 0, skip_first_keys: int = 0, name_clock=None,
                      taken_names: set[str] | None = None, use_mmap: bool = True,
                      exclude: set[int] | frozenset = frozenset()) -> list[Path]:
    """Index files for the records in [start, end), written like ``IndexService`` (rolling full files).

    The first file is named ``first_name`` (or by ``name_clock``) and seeded with the previous
    file's end values (``seed_phy``/``seed_ts``); ``skip_first_keys`` keys of the record at
    ``start`` are skipped (they went into the previous file).
    """
    from rmqdump.codec.javahash import index_key_hash
    from rmqdump.codec.record import Message
    from rmqdump.store.indexfile import IndexFileWriter, index_file_name

    clock = name_clock or (lambda: int(time.time() * 1000))
    taken = set(taken_names or ())
    made: list[Path] = []

    def new_file(end_phy: int, end_ts: int):
        if first_name is not None and not made:
            name = first_name
        else:
            ms = clock()
            name = index_file_name(ms, utc=True)
            while name in taken or (made and name <= made[-1].name):
                ms += 1
                name = index_file_name(ms, utc=True)
        taken.add(name)
        w = IndexFileWriter.create(out_dir / name, slots, entries, end_phy, end_ts)
        made.append(w.path)
        return w

    w = new_file(seed_phy, seed_ts)
    hashes: list[int] = []
    phys: list[int] = []
    tss: list[int] = []

    def flush() -> None:
        nonlocal w
        done = 0
        while done < len(hashes):
            n = w.bulk_put(hashes[done:], phys[done:], tss[done:])
            done += n
            if done < len(hashes):
                h = w.header
                w.close()
                w = new_file(h.end_phy_offset, h.end_timestamp)
        hashes.clear()
        phys.clear()
        tss.clear()

    if start < end:
        for rec in cl.walk(start=start, end=end, check_crc=False, read_body=False, keep_going=True,
                           use_mmap=use_mmap):
            if not isinstance(rec, Message) or rec.offset < start or rec.offset in exclude:
                continue
            keys = _index_keys_of(rec)
            if rec.offset == start and skip_first_keys:
                keys = keys[skip_first_keys:]
            for k in keys:
                hashes.append(index_key_hash(k))
                phys.append(rec.offset)
                tss.append(rec.store_timestamp)
            if len(hashes) >= 65536:
                flush()
        flush()
    w.close()
    return made


def _fix_first_time_diff(original: Path, staged: Path, entries_start: int) -> None:
    """Keep the original first entry's timeDiff (it depends on the seed of a file we may not have)."""
    pos = entries_start + INDEX_ENTRY.size
    fa = _open(original)
    try:
        a = os.pread(fa, INDEX_ENTRY.size, pos)
    finally:
        os.close(fa)
    fb = _open(staged, os.O_RDWR)
    try:
        b = os.pread(fb, INDEX_ENTRY.size, pos)
        if len(a) == len(b) == INDEX_ENTRY.size:
            ha, pa, ta, va = INDEX_ENTRY.unpack(a)
            hb, pb, tb, vb = INDEX_ENTRY.unpack(b)
            if (ha, pa, va) == (hb, pb, vb) and pa != 0 and ta != tb:
                os.pwrite(fb, INDEX_ENTRY.pack(hb, pb, ta, vb), pos)
    finally:
        os.close(fb)


def _index_consistent(path: Path, geo, header) -> bool:
    """Slot heads within indexCount (a torn putKey leaves a slot pointing past it)."""
    fd = _open(path)
    try:
        table = _pread_all(fd, geo.hash_slot_num * INDEX_HASH_SLOT_SIZE, INDEX_HEADER_SIZE)
    finally:
        os.close(fd)
    count = header.effective_index_count
    for (v,) in struct.iter_unpack(">i", table):
        if v > count or v < 0:
            return False
    return True


# --- planning ---------------------------------------------------------------------------------------------


def plan_repair(store_path: str | os.PathLike, *, salvage: str | None = None, rebuild_cq: bool = False,
                rebuild_index: bool = False, use_mmap: bool = True, delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS,
                name_clock=None, cq_file_size: int | None = None,
                commitlog_file_size: int | None = None) -> RepairPlan:
    """The repair plan for a store (reads only; staged index files go to a temp dir). ``cq_file_size``: the
    broker's mappedFileSizeConsumeQueue, needed only when no ConsumeQueue file of the store tells it;
    ``commitlog_file_size``: the broker's mappedFileSizeCommitLog, needed only when the store's only
    commitlog file was cut short (the file is restored to that length)."""
    from rmqdump.broker.recovery import (
        MODE_ABNORMAL,
        MODE_EMPTY,
        MODE_NORMAL,
        MODE_REFUSES,
        VERSION_49,
        consume_queue_states,
        cq_truncation,
        cut_short,
        predict_recovery_auto,
    )
    from rmqdump.codec.msgid import format_host
    from rmqdump.store.consumequeue import check_not_rocksdb, infer_store_cq_file_size
    from rmqdump.store.indexfile import IndexFile, infer_geometry, list_index_files
    from rmqdump.store.root import Store
    from rmqdump.write.appender import nonzero_span, read_abort, store_geometry

    if salvage is not None and salvage not in SALVAGE_CHOICES:
        raise RmqdumpError(f"unknown salvage choice {salvage!r} (choose {', '.join(SALVAGE_CHOICES)})")
    root = Path(store_path)
    store = Store.open(root)
    if store.root is None:
        raise StoreError("repair needs a store root (with commitlog/, consumequeue/, index/ ...)", root)
    root = store.root
    check_not_rocksdb(root)
    cl = store.commitlog
    plan = RepairPlan(root, salvage=salvage)
    abort = read_abort(root)
    plan.abort_present = abort is not None
    states, cq_problems = consume_queue_states(store)
    # a zero-length last segment (a crash between creating and extending it) holds nothing: it is deleted
    pred, model = predict_recovery_auto(store, queue_states=states, use_mmap=use_mmap, zero_last_ok=True)
    plan.prediction = pred
    if pred.version != VERSION_49:
        plan.warnings.append(f"recovery modelled as broker {pred.version}.x: {model}")
    plan.mode, plan.reason = pred.mode, pred.reason
    plan.warnings += cq_problems
    regrow = None  # (segment, its restored length): a commitlog file cut short where recovery ends
    if pred.mode == MODE_REFUSES and pred.walk is not None and cl.segments:
        regrow, why_not = _regrow_plan(store, pred, commitlog_file_size, cut_short(store, pred.walk))
        if why_not:
            plan.blocked = why_not
            return plan
        if regrow is not None:
            plan.mode = MODE_ABNORMAL if store.abort_present else MODE_NORMAL
            plan.reason = "; ".join(pred.load_errors)
    if pred.mode in (MODE_REFUSES, MODE_EMPTY) and regrow is None:
        plan.blocked = pred.reason
        return plan
    cq_file_size = cq_file_size if cq_file_size is not None else infer_store_cq_file_size(root)
    cq_size_known = cq_file_size is not None
    geo = store_geometry(root, cq_file_size=cq_file_size)
    X = pred.max_offset
    plan.broker_end = X

    # -- commitlog -------------------------------------------------------------------------------------
    tail = analyse_tail(cl, X, use_mmap)
    records_after = [t for t in tail if t.kind == "record"]
    plan.broker_would_lose = len(records_after)
    walked_before = pred.walk.records if pred.walk else 0
    host = "127.0.0.1:10911"
    last_ts = pred.walk.last_store_timestamp if pred.walk else 0
    if pred.walk and pred.walk.last_record_offset is not None:
        m = cl.decode_at(pred.walk.last_record_offset, check_crc=False, read_body=False)
        if hasattr(m, "store_addr"):
            host = format_host(m.store_addr, m.store_port)
    fillers: list[tuple[int, int, str]] = []
    end = X
    kept_after = 0
    if records_after:
        plan.salvage_needed = True
        plan.choices = _salvage_choices(cl, tail, X)
        chosen = salvage
        if chosen is None and abort is not None and abort.ours:
            # rmqdump's appender held back the first bytes of its unfinished batch: what lies after the end
            # was never acknowledged, so cutting it off loses nothing anyone was told is stored
            chosen = plan.salvage = "truncate"
            who = abort.content.decode(errors="replace").strip()
            plan.warnings.append(f"abort was left by an interrupted rmqdump run ({who}): the {len(records_after)} "
                                 "records after the end were never acknowledged; truncating them (--salvage filler "
                                 "keeps them)")
        if chosen is None:
            plan.blocked = (f"{len(records_after)} intact records lie after damage at {X}: choose --salvage "
                            "truncate (lose them, as the broker would), filler (keep them; damaged spans become "
                            "filler records) or recrc (also keep records whose only fault is the body CRC)")
            chosen = "truncate"  # show the truncate outcome in the plan
        if chosen in ("filler", "recrc"):
            end, fillers, kept_after = _filler_outcome(cl, tail, X)
    plan.end = end
    plan.records_kept = walked_before + kept_after
    plan.records_lost = len(records_after) - kept_after
    plan.step("commitlog", "end", offset=end, broker_end=X,
              detail=(f"recovery stops at {X}: {pred.walk.stop.kind}: {pred.walk.stop.detail}"
                      if pred.walk and pred.walk.stop else ""))
    prev_ts = last_ts
    neutralised: list[tuple[int, int]] = []
    pointing = _entries_into(states, [(a, b) for a, b, _ in fillers])
    tombstoned: set[int] = set()
    filler_offsets: set[int] = set()
    for start, stop, kind in fillers:
        seg = cl.segment_for(start)
        rel = f"{STORE_COMMITLOG_DIR}/{seg.name}"
        ts = _store_ts_before(tail, start) or prev_ts
        fixed = _recrc(cl, start, stop) if plan.salvage == "recrc" else None
        if fixed is not None:
            pos, crc_bytes, what = fixed
            plan.changes.append(Change("write", rel, offset=pos - seg.start, length=4, data=crc_bytes,
                                       group="commitlog", why=what))
            plan.step("commitlog", "recrc", offset=start, length=stop - start, kind=kind, detail=what)
            continue
        neutralised.append((start, stop))
        pieces = _span_pieces(start, stop, pointing.get((start, stop), []), stop == seg.end)
        if pieces is None:
            pieces = [("blank" if stop == seg.end else "filler", start, stop, None)]
        for what_kind, a, b, e in pieces:
            if what_kind == "tombstone":
                (_o, _s, topic, qid, qoff), lmq = e
                props = _tombstone_properties(cl, a, b - a, topic, lmq)
                try:
                    data = tombstone_record(a, b - a, topic, qid, qoff, ts, host, f"({kind})", props)
                except FormatError:  # the record is too small for its topic and properties: a plain filler
                    data = filler_record(a, b - a, ts, host, f"({kind})")
                    what = f"ROLLBACK filler record over {b - a} damaged bytes ({kind})"
                    filler_offsets.add(a)
                    plan.changes.append(Change("write", rel, offset=a - seg.start, length=len(data), data=data,
                                               group="commitlog", why=what))
                    plan.step("commitlog", "neutralise", offset=a, length=b - a, kind=kind, detail=what)
                    continue
                what = f"tombstone for {topic}/{qid} queue offset {qoff} over {b - a} damaged bytes ({kind})"
                tombstoned.add(a)
            elif what_kind == "blank":
                data = _blank(b - a)
                what = f"end-of-file BLANK over {b - a} damaged bytes ({kind})"
            else:
                data = filler_record(a, b - a, ts, host, f"({kind})")
                what = f"ROLLBACK filler record over {b - a} damaged bytes ({kind})"
                filler_offsets.add(a)
            plan.changes.append(Change("write", rel, offset=a - seg.start, length=len(data), data=data,
                                       group="commitlog", why=what))
            plan.step("commitlog", "neutralise", offset=a, length=b - a, kind=kind, detail=what)
    seg = cl.segment_for(end)
    if regrow is not None:
        seg, size = regrow
        rel = f"{STORE_COMMITLOG_DIR}/{seg.name}"
        fd = _open(seg.path)
        try:
            final = bytearray(_pread_all(fd, end - seg.start, 0))
        finally:
            os.close(fd)
        final.extend(bytes(size - len(final)))
        why = (f"{seg.size} bytes: cut short; restored to the broker's file size {size}, holding its records "
               f"up to {end}")
        plan.changes += [Change("delete", rel, group="commitlog", why=why),
                         Change("create", rel, size=size, pieces=_nonzero_pieces(final), group="commitlog",
                                why=why)]
        plan.step("commitlog", "regrow", file=seg.name, size=size, detail=why)
        seg = None
    if seg is not None:
        span = nonzero_span(seg.path, end - seg.start, seg.size)
        if span is not None:
            a, b = span
            rel = f"{STORE_COMMITLOG_DIR}/{seg.name}"
            plan.changes.append(Change("write", rel, offset=a, length=b - a, group="commitlog",
                                       why=f"zero the bytes after the end {end}"))
            plan.step("commitlog", "truncate", offset=end, file=seg.name, position=end - seg.start,
                      zero_from=seg.start + a, zero_bytes=b - a)
    for s in cl.segments:
        if s.start > end or (s.size == 0 and s is cl.segments[-1]):
            has_data = nonzero_span(s.path, 0, s.size) is not None
            why = ("zero-length last segment: a crash between creating and extending it" if s.size == 0 else
                   "segment after the end" + ("" if has_data else " (all zeros)"))
            plan.changes.append(Change("delete", f"{STORE_COMMITLOG_DIR}/{s.name}", group="commitlog", why=why))
            plan.step("commitlog", "delete", file=s.name, has_data=has_data)
    for entries in pointing.values():
        for off, _sz, topic, qid, qoff in entries:
            if off not in tombstoned:
                plan.warnings.append(f"ConsumeQueue {topic}/{qid} queue offset {qoff} points at neutralised bytes "
                                     f"at {off}: consumers are served the filler record there")

    # -- consume queues ------------------------------------------------------------------------------
    if rebuild_cq:
        plan.step("consumequeue", "rebuild", detail="regenerate every consume queue from the commitlog")
        plan.changes += _rebuild_cq_changes(cl, root, geo.cq_file_size, end, plan, use_mmap, delay_levels_ms)
    else:
        plan.changes += _cq_changes(cl, root, states, geo.cq_file_size, pred, end, plan, use_mmap, delay_levels_ms,
                                    filler_offsets, cq_truncation)
    if not cq_size_known and any(c.op == "create" and c.group == "consumequeue" for c in plan.changes):
        # a file of another size than the broker's mappedFileSizeConsumeQueue makes its load() fail
        plan.blocked = ("no ConsumeQueue file of this store tells the broker's ConsumeQueue file size "
                        "(mappedFileSizeConsumeQueue), and a file of the wrong size stops the broker from "
                        "starting: pass --cq-file-size (the default is 6000000)")

    # -- index -------------------------------------------------------------------------------------------
    files = []
    for p in list_index_files(root):
        if _size(p) == 0:  # a crash between creating and extending it: holds nothing
            plan.changes.append(Change("delete", f"{STORE_INDEX_DIR}/{p.name}", group="index",
                                       why="zero-length index file: a crash between creating and extending it"))
            plan.step("index", "delete", file=p.name, entries=0)
        else:
            files.append(p)
    full_end_ts = 0
    if rebuild_index or files:
        stage = Path(tempfile.mkdtemp(prefix="rmqdump-repair-"))
        plan.stage_dir = stage
        headers = []
        for p in files:
            try:
                with IndexFile(p, geo.index_slots, geo.index_entries, strict=False) as f:
                    headers.append(f.header)
            except RmqdumpError as e:
                plan.warnings.append(f"index/{p.name}: unreadable ({e.message}); it is rebuilt")
                headers.append(None)
        if rebuild_index:
            plan.changes += _rebuild_index_changes(cl, root, files, geo, end, plan, stage, name_clock, use_mmap)
        else:
            plan.changes += _index_changes(cl, root, files, headers, geo, end, plan, stage, name_clock, use_mmap,
                                           infer_geometry, neutralised)
        full_end_ts = _full_index_end_ts(root, plan, geo)

    # -- checkpoint -----------------------------------------------------------------------------------
    _checkpoint_change(root, cl, end, plan, full_end_ts, use_mmap)
    if abort is not None:
        plan.step("abort", "remove", detail="the repaired store is consistent: the broker runs its normal recovery"
                  + (" (abort was left by an interrupted rmqdump run)" if abort.ours else ""))
    if abort is not None and not abort.ours and pred.walk and abort.mtime_ms > last_ts + 1000 and last_ts:
        plan.warnings.append("abort is newer than the last record: a broker started after the last write — make "
                             "sure it is stopped (rmqdump also checks the lock and open files)")
    if plan.broker_would_lose and plan.salvage == "filler":
        plan.step("outcome", "salvage", detail=f"keeps {kept_after} of the {plan.broker_would_lose} intact records "
                  "the broker's recovery would delete")
    return plan


def _size(path: Path) -> int:
    try:
        return os.stat(path, follow_symlinks=False).st_size
    except OSError as e:
        raise StoreError(f"cannot stat: {e.strerror}", path) from None


def _blank(length: int) -> bytes:
    from rmqdump.codec.encoder import encode_blank

    return encode_blank(length)


def _store_ts_before(tail: list[TailItem], offset: int) -> int:
    ts = 0
    for t in tail:
        if t.start >= offset:
            break
        if t.kind == "record":
            ts = t.store_ts
    return ts


def _filler_outcome(cl, tail: list[TailItem], X: int) -> tuple[int, list[tuple[int, int, str]], int]:
    """Neutralise damaged ranges that precede intact records; (new end, fillers, records kept)."""
    fillers: list[tuple[int, int, str]] = []
    end = X
    kept = 0
    pending: list[TailItem] = []
    for t in tail:
        if t.kind == "record":
            ok = True
            for d in pending:
                seg = cl.segment_for(d.start)
                n = d.end - d.start
                if seg is None or (d.end != seg.end and n < MIN_FILLER) or (d.end == seg.end and
                                                                             n < END_FILE_MIN_BLANK_LENGTH):
                    ok = False
                    break
            if not ok:
                return end, fillers, kept
            fillers += [(d.start, d.end, d.kind) for d in pending]
            pending = []
            kept += 1
            end = t.end
        elif t.kind == "blank":
            end = t.end
        else:
            pending.append(t)
    return end, fillers, kept


def _recrc(cl, start: int, stop: int) -> tuple[int, bytes, str] | None:
    """For a record whose only fault is its body CRC: (position, new BODYCRC bytes, description)."""
    from rmqdump.codec.crc import body_crc
    from rmqdump.codec.layout import PROPERTY_CRC32
    from rmqdump.codec.record import Message

    rec = cl.decode_at(start, check_crc=False, read_body=True)
    if not isinstance(rec, Message) or rec.size != stop - start or rec.body is None:
        return None
    if PROPERTY_CRC32 in rec.properties or rec.crc_ok:
        return None  # a 5.2+ record CRC would have to be recomputed too; use filler instead
    crc = body_crc(rec.body)
    if crc == rec.body_crc:
        return None
    return (start + 8, struct.pack(">i", crc),
            f"BODYCRC {rec.body_crc} -> {crc}: keep the record ({rec.topic}/{rec.queue_id} queue offset "
            f"{rec.queue_offset}) with its body as stored, although the body no longer matches what was written")


def _entries_into(states, spans: list[tuple[int, int]]) -> dict[tuple[int, int], list[tuple]]:
    """ConsumeQueue entries that point into damaged spans: span -> [(offset, size, topic, queue id, queue offset)]."""
    out: dict[tuple[int, int], list[tuple]] = {}
    if not spans:
        return out
    for st in states:
        cq = st.cq
        if cq is None or not cq.files:
            continue
        for a, b in spans:
            lo, hi = st.first_offset, st.max_offset - 1
            while lo <= hi:  # first entry with commitLogOffset >= a (entries are in commitlog order)
                mid = (lo + hi) // 2
                try:
                    e = cq.entry_at(mid, check_max=False)
                except RmqdumpError:
                    break
                if e.commit_log_offset < a:
                    lo = mid + 1
                else:
                    hi = mid - 1
            q = lo
            while q < st.max_offset:
                try:
                    e = cq.entry_at(q, check_max=False)
                except RmqdumpError:
                    break
                if not (a <= e.commit_log_offset < b):
                    break
                out.setdefault((a, b), []).append((e.commit_log_offset, e.size, st.topic, st.queue_id, q))
                q += 1
    return out


def _salvage_choices(cl, tail: list[TailItem], X: int) -> list[dict]:
    n = sum(1 for t in tail if t.kind == "record")
    end, fillers, kept = _filler_outcome(cl, tail, X)
    crc_only = [(a, b) for a, b, k in fillers if k == "body_crc" and _recrc(cl, a, b) is not None]
    return [
        {"name": "truncate", "end": X, "keeps_after_damage": 0, "loses": n,
         "detail": "what the broker's recovery does: cut at the first damage, delete everything after it"},
        {"name": "filler", "end": end, "keeps_after_damage": kept, "loses": n - kept,
         "neutralised_ranges": [{"start": a, "end": b, "kind": k} for a, b, k in fillers],
         "detail": "replace each damaged span by a ROLLBACK filler record (or an end-of-file BLANK) so recovery "
                   "walks past it; the damaged bytes stay in the backup"},
        {"name": "recrc", "end": end, "keeps_after_damage": kept, "loses": n - kept,
         "records_kept_with_bad_body": len(crc_only),
         "detail": "like filler, but a record whose only fault is its body CRC is kept: its BODYCRC is rewritten to "
                   "match the body as stored (the damaged body is served to consumers; ConsumeQueue and index "
                   "entries stay valid)"},
    ]


def _topic_alive(root: Path):
    """A predicate: may a topic whose consume-queue directory is gone get its entries back? Not when
    ``config/topics.json`` exists and no longer lists it (deleted by an admin: the broker removed its queues,
    the commitlog keeps the records until they expire)."""
    from rmqdump.store.config import load_topics

    try:
        topics = load_topics(root).data
    except RmqdumpError:
        topics = None
    if not topics:
        return lambda topic: True
    return lambda topic: topic in topics or topic.startswith(LMQ_PREFIX)


def _cq_changes(cl, root: Path, states, cq_file_size: int, pred, end: int, plan: RepairPlan, use_mmap: bool,
                delay_levels_ms, filler_offsets: set[int], cq_truncation) -> list[Change]:
    from rmqdump.codec.record import Message

    edits: dict[tuple[str, int], _QueueEdit] = {}
    for st in states:
        qt = cq_truncation(st, end, True)
        new_end = min(qt.new_end, qt.recovered_end)
        if qt.dropped:
            new_end = min(new_end, qt.dropped[0][0])
        max_phys = -1
        if new_end > st.first_offset and st.cq is not None:
            try:
                e = st.cq.entry_at(new_end - 1, check_max=False)
                if e.is_valid:
                    max_phys = e.commit_log_offset + e.size
            except RmqdumpError:
                pass
        ed = _QueueEdit(root, st.topic, st.queue_id, st.path, st.file_size, st.cq.files if st.cq else st.files,
                        new_end, max_phys)
        extent = _cq_extent(st, new_end)
        if extent > new_end or qt.count:
            ed.truncate(new_end, qt.count)
        edits[(st.topic, st.queue_id)] = ed
        if st.cq is not None:
            ed.holes = [(a, b) for a, b in st.cq.missing_files() if a < new_end * CQ_STORE_UNIT_SIZE]
    # dispatch every record the consume queues lack, also below where the broker's recovery starts (what it
    # would never restore: a lost queue tail, units of files missing between kept ones, queues whose
    # directory is gone - unless config/topics.json says the topic was deleted)
    # where the broker itself dispatches from: the abnormal recovery's walk, else the reput service's start
    if pred.mode == "abnormal" and pred.start_offset is not None:
        dispatch_from = pred.start_offset
    else:
        dispatch_from = max(cl.min_offset, min(pred.max_phy_offset_of_consume_queue, end))
    start = cl.min_offset
    alive = _topic_alive(root)
    batch_topics = batch_cq_topics(root)
    batch_queues = open_batch_queues(root) if batch_topics else {}
    undispatched_batch: dict[tuple[str, int], int] = {}
    for rec in cl.walk(start=start, end=end, check_crc=False, read_body=False, use_mmap=use_mmap):
        if not isinstance(rec, Message) or rec.offset in filler_offsets:
            continue
        if rec.sys_flag & TRANSACTION_TYPE_MASK not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
            continue
        key = (rec.topic, rec.queue_id)
        if rec.topic in batch_topics or rec.sys_flag & INNER_BATCH_FLAG:
            # a 5.x BatchCQ topic: dispatched into batchconsumequeue/, never into consumequeue/
            bq = batch_queues.get(key)
            if bq is None or rec.offset + rec.size > bq.max_physic_end:
                undispatched_batch[key] = undispatched_batch.get(key, 0) + 1
            continue
        try:
            tags = dispatch_tags_code(rec.topic, rec.properties, rec.store_timestamp, delay_levels_ms)
        except ValueError:
            plan.warnings.append(f"record at {rec.offset}: malformed DELAY; the broker's dispatch fails too")
            continue
        for topic, qid, qoff in dispatch_targets(rec):
            key = (topic, qid)
            ed = edits.get(key)
            if rec.offset < dispatch_from and ed is None and key not in edits and not alive(topic):
                continue
            if ed is None and key not in edits:
                if not is_safe_component(topic):
                    plan.warnings.append(f"topic {topic!r} cannot be a consume-queue directory; not dispatched")
                    edits[key] = None
                    continue
                qdir = root / STORE_CONSUMEQUEUE_DIR / topic / str(qid)
                ed = _QueueEdit(root, topic, qid, qdir, cq_file_size, _unloaded_files(qdir), 0, -1)
                edits[key] = ed
            if ed is not None:
                ed.put(rec.offset, rec.size, tags, qoff)
    for (topic, qid), n in sorted(undispatched_batch.items()):
        plan.warnings.append(f"batchconsumequeue/{topic}/{qid}: {n} record(s) of this BatchCQ topic have no "
                             "BatchConsumeQueue unit; rmqdump does not write BatchConsumeQueue units (not "
                             "supported), nothing dispatched for them")
    out: list[Change] = []
    for ed in edits.values():
        if ed is None:
            continue
        if ed.dropped:
            plan.step("consumequeue", "drop", queue=ed.name, entries=ed.dropped)
        if ed.added:
            plan.step("consumequeue", "dispatch", queue=ed.name, entries=ed.added,
                      detail="records the dispatch had not caught up with")
        out += ed.changes()
    for f in states:
        if f.cq is not None and f.cq.stray_files:
            plan.warnings.append(f"consumequeue/{f.topic}/{f.queue_id}: stray files left alone")
    return out


def _unloaded_files(qdir: Path) -> list:
    """Files of a queue whose consume queue did not load (e.g. only a zero-length file): replaced or deleted."""
    from rmqdump.store.consumequeue import list_mapped_files

    if not qdir.is_dir():
        return []
    return list_mapped_files(qdir)[0]


def _cq_extent(st, from_units: int) -> int:
    """Units up to the last non-zero byte of a queue's files at or after ``from_units`` (0 if none)."""
    from rmqdump.write.appender import nonzero_span

    best = 0
    cut = from_units * CQ_STORE_UNIT_SIZE
    for f in st.cq.files if st.cq is not None else st.files:
        if f.start + f.size <= cut:
            continue
        span = nonzero_span(f.path, max(0, cut - f.start), f.size)
        if span is not None:
            best = max(best, (f.start + span[1] + CQ_STORE_UNIT_SIZE - 1) // CQ_STORE_UNIT_SIZE)
    return best


def _index_changes(cl, root: Path, files: list[Path], headers: list, geo, end: int, plan: RepairPlan, stage: Path,
                   name_clock, use_mmap: bool, infer_geometry, neutralised: list[tuple[int, int]] = ()
                   ) -> list[Change]:
    """Delete index files wholly past the end; rebuild the last one when it is stale, lagging or torn."""
    from rmqdump.codec.record import Message

    out: list[Change] = []
    keep = list(range(len(files)))
    for i in reversed(range(len(files))):
        h = headers[i]
        if h is not None and h.entry_count > 0 and h.begin_phy_offset >= end:
            out.append(Change("delete", f"{STORE_INDEX_DIR}/{files[i].name}", group="index",
                              why="every entry points past the end"))
            plan.step("index", "delete", file=files[i].name, entries=h.entry_count)
            keep.pop()
        else:
            break
    if not keep:
        return out
    li = keep[-1]
    path, h = files[li], headers[li]
    try:
        lgeo = infer_geometry(path.stat().st_size, geo.index_slots, geo.index_entries, path)
    except RmqdumpError:
        lgeo = None
    reasons = []
    for i, (p, hh) in enumerate(zip(files, headers, strict=True)):
        if hh is None or hh.entry_count == 0 or i == li:
            continue
        hit = [a for a, _ in neutralised if hh.begin_phy_offset <= a <= hh.end_phy_offset]
        if hit:
            plan.warnings.append(f"index/{p.name} holds entries for the neutralised record(s) at {hit[:5]}; "
                                 "--rebuild-index regenerates it")
    if h is None or lgeo is None:
        reasons.append("unreadable header or size")
    else:
        hit = [a for a, _ in neutralised if h.entry_count > 0 and h.begin_phy_offset <= a <= h.end_phy_offset]
        if hit:
            reasons.append(f"entries point at neutralised records ({', '.join(map(str, hit[:5]))})")
        if h.entry_count > 0 and h.end_phy_offset >= end:
            reasons.append(f"entries point at offset {h.end_phy_offset}, past the end {end}")
        if not _index_consistent(path, lgeo, h):
            reasons.append("a slot points past indexCount (torn putKey)")
        lag_from = None
        if h.entry_count > 0 and h.end_phy_offset < end:
            last = cl.decode_at(h.end_phy_offset, check_crc=False, read_body=False)
            if isinstance(last, Message):
                lag_from = h.end_phy_offset + last.size
            else:
                reasons.append(f"the last entry points at {h.end_phy_offset}, where there is no record")
        elif h.entry_count == 0:
            lag_from = _record_start_at_or_after(cl, max(h.begin_phy_offset, cl.min_offset), end, use_mmap)
        if lag_from is not None and lag_from < end:
            for rec in cl.walk(start=lag_from, end=end, check_crc=False, read_body=False, use_mmap=use_mmap):
                if isinstance(rec, Message) and _index_keys_of(rec):
                    reasons.append(f"records from offset {rec.offset} have no index entries")
                    break
    if not reasons or lgeo is None:
        if lgeo is None:
            plan.warnings.append(f"index/{path.name}: geometry unknown; use --rebuild-index")
        return out
    prev = headers[li - 1] if li > 0 else None
    seed_phy = prev.end_phy_offset if prev is not None else 0
    seed_ts = prev.end_timestamp if prev is not None else 0
    begin = h.begin_phy_offset if (h is not None and h.entry_count > 0) else max(seed_phy, cl.min_offset)
    skip = 0
    if prev is not None and prev.entry_count > 0 and prev.end_phy_offset == begin:
        skip = _entries_at_phy(files[li - 1], lgeo, prev, begin)
    begin_rec = _record_start_at_or_after(cl, begin, end, use_mmap)
    made = build_index_files(cl, stage, lgeo.hash_slot_num, lgeo.index_num, start=begin_rec, end=end,
                             first_name=path.name, seed_phy=seed_phy, seed_ts=seed_ts,
                             skip_first_keys=skip if begin_rec == begin else 0, name_clock=name_clock,
                             taken_names={p.name for p in files}, use_mmap=use_mmap,
                             exclude={a for a, _ in neutralised})
    _fix_first_time_diff(path, made[0], lgeo.entries_start)
    for off, data in diff_files(path, made[0]):
        out.append(Change("write", f"{STORE_INDEX_DIR}/{path.name}", offset=off, length=len(data), data=data,
                          group="index", why="rebuild"))
    from rmqdump.store.indexfile import IndexFile

    with IndexFile(made[0], lgeo.hash_slot_num, lgeo.index_num) as f:
        n_new = f.header.entry_count
    plan.step("index", "rebuild", file=path.name, entries_before=h.entry_count if h else None, entries_after=n_new,
              reasons=reasons)
    for extra in made[1:]:
        out.append(Change("create", f"{STORE_INDEX_DIR}/{extra.name}", size=extra.stat().st_size, source=extra,
                          group="index", why="rebuild: next index file"))
        plan.step("index", "create", file=extra.name)
    return out


def _record_start_at_or_after(cl, offset: int, end: int, use_mmap: bool) -> int:
    """``offset`` if a record starts there, else the recovery walk's first record after it."""
    from rmqdump.codec.record import Blank, Message

    if offset >= end:
        return end
    rec = cl.decode_at(offset, check_crc=False, read_body=False)
    if isinstance(rec, Message | Blank):
        return offset
    seg = cl.segment_for(offset)
    for r in cl.walk(start=seg.start if seg else cl.min_offset, end=end, check_crc=False, read_body=False,
                     use_mmap=use_mmap):
        if isinstance(r, Message) and r.offset >= offset:
            return r.offset
    return end


def _entries_at_phy(path: Path, geo, header, phy: int) -> int:
    """How many of the last entries of an index file point at ``phy``."""
    n = 0
    fd = _open(path)
    try:
        i = header.effective_index_count - 1
        while i >= 1:
            e = os.pread(fd, INDEX_ENTRY.size, geo.entries_start + i * INDEX_ENTRY.size)
            if len(e) < INDEX_ENTRY.size or INDEX_ENTRY.unpack(e)[1] != phy:
                break
            n += 1
            i -= 1
    finally:
        os.close(fd)
    return n


def _rebuild_index_changes(cl, root: Path, files: list[Path], geo, end: int, plan: RepairPlan, stage: Path,
                           name_clock, use_mmap: bool) -> list[Change]:
    """Regenerate every index file from the commitlog (in place: diff against the existing files)."""
    made = build_index_files(cl, stage, geo.index_slots, geo.index_entries, start=cl.min_offset, end=end,
                             first_name=files[0].name if files else None, name_clock=name_clock,
                             taken_names={p.name for p in files}, use_mmap=use_mmap)
    # keep the existing names, in order, for the files the rebuild produced
    names = [p.name for p in files]
    out: list[Change] = []
    for i, staged in enumerate(made):
        name = names[i] if i < len(names) else staged.name
        if name != staged.name:
            target = stage / name
            staged.rename(target)
            staged = target
        dst = root / STORE_INDEX_DIR / name
        if i < len(names) and dst.stat().st_size == staged.stat().st_size:
            _fix_first_time_diff(dst, staged, INDEX_HEADER_SIZE + geo.index_slots * INDEX_HASH_SLOT_SIZE)
            for off, data in diff_files(dst, staged):
                out.append(Change("write", f"{STORE_INDEX_DIR}/{name}", offset=off, length=len(data), data=data,
                                  group="index", why="rebuild"))
        else:
            if i < len(names):
                out.append(Change("delete", f"{STORE_INDEX_DIR}/{name}", group="index", why="rebuild (size)"))
            out.append(Change("create", f"{STORE_INDEX_DIR}/{name}", size=staged.stat().st_size, source=staged,
                              group="index", why="rebuild"))
    for name in names[len(made):]:
        out.append(Change("delete", f"{STORE_INDEX_DIR}/{name}", group="index", why="rebuild: not needed"))
    plan.step("index", "rebuild_all", files=len(made), detail="every index file regenerated from the commitlog")
    return out


def _rebuild_cq_changes(cl, root: Path, cq_file_size: int, end: int, plan: RepairPlan, use_mmap: bool,
                        delay_levels_ms) -> list[Change]:
    """Regenerate every consume queue from the commitlog; diff against what is on disk."""
    from rmqdump.store.consumequeue import discover_queues, file_name, list_mapped_files

    stage = Path(tempfile.mkdtemp(prefix="rmqdump-rebuild-cq-"))
    try:
        built = rebuild_consume_queues(cl, stage, cq_file_size, end=end, use_mmap=use_mmap,
                                       delay_levels_ms=delay_levels_ms, warnings=plan.warnings,
                                       batch_topics=batch_cq_topics(root))
        out: list[Change] = []
        seen: set[str] = set()
        for rel in built:
            staged = stage / rel
            dst = root / rel
            seen.add(rel)
            if dst.is_file() and not dst.is_symlink() and dst.stat().st_size == staged.stat().st_size:
                for off, data in diff_files(dst, staged, CQ_STORE_UNIT_SIZE * 50):
                    out.append(Change("write", rel, offset=off, length=len(data), data=data, group="consumequeue",
                                      why="rebuild"))
            else:
                if dst.exists() or dst.is_symlink():
                    out.append(Change("delete", rel, group="consumequeue", why="rebuild (size)"))
                fd = _open(staged)
                try:
                    pieces = []
                    for a, b in _data_extents(fd, os.fstat(fd).st_size):
                        data = _pread_all(fd, b - a, a)
                        stripped = data.rstrip(b"\0")
                        if stripped:
                            pieces.append((a, stripped))
                finally:
                    os.close(fd)
                out.append(Change("create", rel, size=staged.stat().st_size, pieces=pieces, group="consumequeue",
                                  why="rebuild"))
        for ref in discover_queues(root):
            files, _ = list_mapped_files(ref.path)
            for f in files:
                rel = f"{STORE_CONSUMEQUEUE_DIR}/{ref.topic}/{ref.queue_id}/{file_name(f.start)}"
                if rel not in seen:
                    out.append(Change("delete", rel, group="consumequeue", why="rebuild: no such entries"))
        return out
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def dispatch_targets(rec) -> list[tuple[str, int, int]]:
    """The queues the broker's dispatcher puts a record in: (topic, queue id, queue offset) of its own
    queue, then each LMQ multi-dispatch target (``INNER_MULTI_DISPATCH``)."""
    out = [(rec.topic, rec.queue_id, rec.queue_offset)]
    if b"INNER_MULTI_DISPATCH" in rec.properties_raw:
        out += multi_dispatch_targets(rec.properties, rec.queue_id)
    return out


def rebuild_consume_queues(cl, out_root: Path, cq_file_size: int, *, end: int | None = None, use_mmap: bool = True,
                           delay_levels_ms=DEFAULT_DELAY_LEVELS_MS, warnings: list[str] | None = None,
                           batch_topics: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Write ``consumequeue/`` for the records in [min offset, end) under ``out_root``; returns relative paths.

    Records of 5.x BatchCQ topics (``batch_topics``, and any inner-batch record) are skipped: the
    broker keeps them in ``batchconsumequeue/``, which is not rebuilt (not supported; a warning says so).
    """
    from rmqdump.codec.record import Message
    from rmqdump.store.consumequeue import ConsumeQueueWriter

    writers: dict[tuple[str, int], ConsumeQueueWriter | None] = {}
    skipped_batch: dict[str, int] = {}
    try:
        for rec in cl.walk(start=cl.min_offset, end=end, check_crc=False, read_body=False, keep_going=True,
                           use_mmap=use_mmap):
            if not isinstance(rec, Message):
                continue
            if rec.sys_flag & TRANSACTION_TYPE_MASK not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
                continue
            if rec.topic in batch_topics or rec.sys_flag & INNER_BATCH_FLAG:
                skipped_batch[rec.topic] = skipped_batch.get(rec.topic, 0) + 1
                continue
            try:
                tags = dispatch_tags_code(rec.topic, rec.properties, rec.store_timestamp, delay_levels_ms)
            except ValueError:
                if warnings is not None:
                    warnings.append(f"record at {rec.offset}: malformed DELAY; not dispatched")
                continue
            for topic, qid, qoff in dispatch_targets(rec):
                key = (topic, qid)
                w = writers.get(key, False)
                if w is False:
                    if not is_safe_component(topic):
                        if warnings is not None:
                            warnings.append(f"topic {topic!r} cannot be a consume-queue directory; skipped")
                        writers[key] = None
                        continue
                    qdir, _ = ensure_store_dir(out_root, STORE_CONSUMEQUEUE_DIR, topic, str(qid))
                    w = writers[key] = ConsumeQueueWriter(qdir, cq_file_size)
                if w is not None:
                    w.put_message_position_info(rec.offset, rec.size, tags, qoff)
        for w in writers.values():
            if w is not None:
                w.fsync()
        if warnings is not None:
            for topic, n in sorted(skipped_batch.items()):
                warnings.append(f"BatchCQ topic {topic!r}: {n} record(s) not rebuilt: rebuilding BatchConsumeQueue "
                                "units (batchconsumequeue/) is not supported; they are left as they are")
    finally:
        for w in writers.values():
            if w is not None:
                w.close()
    out = []
    base = out_root / STORE_CONSUMEQUEUE_DIR
    for p in sorted(base.rglob("*")) if base.is_dir() else []:
        if p.is_file():
            out.append(p.relative_to(out_root).as_posix())
    return out


def rebuild_to(store_path: str | os.PathLike, out_dir: str | os.PathLike, *, cq: bool, index: bool,
               use_mmap: bool = True) -> dict:
    """Regenerate consume queues and/or index files from the commitlog into ``out_dir`` (store untouched)."""
    from rmqdump.broker.recovery import predict_recovery_auto
    from rmqdump.store.root import Store
    from rmqdump.write.appender import store_geometry

    store = Store.open(store_path)
    if store.root is None:
        raise StoreError("rebuild needs a store root", store_path)
    out = Path(out_dir)
    real_store = os.path.realpath(store.root)
    if os.path.realpath(out).startswith(real_store.rstrip("/") + "/") or os.path.realpath(out) == real_store:
        raise StoreError("--to must not be inside the store", out)
    if out.exists() and any(out.iterdir()):
        raise StoreError("--to directory is not empty", out)
    out.mkdir(parents=True, exist_ok=True)
    geo = store_geometry(store.root)
    pred, _ = predict_recovery_auto(store, use_mmap=use_mmap)
    end = pred.max_offset
    doc: dict = {"store": str(store.root), "to": str(out), "end": end, "warnings": []}
    if cq:
        doc["consumequeue_files"] = len(rebuild_consume_queues(store.commitlog, out, geo.cq_file_size, end=end,
                                                               use_mmap=use_mmap, warnings=doc["warnings"],
                                                               batch_topics=batch_cq_topics(store.root)))
    if index:
        idir, _ = ensure_store_dir(out, STORE_INDEX_DIR)
        from rmqdump.store.indexfile import list_index_files

        names = [p.name for p in list_index_files(store.root)]
        made = build_index_files(store.commitlog, idir, geo.index_slots, geo.index_entries,
                                 start=store.commitlog.min_offset, end=end, first_name=names[0] if names else None,
                                 taken_names=set(names), use_mmap=use_mmap)
        doc["index_files"] = [p.name for p in made]
    return doc


def _full_index_end_ts(root: Path, plan: RepairPlan, geo) -> int:
    """endTimestamp of the newest index file that is full after the repair (0 if none)."""
    from rmqdump.store.indexfile import IndexFile, list_index_files

    deleted = {c.path for c in plan.changes if c.op == "delete"}
    best = 0
    for p in list_index_files(root):
        if f"{STORE_INDEX_DIR}/{p.name}" in deleted:
            continue
        try:
            with IndexFile(p, strict=False) as f:
                if f.header.index_count >= f.geometry.index_num:
                    best = max(best, f.header.end_timestamp)
        except (RmqdumpError, AttributeError):
            continue
    return best


def _checkpoint_change(root: Path, cl, end: int, plan: RepairPlan, full_index_ts: int, use_mmap: bool) -> None:
    """Lower checkpoint timestamps that point past the repaired data (never raise them)."""
    from rmqdump.codec.record import Message
    from rmqdump.store.checkpoint import Checkpoint, read_checkpoint

    path = root / STORE_CHECKPOINT_FILE
    try:
        old = read_checkpoint(path)
    except StoreError:
        return
    last_ts = last_cq_ts = 0
    pred = plan.prediction
    start = pred.start_offset if pred is not None and pred.start_offset is not None else cl.min_offset
    for rec in cl.walk(start=start, end=end, check_crc=False, read_body=False, use_mmap=use_mmap):
        if isinstance(rec, Message):
            last_ts = max(last_ts, rec.store_timestamp)
            if rec.sys_flag & TRANSACTION_TYPE_MASK in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
                last_cq_ts = max(last_cq_ts, rec.store_timestamp)
    new = Checkpoint(min(old.physic_msg_timestamp, last_ts) if last_ts else old.physic_msg_timestamp,
                     min(old.logics_msg_timestamp, last_cq_ts) if last_cq_ts else old.logics_msg_timestamp,
                     min(old.index_msg_timestamp, full_index_ts), old.master_flushed_offset, old.confirm_phy_offset)
    if new.fields() == old.fields():
        return
    data = CHECKPOINT.pack(*new.fields())[:old.file_size] if old.file_size < CHECKPOINT.size else \
        CHECKPOINT.pack(*new.fields())
    plan.changes.append(Change("write", STORE_CHECKPOINT_FILE, offset=0, length=len(data), data=data,
                               group="checkpoint", why="timestamps past the repaired data"))
    plan.step("checkpoint", "fix", before=old.as_dict(iso=False), after=new.as_dict(iso=False))


# --- backup, apply, undo ---------------------------------------------------------------------------------


def _safe_target(root: Path, rel: str) -> Path:
    """``root/rel`` with every existing directory component a real directory inside the store (no
    symlinks); missing components are named, not created (the file may not exist yet)."""
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise StoreError(f"refusing path {rel!r}", root)
    d, _ = ensure_store_dir(root, *parts[:-1], create=False)
    target = d / parts[-1]
    if target.is_symlink():
        raise StoreError("is a symlink; refusing to follow it out of the store", target)
    return target


def default_backup_dir(root: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = root.parent / f"{root.name}.rmqdump-backup-{stamp}"
    p, n = base, 1
    while p.exists():
        n += 1
        p = Path(f"{base}-{n}")
    return p


def _write_manifest(backup: Path, doc: dict) -> None:
    tmp = backup / (MANIFEST + ".tmp")
    data = json.dumps(doc, indent=1, ensure_ascii=False).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | _O_CLOEXEC, 0o644)
    try:
        _pwrite_all(fd, data, 0)
        fsync_fd(fd, tmp)
    finally:
        os.close(fd)
    os.replace(tmp, backup / MANIFEST)
    fsync_dir(backup)


def _missing_dirs(root: Path, rel_file: str) -> list[str]:
    """The directories (relative, outermost first) that must be created to hold ``root/rel_file``."""
    parts = rel_file.split("/")[:-1]
    out = []
    for i in range(1, len(parts) + 1):
        rel = "/".join(parts[:i])
        if out or not os.path.lexists(root / rel):
            out.append(rel)
    return out


def _backup_changes(root: Path, plan: RepairPlan, backup: Path) -> list[dict]:
    """Copy what each change will overwrite or remove into ``backup/blobs`` (fsynced); name every
    directory a create will make (each once, in the first item that needs it) so undo removes it."""
    blobs = backup / "blobs"
    blobs.mkdir(parents=True)
    items = []
    planned_dirs: set[str] = set()
    for n, c in enumerate(plan.changes, 1):
        target = _safe_target(root, c.path)
        item: dict = {"op": c.op, "path": c.path, "why": c.why, "group": c.group}
        if c.op == "write":
            size = target.stat().st_size
            if c.offset + c.length > size:
                raise StoreError(f"write [{c.offset}, {c.offset + c.length}) past the end of a {size}-byte file",
                                 target)
            blob = blobs / f"{n:06d}.bin"
            fd = _open(target)
            try:
                old = _pread_all(fd, c.length, c.offset)
            finally:
                os.close(fd)
            _write_blob(blob, old)
            new = c.data if c.data is not None else bytes(c.length)
            item.update(offset=c.offset, length=c.length, backup=blob.name,
                        sha256_before=hashlib.sha256(old).hexdigest(), sha256_after=hashlib.sha256(new).hexdigest())
        elif c.op == "delete":
            st = os.stat(target, follow_symlinks=False)
            fd = _open(target)
            try:
                size = st.st_size
                has_data = next(_nonzero_chunks(fd, size), None) is not None
            finally:
                os.close(fd)
            item.update(size=size, mode=stat.S_IMODE(st.st_mode), sha256_before=sha256_file(target))
            if has_data:
                blob = blobs / f"{n:06d}.bin"
                bfd = os.open(blob, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
                try:
                    os.ftruncate(bfd, size)
                    _copy_extents(target, bfd)
                    fsync_fd(bfd, blob)
                finally:
                    os.close(bfd)
                item["backup"] = blob.name
            else:
                item["zero_filled"] = True
        elif c.op == "create":
            replaces = any(o.op == "delete" and o.path == c.path for o in plan.changes[:n - 1])
            if (target.exists() or target.is_symlink()) and not replaces:
                raise StoreError("file to create already exists", target)
            if replaces:
                item["replaces"] = True
            missing = [d for d in _missing_dirs(root, c.path) if d not in planned_dirs]
            planned_dirs.update(missing)
            item.update(size=c.size, created_dirs=missing)
        items.append(item)
    fsync_dir(blobs)
    return items


def _write_blob(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_CLOEXEC, 0o644)
    try:
        _pwrite_all(fd, data, 0)
        fsync_fd(fd, path)
    finally:
        os.close(fd)


def _apply_change(root: Path, c: Change, item: dict, synced_dirs: set[Path]) -> None:
    if c.op == "create":  # parents first: the target is computed in the directories that now exist
        parts = c.path.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise StoreError(f"refusing path {c.path!r}", root)
        missing = _missing_dirs(root, c.path)
        _, changed = ensure_store_dir(root, *parts[:-1])
        synced_dirs.update(changed)
        # what was really created (the manifest is rewritten after apply; undo removes these)
        item["created_dirs"] = missing
    target = _safe_target(root, c.path)
    if c.op == "write":
        fd = _open(target, os.O_RDWR)
        try:
            if c.data is not None:
                _pwrite_all(fd, c.data, c.offset)
            else:
                z = bytes(min(_CHUNK, c.length))
                done = 0
                while done < c.length:
                    n = min(len(z), c.length - done)
                    _pwrite_all(fd, z[:n], c.offset + done)
                    done += n
            fsync_fd(fd, target)
        finally:
            os.close(fd)
    elif c.op == "delete":
        try:
            os.unlink(target)
        except OSError as e:
            raise StoreError(f"cannot delete: {e.strerror}", target) from None
        synced_dirs.add(target.parent)
    elif c.op == "create":
        fd = os.open(target, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | _O_CLOEXEC, 0o644)
        try:
            os.ftruncate(fd, c.size)
            if c.source is not None:
                _copy_extents(c.source, fd)
            for off, data in c.pieces:
                _pwrite_all(fd, data, off)
            fsync_fd(fd, target)
        finally:
            os.close(fd)
        synced_dirs.add(target.parent)
        item["sha256_after"] = sha256_file(target)


def _set_abort(root: Path, content: bytes | None) -> None:
    """Make ``abort`` exist with ``content`` (None: make it absent); fsync file and store root."""
    path = root / STORE_ABORT_FILE
    if content is None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise StoreError(f"cannot remove abort: {e.strerror}", path) from None
    else:
        if path.is_symlink():
            raise StoreError("abort is a symlink; refusing to follow it", path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | _O_CLOEXEC, 0o644)
        try:
            _pwrite_all(fd, content, 0)
            fsync_fd(fd, path)
        finally:
            os.close(fd)
    fsync_dir(root)


def _guard(root: Path) -> None:
    """Hard refusals: a process has the store open, or abort names a live 5.x broker."""
    from rmqdump.write.appender import broker_evidence, read_abort

    evidence = broker_evidence(root, read_abort(root))
    if evidence:
        raise LockError("refusing to write: " + "; ".join(evidence), root)


@dataclass
class ApplyResult:
    backup: Path
    changes: int
    bytes_backed_up: int
    seconds: float


def apply_plan(store_path: str | os.PathLike, *, salvage: str | None = None, rebuild_cq: bool = False,
               rebuild_index: bool = False, backup_dir: str | os.PathLike | None = None, lock_timeout: float = 1.0,
               use_mmap: bool = True, name_clock=None, cq_file_size: int | None = None,
               commitlog_file_size: int | None = None) -> tuple[RepairPlan, ApplyResult | None]:
    """Plan again under the broker's lock, back up, and apply. Returns (plan, result); result is None
    when there was nothing to do."""
    from rmqdump.broker.lock import StoreLock
    from rmqdump.write.appender import ABORT_TAG, read_abort

    t0 = time.perf_counter()
    root = Path(store_path)
    with StoreLock(root, timeout=lock_timeout):
        _guard(root)
        plan = plan_repair(root, salvage=salvage, rebuild_cq=rebuild_cq, rebuild_index=rebuild_index,
                           cq_file_size=cq_file_size, commitlog_file_size=commitlog_file_size,
                           use_mmap=use_mmap, name_clock=name_clock)
        try:
            if plan.blocked:
                raise StoreError(plan.blocked, plan.store)
            if not plan.needs_repair:
                return plan, None
            root = plan.store
            abort = read_abort(root)
            backup = Path(backup_dir) if backup_dir else default_backup_dir(root)
            real_root = os.path.realpath(root).rstrip("/") + "/"
            if os.path.realpath(backup).startswith(real_root):
                raise StoreError("the backup directory must not be inside the store", backup)
            try:
                backup.mkdir(parents=True, exist_ok=False)
            except FileExistsError:
                raise StoreError("backup directory already exists", backup) from None
            manifest = {
                "format": MANIFEST_FORMAT, "store": str(Path(os.path.realpath(root))), "created": time.time(),
                "state": "preparing", "abort_before": None if abort is None else
                base64.b64encode(abort.content).decode(), "plan": plan.to_dict(), "items": [],
            }
            _write_manifest(backup, manifest)
            items = _backup_changes(root, plan, backup)
            manifest["items"] = items
            manifest["state"] = "prepared"
            _write_manifest(backup, manifest)
            fsync_dir(backup.parent)
            # the store may be inconsistent from here on: the broker must run its abnormal recovery
            if abort is None:
                _set_abort(root, ABORT_TAG + f" repair pid={os.getpid()}\n".encode())
            synced: set[Path] = set()
            for group in ("commitlog", "consumequeue", "index", "checkpoint"):
                for c, item in zip(plan.changes, items, strict=True):
                    if c.group == group:
                        _apply_change(root, c, item, synced)
                for d in sorted(synced, key=lambda p: -len(p.parts)):
                    fsync_dir(d)
                synced.clear()
            _set_abort(root, None)
            manifest["state"] = "applied"
            manifest["applied"] = time.time()
            manifest["items"] = items
            _write_manifest(backup, manifest)
            backed = sum(i.get("length", 0) if i["op"] == "write" else (i.get("size", 0) if i.get("backup") else 0)
                         for i in items)
            return plan, ApplyResult(backup, len(items), backed, time.perf_counter() - t0)
        finally:
            plan.cleanup()


def read_manifest(backup: str | os.PathLike) -> dict:
    path = Path(backup) / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError("no manifest.json: not an rmqdump repair backup", backup) from None
    except (OSError, ValueError) as e:
        raise FormatError(f"unreadable manifest: {e}", path) from None
    if doc.get("format") != MANIFEST_FORMAT:
        raise FormatError(f"unknown backup format {doc.get('format')!r}", path)
    return doc


@dataclass
class UndoResult:
    store: Path
    restored: int
    verified: int
    mismatched_before: list[str]


def undo_backup(backup: str | os.PathLike, *, store: str | os.PathLike | None = None, force: bool = False,
                lock_timeout: float = 1.0) -> UndoResult:
    """Restore every byte range and file a repair changed, then verify the sha256s of the result.

    Refuses (unless ``force``) when the store no longer holds what the repair wrote — e.g. a
    broker ran since — because restoring would then destroy newer data.
    """
    from rmqdump.broker.lock import StoreLock
    from rmqdump.write.appender import ABORT_TAG

    backup = Path(backup)
    doc = read_manifest(backup)
    if doc.get("state") not in ("prepared", "applied"):
        raise StoreError(f"backup state is {doc.get('state')!r}; nothing to undo", backup)
    root = Path(store) if store is not None else Path(doc["store"])
    items = doc["items"]
    blobs = backup / "blobs"
    with StoreLock(root, timeout=lock_timeout):
        _guard(root)
        mismatched = []
        applied = doc["state"] == "applied"
        replaced = {it["path"] for it in items if it["op"] == "create" and it.get("replaces")}
        for it in items:
            target = _safe_target(root, it["path"])
            if it["op"] == "write":
                now = sha256_range(target, it["offset"], it["length"]) if target.exists() else None
                if now not in (it["sha256_after"], it["sha256_before"]):
                    mismatched.append(it["path"])
            elif it["op"] == "delete":
                if it["path"] in replaced:
                    continue  # the create that replaced it is checked instead
                if target.exists() and sha256_file(target) != it["sha256_before"]:
                    mismatched.append(it["path"])
            elif it["op"] == "create":
                if target.exists() and applied and it.get("sha256_after") and sha256_file(target) != it["sha256_after"]:
                    mismatched.append(it["path"])
        created_dirs = sorted({d for it in items if it["op"] == "create" for d in it.get("created_dirs", [])},
                              key=lambda d: (-d.count("/"), d))  # deepest first
        ours = {it["path"] for it in items if it["op"] == "create"} | set(created_dirs)
        for d in created_dirs:  # a directory the repair made must hold only what the repair made
            try:
                names = os.listdir(_safe_target(root, d))
            except FileNotFoundError:
                continue
            except NotADirectoryError:
                mismatched.append(d)
                continue
            foreign = [n for n in names if f"{d}/{n}" not in ours]
            if foreign:
                mismatched.append(f"{d}/{foreign[0]}")
        if mismatched and not force:
            raise StoreError("the store changed since the repair (" + ", ".join(mismatched[:5])
                             + "); refusing to overwrite it (--force to restore anyway)", root)
        for it in items:  # the blobs must be intact before anything is touched
            if it.get("backup"):
                blob = blobs / it["backup"]
                if it["op"] == "write" and sha256_file(blob) != it["sha256_before"]:
                    raise StoreError("backup blob does not match its sha256", blob)
                if it["op"] == "delete" and sha256_file(blob) != it["sha256_before"]:
                    raise StoreError("backup blob does not match its sha256", blob)
        _set_abort(root, ABORT_TAG + f" undo pid={os.getpid()}\n".encode())
        synced: set[Path] = set()
        for it in reversed(items):
            target = _safe_target(root, it["path"])
            if it["op"] == "write":
                data = (blobs / it["backup"]).read_bytes()
                fd = _open(target, os.O_RDWR)
                try:
                    _pwrite_all(fd, data, it["offset"])
                    fsync_fd(fd, target)
                finally:
                    os.close(fd)
            elif it["op"] == "delete":
                tmp = target.with_name(target.name + ".rmqdump-undo")
                fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | _O_CLOEXEC,
                             it.get("mode", 0o644))
                try:
                    os.ftruncate(fd, it["size"])
                    if it.get("backup"):
                        _copy_extents(blobs / it["backup"], fd)
                    fsync_fd(fd, tmp)
                finally:
                    os.close(fd)
                os.replace(tmp, target)
                synced.add(target.parent)
            elif it["op"] == "create":
                if target.exists():
                    os.unlink(target)
                    synced.add(target.parent)
        left = []
        for d in created_dirs:  # deepest first, after every file the repair created is gone
            path = _safe_target(root, d)
            try:
                os.rmdir(path)
            except FileNotFoundError:
                continue
            except OSError as e:
                left.append(f"{d} ({e.strerror})")
                continue
            synced.discard(path)
            synced.add(path.parent)
        for d in sorted(synced, key=lambda p: -len(p.parts)):
            if d.exists():
                fsync_dir(d)
        verified = 0
        for it in items:
            target = root / it["path"]
            if it["op"] == "write":
                ok = sha256_range(target, it["offset"], it["length"]) == it["sha256_before"]
            elif it["op"] == "delete":
                ok = target.exists() and sha256_file(target) == it["sha256_before"]
            else:
                ok = it.get("replaces") or not target.exists()  # a replaced file is checked by its delete
            if not ok:
                raise StoreError("restored bytes do not match the backup's sha256", target)
            verified += 1
        if left:
            raise StoreError("cannot remove directories the repair created: " + ", ".join(left[:5])
                             + " (the abort marker stays)", root)
        before = doc.get("abort_before")
        _set_abort(root, None if before is None else base64.b64decode(before))
        doc["state"] = "undone"
        doc["undone"] = time.time()
        _write_manifest(backup, doc)
    return UndoResult(root, len(items), verified, mismatched)


__all__ = ["Change", "RepairPlan", "plan_repair", "apply_plan", "undo_backup", "read_manifest", "rebuild_to",
           "rebuild_consume_queues", "build_index_files", "filler_record", "analyse_tail", "SALVAGE_CHOICES",
           "MIN_FILLER", "ApplyResult", "UndoResult"]
