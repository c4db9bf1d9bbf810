"""Record-level verification of one commitlog segment — the reusable (parallelisable) loop.

:func:`verify_segment_pure` walks one segment by TOTALSIZE (``read_body=False``, body CRC checked
inside the decoder), checks every record and returns a :class:`SegmentResult`: findings,
statistics and the little state needed to check continuity across segments
(:func:`merge_segments`). It needs nothing but the segment file, so segments can be
verified in any order, in parallel, or on Spark executors, and merged afterwards.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from rmqdump.codec.crc import body_crc, decode_crc_property_value
from rmqdump.codec.encoder import is_filler
from rmqdump.codec.layout import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    COMPRESSION_TYPE_COMPARATOR,
    CRC32_RESERVED_LEN,
    INNER_BATCH_FLAG,
    MAX_RECORD_SIZE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    RMQ_SYS_TRANS_HALF_TOPIC,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.codec.record import BAD_BLANK, BODY_CRC, END_OF_DATA, Blank, Invalid, Message
from rmqdump.disk.segment import Segment
from rmqdump.findings import ERROR, INFO, WARNING, Finding
from rmqdump.store.commitlog import CommitLog, Skipped, read_record

# A well-formed properties string: key\x01value pairs joined by \x02 (optional trailing \x02);
# keys hold no \x01/\x02, values no \x02, neither holds NUL (MessageDecoder.string2messageProperties).
_PAIR = rb"[^\x00\x01\x02]+\x01[^\x00\x02]+"
_PROPS_OK = re.compile(rb"(?:" + _PAIR + rb")(?:\x02" + _PAIR + rb")*\x02?").fullmatch
_CRC_KEY = b"__CRC32#\x01"
_HALF = RMQ_SYS_TRANS_HALF_TOPIC.encode()
_INNER_NUM = b"INNER_NUM\x01"
_KNOWN_SYSFLAG_BITS = 0x7FF
_MAGICS = (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)
# plausible epoch-ms range for born/store timestamps: 2000-01-01 .. 2100-01-01
_TS_MIN, _TS_MAX = 946684800000, 4102444800000
_HOUR_MS = 3_600_000
_ZERO_CHUNK = 1 << 20
_ZEROS = bytes(_ZERO_CHUNK)


@dataclass
class QueueRun:
    """Queue-offset continuity state of one topic-queue inside one segment."""

    first_queue_offset: int
    first_offset: int
    next_expected: int
    count: int = 1
    alt_expected: int = -1  # next value if the pending anomaly was a single damaged field
    pending: tuple | None = None  # (offset, file_pos, expected, got)


@dataclass
class SegmentResult:
    """Findings and statistics of one verified segment."""

    segment: str
    file: str
    start: int
    size: int
    findings: list[Finding] = field(default_factory=list)
    records: int = 0
    blanks: int = 0
    record_bytes: int = 0
    end_offset: int = 0  # end of the last valid record (or of the BLANK: the segment end)
    tail: str = "zeros"  # blank | zeros | full | damage | empty | garbage
    stop_offset: int | None = None
    stop_kind: str | None = None
    damaged: list[tuple[int, int, str]] = field(default_factory=list)
    first_damage: int | None = None
    intact_after_damage: int = 0
    intact_after_damage_offsets: list[int] = field(default_factory=list)
    topics: Counter = field(default_factory=Counter)
    min_store_timestamp: int | None = None
    max_store_timestamp: int | None = None
    first_record_store_timestamp: int | None = None
    last_record_offset: int | None = None
    blank_offset: int | None = None
    queues: dict[bytes, dict[int, QueueRun]] = field(default_factory=dict)
    half_offsets: set[int] = field(default_factory=set)
    tx_refs: list[tuple[int, int, int, int]] = field(default_factory=list)  # offset, file_pos, prepared, type
    #: compiled path, clean segments only: what the broker's recovery walk of this file would see
    #: (:func:`rmqdump.analysis.verify.fast.broker_walk_fast` reuses it instead of walking again)
    walk_summary: tuple | None = None

    def stats(self) -> dict:
        return {
            "segment": self.segment, "start": self.start, "size": self.size, "records": self.records,
            "blanks": self.blanks, "record_bytes": self.record_bytes, "end_offset": self.end_offset,
            "tail": self.tail, "damaged_ranges": len(self.damaged), "first_damage": self.first_damage,
            "intact_after_damage": self.intact_after_damage,
            "min_store_timestamp": self.min_store_timestamp, "max_store_timestamp": self.max_store_timestamp,
        }


class _Emitter:
    """Appends findings for one segment, capping each kind."""

    def __init__(self, res: SegmentResult, cap: int):
        self.res, self.cap, self.counts = res, cap, Counter()

    def __call__(self, severity: str, kind: str, offset: int | None, detail: str, file: str | None = None) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= self.cap:
            self.res.findings.append(Finding(severity, kind, file or self.res.file, offset, detail))

    def suppressed(self, label: str) -> None:
        """One ``findings_suppressed`` finding per kind that went over the cap."""
        for kind, c in self.counts.items():
            if c > self.cap:
                self.res.findings.append(Finding(INFO, "findings_suppressed", label, None,
                                                 f"{c - self.cap} more {kind} findings in this segment not listed"))


def _escape(b: bytes, limit: int = 60) -> str:
    s = b[:limit].decode("utf-8", "backslashreplace")
    s = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else c for c in s)
    return s + ("…" if len(b) > limit else "")


def verify_segment_pure(segment: Segment, *, file_size: int | None = None, check_crc: bool = True,
                        keep_going: bool = True, max_record_size: int = MAX_RECORD_SIZE, use_mmap: bool = True,
                        file_label: str | None = None, on_message: Callable[[Message], None] | None = None,
                        progress: Callable[[int], None] | None = None, list_limit: int = 10000,
                        max_findings_per_kind: int = 1000, zero_start: bool = False) -> SegmentResult:
    """Verify every record of one segment (see the package docstring for the finding kinds).

    ``keep_going`` resynchronises past damage (as ``scan --keep-going``) and counts the
    intact records after it; without it the loop ends at the first damage of the segment.
    ``on_message`` is called for every valid record (store-level cross checks);
    ``progress`` with the segment position every 1024 records. ``zero_start``: this is the
    first segment of a store whose commitlog starts at offset 0, so every queue starts at 0.
    The pure-Python reference; :func:`rmqdump.analysis.verify.segment.verify_segment` picks this or
    its compiled twin.
    """
    label = file_label or str(segment.path)
    res = SegmentResult(segment.name, label, segment.start, segment.size, end_offset=segment.start)
    emit = _Emitter(res, max_findings_per_kind)
    cl = CommitLog([segment], file_size or segment.size, segment.path.parent, [])
    walk = cl.walk(check_crc=check_crc, read_body=False, keep_going=keep_going, use_mmap=use_mmap,
                   max_record_size=max_record_size)
    reader = segment.open(use_mmap)
    chk = RecordChecker(res, emit, reader, zero_start, on_message)
    check = chk.message
    n = 0
    damaged = False
    try:
        for rec in walk:
            if type(rec) is Message:
                n += 1
                if damaged:
                    res.intact_after_damage += 1
                    if len(res.intact_after_damage_offsets) < list_limit:
                        res.intact_after_damage_offsets.append(rec.offset)
                check(rec)
                if progress is not None and n & 1023 == 0:
                    progress(rec.offset - segment.start)
            elif type(rec) is Blank:
                res.blanks += 1
                res.blank_offset = rec.offset
            elif isinstance(rec, Skipped):
                damaged = True
                _damage(emit, res, reader, rec.start, rec.end, rec.reason, followed=True)
                if rec.reason.kind == BODY_CRC:
                    _track_damaged_record(reader, rec.start - segment.start, res.queues, max_record_size,
                                          zero_start)
    finally:
        res.records = n
        res.min_store_timestamp, res.max_store_timestamp = chk.min_ts, chk.max_ts
        chk.flush_queues()
        res.end_offset = max(res.end_offset, walk.end_offset)
        try:
            _finish_tail(emit, res, reader, walk.stop, keep_going)
        finally:
            reader.close()
    if progress is not None:
        progress(segment.size)
    emit.suppressed(label)
    return res


def _fast_wanted(nbytes: int) -> bool:
    from rmqdump.fast import walk as fastwalk

    return fastwalk.use_fast(nbytes)


class RecordChecker:
    """The checks of one valid record and the cross-record state they need (one segment).

    :meth:`message` is the whole per-record step of :func:`verify_segment`; the compiled path
    (:mod:`rmqdump.analysis.verify.fast`) calls it for exactly the records its kernel cannot clear.
    """

    def __init__(self, res: SegmentResult, emit: _Emitter, reader, zero_start: bool,
                 on_message: Callable[[Message], None] | None = None):
        self.res, self.emit, self.reader = res, emit, reader
        self.zero_start = zero_start
        self.on_message = on_message
        self.min_ts: int | None = None
        self.max_ts: int | None = None
        self.cand: tuple | None = None
        self.prev_addr: bytes | None = None
        self.prev_port: int | None = None
        self.prev_ts = 0

    def message(self, rec: Message) -> None:
        """Check one valid record (in walk order) and update the state."""
        res = self.res
        emit = self.emit
        queues = res.queues
        off = rec.offset
        if rec.physical_offset != off:
            emit(ERROR, "physical_offset_mismatch", off,
                 f"PHYSICALOFFSET field {rec.physical_offset} differs from the record's position {off} "
                 "(the broker accepts it and copies the wrong value into the CQ and index)")
        topic_raw = rec.topic_raw
        raw = rec.properties_raw
        if raw and _PROPS_OK(raw) is None:
            _bad_properties(emit, rec, raw)
        elif not raw.isascii():
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                emit(WARNING, "properties_encoding", off,
                     f"properties are not valid UTF-8 at byte {e.start} (Java replaces them with U+FFFD)")
        if _CRC_KEY in raw:
            _record_crc(emit, self.reader, rec)
        if not topic_raw or b"\x00" in topic_raw or b"/" in topic_raw:
            emit(ERROR, "bad_topic", off, f"topic {_escape(topic_raw)!r} is empty or holds NUL or '/'")
        sf = rec.sys_flag
        if sf & ~_KNOWN_SYSFLAG_BITS:
            emit(WARNING, "sysflag_unknown_bits", off, f"SYSFLAG 0x{sf & 0xFFFFFFFF:X} sets undefined bits")
        if sf & COMPRESSED_FLAG and rec.body_length > 0:
            _compressed_header(emit, self.reader, rec)
        tx = sf & TRANSACTION_TYPE_MASK
        qoff = rec.queue_offset
        if tx == 0 or tx == TRANSACTION_COMMIT_TYPE:
            qd = queues.get(topic_raw)
            if qd is None:
                qd = queues[topic_raw] = {}
            qid = rec.queue_id
            st = qd.get(qid)
            step = 1
            if sf & INNER_BATCH_FLAG and _INNER_NUM in raw:
                step = _inner_num(rec)
            if st is None:
                st = qd[qid] = QueueRun(qoff, off, 0 if self.zero_start else qoff, 0)
            st.count += 1
            if qoff != st.next_expected:
                _queue_anomaly(emit, rec, st, qoff, step)
            elif st.pending is not None:
                _flush_pending(emit, rec.topic, qid, st, jump=True)
                st.next_expected = qoff + step
            else:
                st.next_expected = qoff + step
            if tx == TRANSACTION_COMMIT_TYPE:
                res.tx_refs.append((off, rec.file_pos, rec.prepared_transaction_offset, tx))
            elif rec.prepared_transaction_offset:
                emit(WARNING, "tx_unexpected_prepared_offset", off,
                     f"non-transactional record carries PREPARED TRANSACTION OFFSET "
                     f"{rec.prepared_transaction_offset}")
            if topic_raw == _HALF:
                res.half_offsets.add(off)
        else:
            if qoff != 0:
                emit(WARNING, "tx_queue_offset", off,
                     f"{rec.transaction} record has QUEUEOFFSET {qoff}; the broker writes 0")
            if tx == TRANSACTION_ROLLBACK_TYPE:
                res.tx_refs.append((off, rec.file_pos, rec.prepared_transaction_offset, tx))
            elif tx == TRANSACTION_PREPARED_TYPE:  # 4.x store API: the COMMIT/ROLLBACK points at this record
                res.half_offsets.add(off)
        st_ts = rec.store_timestamp
        if not _TS_MIN <= st_ts <= _TS_MAX or not _TS_MIN <= rec.born_timestamp <= _TS_MAX:
            emit(WARNING, "bad_timestamp", off,
                 f"implausible timestamp (born {rec.born_timestamp}, store {st_ts})")
        else:
            if self.min_ts is None or st_ts < self.min_ts:
                self.min_ts = st_ts
            if self.max_ts is None or st_ts > self.max_ts:
                self.max_ts = st_ts
        if not 0 <= rec.born_port <= 65535 or not 0 <= rec.store_port <= 65535:
            emit(WARNING, "bad_host", off, f"port out of range (born {rec.born_port}, store {rec.store_port})")
        # header outlier: one record whose store time is far from both neighbours' (the broker stamps
        # STORETIMESTAMP under the put lock, and seeks by time with it). The store host is not checked:
        # neighbouring records legitimately differ (IPv4/IPv6, records of another broker, DLedger).
        s_addr, s_port = rec.store_addr, rec.store_port
        prev_addr, prev_ts = self.prev_addr, self.prev_ts
        if self.cand is not None:
            c_off, c_ts, p_ts = self.cand
            self.cand = None
            if (tx != TRANSACTION_COMMIT_TYPE and abs(st_ts - p_ts) < _HOUR_MS
                    and abs(c_ts - p_ts) >= _HOUR_MS and abs(c_ts - st_ts) >= _HOUR_MS):
                emit(WARNING, "header_outlier", c_off,
                     f"store time {c_ts} is far from both neighbours ({p_ts}, {st_ts}): damaged "
                     "STORETIMESTAMP field")
        if prev_addr is not None and tx != TRANSACTION_COMMIT_TYPE and abs(st_ts - prev_ts) >= _HOUR_MS:
            self.cand = (off, st_ts, prev_ts)
        self.prev_addr, self.prev_port = s_addr, s_port
        if tx != TRANSACTION_COMMIT_TYPE:
            self.prev_ts = st_ts
        if rec.body_length <= 0 and rec.body_crc != 0:
            emit(WARNING, "empty_body_crc", off,
                 f"empty body but BODYCRC {rec.body_crc} (the CRC of nothing is 0; not checked by the broker)")
        if rec.queue_id < 0 or rec.reconsume_times < 0:
            emit(WARNING, "bad_field", off,
                 f"negative QUEUEID {rec.queue_id} or RECONSUMETIMES {rec.reconsume_times}")
        if res.first_record_store_timestamp is None and rec.file_pos == 0:
            res.first_record_store_timestamp = st_ts
        res.topics[topic_raw] += 1
        res.record_bytes += rec.size
        res.last_record_offset = off
        if self.on_message is not None:
            self.on_message(rec)

    def flush_queues(self) -> None:
        """End of the segment: report every still-pending queue anomaly."""
        for qd in self.res.queues.values():
            for qid, st in qd.items():
                if st.pending is not None:
                    _flush_pending(self.emit, None, qid, st, jump=True)


def _track_damaged_record(reader, pos: int, queues: dict, max_record_size: int, zero_start: bool) -> None:
    """A record whose only fault is its body: keep its queue offset in the continuity state."""
    rec = read_record(reader, pos, check_crc=False, read_body=False, max_record_size=max_record_size)
    if type(rec) is not Message or rec.sys_flag & TRANSACTION_TYPE_MASK not in (0, TRANSACTION_COMMIT_TYPE):
        return
    qd = queues.setdefault(rec.topic_raw, {})
    st = qd.get(rec.queue_id)
    if st is None:
        if not zero_start or rec.queue_offset == 0:
            qd[rec.queue_id] = QueueRun(rec.queue_offset, rec.offset, rec.queue_offset + 1)
    elif st.pending is None and rec.queue_offset == st.next_expected:
        st.next_expected += 1
        st.count += 1


def _compressed_header(emit, reader, rec: Message) -> None:
    """A COMPRESSED body must start like its codec's stream (the broker never looks)."""
    sf = rec.sys_flag
    ctype = (sf & COMPRESSION_TYPE_COMPARATOR) >> 8
    pos = rec.file_pos + 72 + (20 if sf & BORNHOST_V6_FLAG else 8) + (20 if sf & STOREHOSTADDRESS_V6_FLAG else 8)
    buf, i, avail = reader.view(pos, 4)
    head = bytes(memoryview(buf)[i:i + avail])
    if ctype in (0, 3):
        ok = len(head) >= 2 and head[0] & 0x0F == 8 and head[0] >> 4 <= 7 and (head[0] << 8 | head[1]) % 31 == 0
        codec = "zlib"
    elif ctype == 1:
        ok, codec = head == b"\x04\x22\x4d\x18", "LZ4 frame"
    elif ctype == 2:
        ok, codec = head == b"\x28\xb5\x2f\xfd", "zstd frame"
    else:
        emit(WARNING, "bad_compression", rec.offset, f"compression type {ctype} is undefined (values 4-7 make the "
                                                     "client's CompressionType.findByValue throw)")
        return
    if not ok:
        emit(WARNING, "bad_compression", rec.offset,
             f"COMPRESSED body does not start with a {codec} header ({head.hex()}): consumers cannot decompress it")


