"""The checks of one valid commitlog record (:class:`RecordChecker`, shared by the pure loop and its
compiled twin): properties, the ``__CRC32#`` record CRC, topic, sysflag, compression header,
queue-offset continuity, transactions, timestamps, hosts and header outliers."""

from __future__ import annotations

import re
from collections.abc import Callable

from rmqdump.analysis.verify.result import QueueRun, SegmentResult, _Emitter
from rmqdump.codec.crc import body_crc, decode_crc_property_value
from rmqdump.codec.layout import (
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    COMPRESSION_TYPE_COMPARATOR,
    CRC32_RESERVED_LEN,
    INNER_BATCH_FLAG,
    RMQ_SYS_TRANS_HALF_TOPIC,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    TRANSACTION_TYPE_MASK,
)
from rmqdump.codec.record import Message
from rmqdump.findings import ERROR, WARNING
from rmqdump.store.commitlog import read_record

# A well-formed properties string: key\x01value pairs joined by \x02 (optional trailing \x02);
# keys hold no \x01/\x02, values no \x02, neither holds NUL (MessageDecoder.string2messageProperties).
_PAIR = rb"[^\x00\x01\x02]+\x01[^\x00\x02]+"
_PROPS_OK = re.compile(rb"(?:" + _PAIR + rb")(?:\x02" + _PAIR + rb")*\x02?").fullmatch
_CRC_KEY = b"__CRC32#\x01"
_HALF = RMQ_SYS_TRANS_HALF_TOPIC.encode()
_INNER_NUM = b"INNER_NUM\x01"
_KNOWN_SYSFLAG_BITS = 0x7FF
# plausible epoch-ms range for born/store timestamps: 2000-01-01 .. 2100-01-01
_TS_MIN, _TS_MAX = 946684800000, 4102444800000
_HOUR_MS = 3_600_000


def _escape(b: bytes, limit: int = 60) -> str:
    s = b[:limit].decode("utf-8", "backslashreplace")
    s = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 256 else c for c in s)
    return s + ("…" if len(b) > limit else "")


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
