"""The recovery walk: from the start file with CRC checks and no size limit, records advance, a BLANK
moves to the next file and anything else stops (``processOffset``); how the broker judges one position;
and a lone commitlog file that was cut short."""

from __future__ import annotations

from dataclasses import dataclass, field

from rmqdump.broker.recovery.inputs import VERSION_49, VERSION_53
from rmqdump.codec.layout import MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2, STORE_COMMITLOG_DIR
from rmqdump.codec.record import BAD_BLANK, BAD_MAGIC, END_OF_DATA, TRUNCATED, Blank, Invalid, Message
from rmqdump.disk.segment import Segment
from rmqdump.errors import RmqdumpError
from rmqdump.store.commitlog import CommitLog, read_record
from rmqdump.store.root import Store

#: the broker itself imposes no record-size limit during recovery (4.9.8 allocates byte[TOTALSIZE])
BROKER_MAX_RECORD_SIZE = (1 << 31) - 1


@dataclass
class BrokerWalk:
    """Outcome of the recovery walk: ``process_offset`` is the commitlog end after recovery."""

    start_index: int
    start_offset: int
    process_offset: int
    records: int = 0
    last_record_offset: int | None = None
    last_store_timestamp: int = 0
    stop: Invalid | None = None
    notes: list[str] = field(default_factory=list)

    def halt(self, seg: Segment, pos: int, why: str, size: int = -1) -> BrokerWalk:
        """End the walk at ``pos`` of ``seg`` (the commitlog end after recovery) for one of the
        ``STOP_*`` reasons; returns self."""
        kind = {STOP_V2_ON_49: BAD_MAGIC, STOP_NO_BLANK: TRUNCATED, STOP_LAST_BLANK: END_OF_DATA}[why]
        self.process_offset = seg.start + pos
        self.stop = Invalid(seg.start + pos, seg.name, pos, kind, why, size)
        return self


#: why a recovery walk ends without damage (BrokerWalk.halt)
STOP_V2_ON_49 = "V2 magic 0xDAA320AB is unknown to a 4.x broker (illegal magic code)"
STOP_NO_BLANK = "the file ends right after a record, without a BLANK: the walk stops here"
STOP_LAST_BLANK = "BLANK in the last file"


def ends_at_last_blank(rec: dict) -> bool:
    """Whether a recovery prediction (its document) ends at a last file's BLANK: the walk's records end past
    that offset, yet nothing is cut (RocketMQ's next write covers the BLANK)."""
    stop = rec.get("stop") or {}
    return stop.get("detail") == STOP_LAST_BLANK and stop.get("offset") == rec.get("max_offset")


def broker_verdict(rec: Message | Blank | Invalid, version: str = VERSION_49, blank_overruns: bool = False) -> str:
    """How ``checkMessageAndReturnSize`` judges a decoded position: ``record``, ``blank`` or ``fail``.

    ``blank_overruns``: for a BLANK with a wrong TOTALSIZE, whether that TOTALSIZE runs past
    the end of the file (5.x then fails; 4.9 never looks at a BLANK's size).
    """
    if isinstance(rec, Message):
        if rec.magic == MESSAGE_MAGIC_CODE_V2 and version == VERSION_49:
            return "fail"
        return "record"
    if isinstance(rec, Blank):
        return "blank"
    if rec.kind == BAD_BLANK:
        return "fail" if version == VERSION_53 and blank_overruns else "blank"
    return "fail"


def broker_walk(cl: CommitLog, start_index: int, *, version: str = VERSION_49, check_crc: bool = True,
                use_mmap: bool = True) -> BrokerWalk:
    """Walk from the start file exactly as recovery does (CRC checked, no size limit)."""
    segs = cl.segments
    if not segs:
        return BrokerWalk(0, 0, 0, stop=Invalid(0, "", 0, END_OF_DATA, "no commitlog files"))
    first = segs[start_index]
    w = BrokerWalk(start_index, first.start, first.start)
    index = start_index
    while True:
        seg = segs[index]
        pos = 0
        with seg.open(use_mmap) as r:
            size = r.size
            while True:
                if pos >= size:
                    # a record ended exactly at the end of the file: reading the next size underflows
                    return w.halt(seg, pos, STOP_NO_BLANK)
                rec = read_record(r, pos, check_crc=check_crc, read_body=False,
                                  max_record_size=BROKER_MAX_RECORD_SIZE)
                overruns = False
                if isinstance(rec, Invalid) and rec.kind == BAD_BLANK:
                    buf, i, avail = r.view(pos, 4)
                    overruns = avail == 4 and int.from_bytes(memoryview(buf)[i:i + 4], "big", signed=True) > size - pos
                verdict = broker_verdict(rec, version, overruns)
                if verdict == "record":
                    w.records += 1
                    w.last_record_offset = rec.offset
                    w.last_store_timestamp = rec.store_timestamp
                    pos += rec.size
                    continue
                if verdict == "blank":
                    if isinstance(rec, Invalid):
                        w.notes.append(f"BLANK at {rec.offset} accepted although {rec.detail}")
                    break
                if isinstance(rec, Message):  # V2 magic on a 4.9 broker
                    return w.halt(seg, pos, STOP_V2_ON_49, rec.size)
                w.process_offset = seg.start + pos
                w.stop = rec
                return w
        index += 1
        if index >= len(segs):
            return w.halt(seg, pos, STOP_LAST_BLANK)  # processOffset stays at the BLANK's position


def tail_is_data(seg: Segment) -> bool:
    """Whether a commitlog file's last 8 bytes are data: a broker's file ends in zeros or a BLANK's zeros (the
    evidence :func:`cut_short` starts from; cheap enough to ask before walking)."""
    try:
        with seg.open(use_mmap=False) as r:
            last = r.read(max(0, seg.size - 8), 8)
    except (OSError, RmqdumpError):
        return False
    return bool(last.strip(b"\0")) and last[-4:] != b"\0\0\0\0"


def cut_short(store: Store, walk: BrokerWalk) -> str | None:
    """A store's only commitlog file that ends inside a record (or right after one, without the BLANK the
    broker always leaves): it was cut short, so its length is not the broker's mappedFileSizeCommitLog
    and ``load()`` refuses it ("length not matched message store config value"). None otherwise."""
    cl = store.commitlog
    if store.root is None or len(cl.segments) != 1 or walk.stop is None:
        return None
    seg = cl.segments[0]
    stop = walk.stop
    # evidence of a cut, not of damage: the file's last bytes are data (a broker's file ends in zeros or
    # a BLANK), and the record it stops in has a genuine magic
    if not tail_is_data(seg):
        return None
    try:
        with seg.open(use_mmap=False) as r:
            head = r.read(stop.offset - seg.start, 8)
    except (OSError, RmqdumpError):
        return None
    size = int.from_bytes(head[:4], "big", signed=True) if len(head) == 8 else -1
    magic = int.from_bytes(head[4:8], "big") if len(head) == 8 else 0
    crosses = stop.kind == TRUNCATED and stop.detail != STOP_NO_BLANK and size > 0 and \
        stop.offset + size > seg.end and magic in (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)
    if not crosses and not (stop.detail == STOP_NO_BLANK and walk.process_offset == seg.end):
        return None
    why = (f"a record at {stop.offset} runs {stop.offset + size - seg.end} bytes past its end" if crosses
           else "it ends right after a record, where the broker always leaves a BLANK")
    return (f"{STORE_COMMITLOG_DIR}/{seg.name} is the only commitlog file and {why}: it was cut short, so its "
            f"{seg.size} bytes are not the broker's file size (repair --commitlog-file-size restores it)")