def _inner_num(rec: Message) -> int:
    try:
        v = int(rec.properties.get("INNER_NUM", "1"))
    except ValueError:
        return 1
    return v if v > 0 else 1


def _bad_properties(emit, rec: Message, raw: bytes) -> None:
    off = rec.offset
    if b"\x00" in raw:
        tail = len(raw) - len(raw.rstrip(b"\x00"))
        if tail >= 4 and tail == len(raw) - raw.index(b"\x00"):
            emit(ERROR, "torn_properties", off,
                 f"the last {tail} of {len(raw)} property bytes are zero: torn write; the body CRC does not cover "
                 "properties, so the broker accepts the record with NULs in its properties")
        else:
            emit(ERROR, "properties_nul", off, f"properties hold {raw.count(0)} NUL byte(s) at byte "
                                               f"{raw.index(0)} (not covered by the body CRC)")
        return
    for seg in raw.split(b"\x02"):
        if not seg:
            continue
        i = seg.find(b"\x01")
        if not 0 < i < len(seg) - 1:
            emit(WARNING, "properties_malformed", off,
                 f"property pair {_escape(seg)!r} has no key or no value; the broker silently drops it")
            return
    emit(WARNING, "properties_malformed", off, "empty property pair (consecutive separators)")


def _record_crc(emit, reader, rec: Message) -> None:
    """5.2+ ``__CRC32#`` whole-record CRC: crc32 of the record minus its last 20 bytes."""
    raw = rec.properties_raw
    if not raw.endswith(b"\x02") or raw.rfind(_CRC_KEY) != len(raw) - CRC32_RESERVED_LEN:
        emit(WARNING, "record_crc", rec.offset, "__CRC32# property is not the last 20 property bytes")
        return
    value = raw[-11:-1].decode("ascii", "replace")
    buf, i, avail = reader.view(rec.file_pos, rec.size)
    if avail < rec.size:
        return
    computed = body_crc(memoryview(buf)[i:i + rec.size - CRC32_RESERVED_LEN])
    try:
        stored = decode_crc_property_value(value)
    except ValueError:
        emit(ERROR, "record_crc", rec.offset, f"malformed __CRC32# value {value!r}")
        return
    if stored != computed:
        emit(ERROR, "record_crc", rec.offset, f"record CRC mismatch: stored {stored}, computed {computed}")


