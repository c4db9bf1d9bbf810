"""The commitlog tail after the broker's recovery end: what lies there, and how damage is
neutralised (ROLLBACK fillers, tombstones in a queue's slot, a CRC rewrite, a cut file's length)."""

from __future__ import annotations

from dataclasses import dataclass

from rmqdump.broker.systopics import LMQ_PREFIX
from rmqdump.codec.encoder import FILLER_BODY_PREFIX, FILLER_TOPIC
from rmqdump.codec.layout import (
    END_FILE_MIN_BLANK_LENGTH,
    INT32,
    MESSAGE_BODY_CRC_POSITION,
    PROPERTY_INNER_MULTI_DISPATCH,
    PROPERTY_INNER_MULTI_QUEUE_OFFSET,
    STORE_COMMITLOG_DIR,
    TRANSACTION_ROLLBACK_TYPE,
)
from rmqdump.errors import FormatError, RmqdumpError
from rmqdump.write.repair.model import MIN_FILLER


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
        with seg.open(use_mmap=False) as r:
            raw = bytearray(r.read(offset - seg.start, size))
    except (OSError, RmqdumpError):
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
    return (start + MESSAGE_BODY_CRC_POSITION, INT32.pack(crc),
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