def _queue_anomaly(emit, rec: Message, st: QueueRun, qoff: int, step: int) -> None:
    if st.pending is not None:
        if qoff == st.alt_expected:  # the pending record was a lone damaged value
            p_off, p_pos, exp, got = st.pending
            emit(ERROR, "queue_offset_outlier", p_off,
                 f"{rec.topic}/{rec.queue_id}: QUEUEOFFSET {got} breaks the sequence (expected {exp}, which "
                 f"resumes right after): the field is damaged and its CQ entry lands elsewhere")
            st.pending = None
            st.next_expected = qoff + step
            return
        _flush_pending(emit, rec.topic, rec.queue_id, st, jump=True)
    st.pending = (rec.offset, rec.file_pos, st.next_expected, qoff)
    st.alt_expected = st.next_expected + step
    st.next_expected = qoff + step


def _flush_pending(emit, topic: str | None, qid: int, st: QueueRun, jump: bool) -> None:
    p_off, _, exp, got = st.pending
    st.pending = None
    st.alt_expected = -1
    where = f"{topic}/{qid}" if topic else f"queue {qid}"
    if got > exp and exp == 0 and st.count <= 2:
        emit(WARNING, "queue_offset_gap", p_off, f"{where}: the queue starts at QUEUEOFFSET {got}, but the commitlog "
                                                  f"starts at 0: offsets 0..{got - 1} are missing")
    elif got > exp:
        emit(WARNING, "queue_offset_gap", p_off, f"{where}: QUEUEOFFSET jumps from {exp - 1} to {got} "
                                                  f"({got - exp} offsets missing)")
    else:
        emit(ERROR, "queue_offset_regression", p_off,
             f"{where}: QUEUEOFFSET {got} repeats or goes back (expected {exp}): two records claim one CQ slot")


def _damage(emit, res: SegmentResult, reader, start: int, end: int, reason: Invalid, followed: bool) -> None:
    """One damaged byte range [start, end) (``followed``: intact records come after it)."""
    if res.first_damage is None:
        res.first_damage = start
    kind = reason.kind
    detail = reason.detail
    if kind == END_OF_DATA:
        kind = "zeroed_range"
        detail = "zero bytes where a record must start"
    torn = _torn(reader, res.start, start, reason)
    if torn and not followed:
        kind, detail = "torn_record", torn + f"; decoder: {reason.detail}"
    elif torn:
        detail += "; " + torn
    if followed:
        detail += f"; {end - start} bytes skipped to the next intact record at {end}"
    emit(ERROR, kind, start, detail)
    res.damaged.append((start, end, kind))


def _torn(reader, seg_start: int, offset: int, reason: Invalid) -> str | None:
    """Describe a record with a sane header whose tail is zero-filled (an incomplete write)."""
    pos = offset - seg_start
    buf, i, avail = reader.view(pos, 36)
    if avail < 36:
        return None
    mv = bytes(memoryview(buf)[i:i + 36])  # a copy: the next read may reuse a pread window
    total = int.from_bytes(mv[0:4], "big", signed=True)
    magic = int.from_bytes(mv[4:8], "big")
    if magic not in _MAGICS or total < 36 or pos + total > reader.size:
        return None
    rec = reader.read(pos, total)
    stripped = len(rec.rstrip(b"\x00"))
    zeros = total - stripped
    if zeros < 16:
        return None
    qid = int.from_bytes(mv[12:16], "big", signed=True)
    qoff = int.from_bytes(mv[20:28], "big", signed=True)
    return (f"header intact (TOTALSIZE {total}, QUEUEID {qid}, QUEUEOFFSET {qoff}) but bytes "
            f"[{offset + stripped}, {offset + total}) are zero: an incomplete write")


def _first_nonzero(reader, pos: int) -> int | None:
    """Segment position of the first non-zero byte at or after ``pos`` (None: all zero)."""
    size = reader.size
    while pos < size:
        n = min(_ZERO_CHUNK, size - pos)
        buf, i, avail = reader.view(pos, n)
        if avail <= 0:
            return None
        chunk = memoryview(buf)[i:i + avail]
        if chunk != _ZEROS[:avail]:
            b = bytes(chunk)
            return pos + (avail - len(b.lstrip(b"\x00")))
        pos += avail
    return None


def _finish_tail(emit, res: SegmentResult, reader, stop: Invalid | None, keep_going: bool) -> None:
    """Classify how the segment ends: BLANK, zero tail, preallocated, full, damage or garbage."""
    seg_end = res.start + res.size
    if stop is None:
        return
    res.stop_offset, res.stop_kind = stop.offset, stop.kind
    if res.blanks and res.end_offset >= seg_end and stop.kind == END_OF_DATA:
        res.tail = "blank"
        nz = _first_nonzero(reader, res.blank_offset - res.start + 8)
        if nz is not None:
            emit(WARNING, "data_after_end", res.start + nz,
                 f"non-zero bytes after the BLANK record at {res.blank_offset}: stale buffer bytes "
                 "(transientStorePoolEnable) or damage; readers skip them")
        return
    if stop.kind == END_OF_DATA:
        if stop.offset >= seg_end:
            res.tail = "full"
            return
        nz = _first_nonzero(reader, stop.offset - res.start)
        if nz is None:
            res.tail = "empty" if stop.offset == res.start else "zeros"
            return
        res.tail = "garbage"
        what = "no intact record found in them" if keep_going else "use --keep-going to look for intact records"
        emit(WARNING, "data_after_end", res.start + nz,
             f"non-zero bytes after the end of valid data at {stop.offset} ({what}): stale slack or lost data")
        return
    res.tail = "damage"
    if stop.kind == BAD_BLANK:
        res.first_damage = stop.offset if res.first_damage is None else res.first_damage
        res.damaged.append((stop.offset, seg_end, BAD_BLANK))
        emit(ERROR, BAD_BLANK, stop.offset, stop.detail + " (4.9 accepts it and jumps to the next file; 5.x "
                                                          "fails if it runs past the end of the file)")
        return
    end = seg_end
    if stop.size > 0:
        end = min(seg_end, stop.offset + stop.size)
    _damage(emit, res, reader, stop.offset, end, stop, followed=False)
    nz = _first_nonzero(reader, end - res.start) if end < seg_end else None
    if nz is not None and keep_going:
        emit(WARNING, "data_after_end", res.start + nz,
             f"non-zero bytes after the damage at {stop.offset} hold no intact record")


def merge_segments(results: list[SegmentResult], file_size: int, zero_start: bool = False) -> list[Finding]:
    """Findings that need neighbouring segments: queue continuity, tails, preallocation.

    ``zero_start``: the commitlog starts at offset 0, so a queue first seen in a later segment
    must start at queue offset 0.
    """
    out: list[Finding] = []
    carried: dict[bytes, dict[int, int]] = {}
    last_data = max((i for i, r in enumerate(results) if r.records or r.blanks or r.tail not in ("empty",)),
                    default=-1)
    for i, r in enumerate(results):
        for topic_raw, qd in r.queues.items():
            cd = carried.setdefault(topic_raw, {})
            for qid, st in qd.items():
                exp = cd.get(qid)
                if exp is None and zero_start and i > 0:
                    exp = 0
                if exp is not None and st.first_queue_offset != exp:
                    topic = topic_raw.decode("utf-8", "replace")
                    if st.first_queue_offset > exp:
                        out.append(Finding(WARNING, "queue_offset_gap", r.file, st.first_offset,
                                           f"{topic}/{qid}: QUEUEOFFSET jumps from {exp - 1} to "
                                           f"{st.first_queue_offset} across segments"))
                    else:
                        out.append(Finding(ERROR, "queue_offset_regression", r.file, st.first_offset,
                                           f"{topic}/{qid}: QUEUEOFFSET {st.first_queue_offset} repeats or goes "
                                           f"back (expected {exp}) across segments"))
                cd[qid] = st.next_expected
        if r.tail == "damage":
            carried = {}  # records after unresolved damage were not seen: continuity unknown
            zero_start = False
        if r.tail == "empty":
            if i > last_data:
                out.append(Finding(INFO, "preallocated_segment", r.file, r.start,
                                   "all-zero segment (pre-allocated by AllocateMappedFileService)"))
            else:
                out.append(Finding(ERROR, "empty_segment", r.file, r.start,
                                   "all-zero segment before later data: recovery stops here and deletes later "
                                   "files"))
        elif i < last_data and r.tail in ("zeros", "garbage", "full"):
            what = {"full": "ends exactly at the end of the file without a BLANK record",
                    "zeros": f"ends at {r.stop_offset} with zeros instead of a BLANK record",
                    "garbage": f"ends at {r.stop_offset} without a BLANK record"}[r.tail]
            out.append(Finding(ERROR, "missing_blank", r.file, r.stop_offset if r.tail != "full" else r.start + r.size,
                               f"segment {what}, but later segments hold data: recovery stops here"))
    return out


def check_transactions(results: list[SegmentResult], cache, min_offset: int) -> list[Finding]:
    """COMMIT/ROLLBACK records must point at an existing, earlier half message (``cache``: a RecordCache).

    A half message is a record of RMQ_SYS_TRANS_HALF_TOPIC (the broker's transactions since 4.3) or a
    PREPARED record (the 4.x store API's own transactions: PREPARED, then COMMIT/ROLLBACK in the same
    topic). Nothing in the broker reads PREPARED TRANSACTION OFFSET back (the COMMIT is dispatched and
    consumed regardless), so a pointer at anything else is a ``warning``: a damaged field, not lost data.
    """
    out: list[Finding] = []
    halves: set[int] = set()
    arrays = []
    for r in results:
        if isinstance(r.half_offsets, set):
            halves |= r.half_offsets
        else:  # the compiled path keeps them as a sorted numpy array
            arrays.append(r.half_offsets)
    sorted_halves = None
    if arrays:
        import numpy as np

        sorted_halves = np.unique(np.concatenate(arrays + [np.fromiter(halves, np.int64, len(halves))]))
    for r in results:
        refs = r.tx_refs
        if sorted_halves is not None or not isinstance(refs, list):
            import numpy as np

            refs = np.asarray(refs, dtype=np.int64).reshape(-1, 4)
            if refs.size:
                if sorted_halves is None:
                    sorted_halves = np.fromiter(sorted(halves), np.int64, len(halves))
                prepared = refs[:, 2]
                idx = np.minimum(np.searchsorted(sorted_halves, prepared), max(sorted_halves.size - 1, 0))
                ok = (sorted_halves[idx] == prepared) & (prepared < refs[:, 0]) if sorted_halves.size else \
                    np.zeros(len(refs), dtype=bool)
                refs = refs[~ok]
            refs = [tuple(int(v) for v in row) for row in refs]
        for off, _pos, prepared, tx in refs:
            name = "COMMIT" if tx == TRANSACTION_COMMIT_TYPE else "ROLLBACK"
            if sorted_halves is None and prepared in halves and prepared < off:
                continue
            if prepared < min_offset and prepared >= 0:
                out.append(Finding(INFO, "tx_half_expired", r.file, off,
                                   f"{name} record's half message at {prepared} lies in a deleted commitlog file"))
                continue
            detail = None
            if prepared >= off or prepared < 0:
                detail = f"{name} record points at {prepared}, not an earlier offset"
            else:
                h = cache.decode(prepared)
                if not isinstance(h, Message):
                    detail = f"{name} record points at {prepared}, where there is no valid record ({h.kind})"
                elif h.topic_raw != _HALF and h.sys_flag & TRANSACTION_TYPE_MASK != TRANSACTION_PREPARED_TYPE:
                    detail = (f"{name} record points at {prepared}, a {h.topic!r} record, neither a half "
                              "message nor a PREPARED record")
            if detail and tx != TRANSACTION_COMMIT_TYPE and is_filler(cache.decode(off, check_crc=False)):
                out.append(Finding(INFO, "repair_filler", r.file, off, "ROLLBACK filler record written by rmqdump "
                                   "repair over damaged bytes (they are in the repair's backup)"))
            elif detail:
                # info: RocketMQ's 4.x store API writes COMMIT/ROLLBACK records with any offset (0 when none is
                # set; records copied between stores keep theirs) and nothing in the broker reads it back
                out.append(Finding(INFO, "tx_half_missing", r.file, off, detail))
    return out
