"""The commitlog: sorted, contiguous segments of one offset space, walked record by record."""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rmqdump.codec.dledger import DLEDGER_BODY_OFFSET
from rmqdump.codec.layout import (
    INT32,
    INT64,
    MAX_RECORD_SIZE,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MIN_RECORD_SIZE_V1_IPV4,
    PHY_POS_POSITION,
    STORE_COMMITLOG_DIR,
    SYSFLAG_POSITION,
)
from rmqdump.codec.record import (
    BODY_CRC,
    END_OF_DATA,
    LENGTH_MISMATCH,
    Blank,
    Invalid,
    Message,
    decode_record,
    record_extent,
)
from rmqdump.disk.segment import MmapReader, Segment, SegmentReader, name_out_of_range, parse_file_name
from rmqdump.errors import StoreError
from rmqdump.findings import ERROR, WARNING, Finding
from rmqdump.store.dledger.files import DLEDGER_ENTRY, is_dledger_segment, read_entry, resync_entry

_MAGICS = (MESSAGE_MAGIC_CODE.to_bytes(4, "big"), MESSAGE_MAGIC_CODE_V2.to_bytes(4, "big"))
_RESYNC_CHUNK = 1 << 20
_HOLE_PROBE_EVERY = _RESYNC_CHUNK  # bytes searched before asking the filesystem for the next data again
_PAGE = 4096  # holes are found page by page (SEEK_DATA rounds to the filesystem's block/page)
#: resync CRC budget: this many bytes, plus RESYNC_CRC_PER_BYTE per byte scanned (see Walk._resync)
RESYNC_CRC_BASE = 64 << 20
RESYNC_CRC_PER_BYTE = 4
_RELEASE_EVERY = 32 << 20


class CommitLog:
    """A commitlog directory (or a single segment file) as an ordered list of segments."""

    def __init__(self, segments: list[Segment], file_size: int, location: Path, problems: list[Finding]):
        self.segments = segments
        self.file_size = file_size
        self.location = location
        self.problems = problems
        #: every commitlog folder read (more than one: a multi-path ``storePathCommitLog``)
        self.paths: list[Path] = [location]

    @classmethod
    def open(cls, path: str | os.PathLike) -> CommitLog:
        """Open a store root, a ``commitlog/`` directory or one segment file."""
        p = Path(path)
        if not p.exists():
            raise StoreError("no such file or directory", p)
        if p.is_file():
            start = parse_file_name(p.name)
            problems = []
            if start is None:
                problems.append(Finding(WARNING, "segment_name", str(p), None,
                                        "file name is not a 20-digit offset; assuming start offset 0"))
                start = 0
            size = p.stat().st_size
            return cls([Segment(p, start, size)], size, p, problems)
        d = p / STORE_COMMITLOG_DIR if (p / STORE_COMMITLOG_DIR).is_dir() else p
        return cls.from_directory(d)

    @classmethod
    def from_directory(cls, d: Path) -> CommitLog:
        return cls.from_directories([d])

    @classmethod
    def from_directories(cls, dirs: list[Path]) -> CommitLog:
        """Segments of one or more folders (``storePathCommitLog="a,b"``: RocketMQ's
        ``MultiPathMappedFileQueue`` lists every folder and loads all their files sorted by name, so a name
        in two folders loads twice)."""
        problems: list[Finding] = []
        segs: list[Segment] = []
        entries: list[os.DirEntry] = []
        for d in dirs:
            try:
                entries += list(os.scandir(d))
            except OSError as e:
                raise StoreError(f"cannot list directory: {e.strerror}", d) from None
        entries.sort(key=lambda e: e.name)
        owner: dict[str, str] = {}
        for e in entries:
            start = parse_file_name(e.name)
            if e.is_dir(follow_symlinks=False):
                continue
            if start is not None and not e.is_file():
                problems.append(Finding(ERROR, "segment_not_regular", str(Path(e.path)), None,
                                        "a 20-digit entry that is not a regular file (FIFO, socket, device or "
                                        "dangling link); not read"))
                continue
            if start is None and name_out_of_range(e.name):
                problems.append(Finding(ERROR, "segment_name", str(Path(e.path)), None,
                                        "20-digit name above Long.MAX_VALUE: the broker cannot parse it "
                                        "(NumberFormatException at load); not read"))
                continue
            if start is None:
                problems.append(Finding(WARNING, "stray_file", str(Path(e.path)), None,
                                        "not a 20-digit segment name; ignored"))
                continue
            if e.name in owner:
                problems.append(Finding(ERROR, "segment_duplicate", str(Path(e.path)), None,
                                        f"{e.name} is also in {owner[e.name]}: two commitlog folders hold the "
                                        "same segment (the broker maps both at one offset); this copy is not read"))
                continue
            owner[e.name] = str(Path(e.path).parent)
            segs.append(Segment(Path(e.path), start, e.stat().st_size))
        if not segs:
            raise StoreError("no commitlog segments (20-digit files) found; is this a RocketMQ store?", dirs[0])
        sizes = Counter(s.size for s in segs if s.size > 0)
        file_size = max(sizes.items(), key=lambda kv: (kv[1], kv[0]))[0] if sizes else 0
        for s in segs:
            if s.size == 0:
                problems.append(Finding(ERROR, "zero_length_segment", str(s.path), None,
                                        "zero-length segment (the 4.9 broker refuses to start)"))
            elif s.size != file_size:
                over = s.size > file_size
                problems.append(Finding(ERROR, "segment_size", str(s.path), None,
                                        f"size {s.size} differs from the store's file size {file_size}"
                                        + (f"; only its first {file_size} bytes are read (the broker refuses to "
                                           "load it)" if over else "")))
        # work follows the store's geometry, not a file's claimed size (a huge sparse file costs nothing)
        segs = [Segment(s.path, s.start, file_size) if file_size and s.size > file_size else s for s in segs]
        for a, b in zip(segs, segs[1:], strict=False):
            if file_size and a.start + file_size != b.start:
                problems.append(Finding(ERROR, "segment_gap", str(b.path), None,
                                        f"expected start {a.start + file_size} after {a.name}, found {b.start}"
                                        + (f" (folders {a.path.parent}, {b.path.parent}; the missing segment is in "
                                           "none of them)" if len(dirs) > 1 else "")))
        for s in segs:
            if file_size and s.start % file_size:
                problems.append(Finding(WARNING, "segment_alignment", str(s.path), None,
                                        f"start offset {s.start} is not a multiple of the file size {file_size}"))
        out = cls(segs, file_size, dirs[0], problems)
        out.paths = list(dirs)
        return out

    @property
    def min_offset(self) -> int:
        return self.segments[0].start

    def segment_for(self, offset: int) -> Segment | None:
        """The segment holding ``offset`` (None if no segment does)."""
        lo, hi = 0, len(self.segments) - 1
        while lo <= hi:
            mid = (lo + hi) // 2
            s = self.segments[mid]
            if offset < s.start:
                hi = mid - 1
            elif offset >= s.start + max(s.size, 1):
                lo = mid + 1
            else:
                return s
        return None

    def decode_at(self, offset: int, *, use_mmap: bool = True, check_crc: bool = True,
                  read_body: bool = True, max_record_size: int = MAX_RECORD_SIZE) -> Message | Blank | Invalid:
        """Decode the one record starting at absolute ``offset``."""
        seg = self.segment_for(offset)
        if seg is None:
            return Invalid(offset, "", 0, END_OF_DATA, f"offset {offset} is outside every commitlog segment")
        with seg.open(use_mmap) as r:
            return read_record(r, offset - seg.start, check_crc=check_crc, read_body=read_body,
                               max_record_size=max_record_size)

    def walk(self, **kwargs) -> Walk:
        """A :class:`Walk` over this commitlog (see its parameters)."""
        return Walk(self, **kwargs)


@dataclass
class Skipped:
    """A damaged byte range stepped over by ``keep_going`` (``reason`` = first invalid verdict)."""

    start: int
    end: int
    file: str
    reason: Invalid


class Walk:
    """Iterate records by TOTALSIZE, as the broker's recovery walks them.

    Yields :class:`Message` and :class:`Blank`; with ``keep_going`` also :class:`Skipped`
    ranges after which a trusted record (valid magic, PHYSICALOFFSET equal to its position,
    matching body CRC) was found. After iteration ``stop`` holds why the walk ended and
    ``end_offset`` the end of the last valid record.
    """

    def __init__(self, commitlog: CommitLog, *, start: int | None = None, end: int | None = None,
                 check_crc: bool = True, read_body: bool = True, keep_going: bool = False,
                 use_mmap: bool = True, max_record_size: int = MAX_RECORD_SIZE):
        self.cl = commitlog
        self.start = commitlog.min_offset if start is None else start
        self.end = end
        self.check_crc = check_crc
        self.read_body = read_body
        self.keep_going = keep_going
        self.use_mmap = use_mmap
        self.max_record_size = max_record_size
        self.stop: Invalid | None = None
        self.end_offset = self.start
        self.records = 0
        self.bytes_done = 0  # segment bytes consumed so far (for progress)
        self.resync_gave_up = 0  # bytes CRC-checked by the last resync that ran out of budget (0: it did not)

    def __iter__(self) -> Iterator[Message | Blank | Skipped]:
        segs = [s for s in self.cl.segments if s.start + s.size > self.start]
        if not segs:
            self.stop = Invalid(self.start, "", 0, END_OF_DATA, f"offset {self.start} is past the end of the commitlog")
            return
        self._pending: Invalid | None = None
        self._pending_end = 0
        for seg in segs:
            pos = max(0, self.start - seg.start)
            reader = seg.open(self.use_mmap)
            walk_one = self._walk_entries if is_dledger_segment(seg) else self._walk_segment
            try:
                done = yield from walk_one(seg, reader, pos)
            finally:
                reader.close()
            self.bytes_done += seg.size
            if done:
                return
        last = segs[-1]
        self.stop = self._pending or Invalid(last.end, last.name, last.size, END_OF_DATA,
                                             "end of the last commitlog segment")

    def _walk_segment(self, seg: Segment, r: SegmentReader, pos: int):
        """Walk one segment; return True when the whole walk is over."""
        next_release = pos + _RELEASE_EVERY
        while True:
            if pos >= next_release:  # keep RSS bounded on big mapped segments
                r.release(pos - (1 << 20))
                next_release = pos + _RELEASE_EVERY
            if self.end is not None and seg.start + pos >= self.end:
                self.stop = Invalid(seg.start + pos, seg.name, pos, END_OF_DATA, f"reached --to-offset {self.end}")
                return True
            if pos >= r.size:
                return False  # a record ended exactly at the end of the file: next segment
            rec = read_record(r, pos, check_crc=self.check_crc, read_body=self.read_body,
                              max_record_size=self.max_record_size)
            if isinstance(rec, Message):
                if self._pending is not None:  # damage ran to the end of an earlier file
                    p = self._pending
                    self._pending = None
                    yield Skipped(p.offset, self._pending_end, p.file, p)
                self.records += 1
                pos += rec.size
                self.end_offset = seg.start + pos
                yield rec
                continue
            if isinstance(rec, Blank):
                self.end_offset = seg.start + seg.size
                yield rec
                return False
            if not self.keep_going:
                self.stop = rec
                return True
            nxt = self._resync(seg, r, pos + 1)
            if nxt is None:
                rec = self.with_give_up(rec)
                if self._pending is None:
                    self._pending, self._pending_end = rec, seg.end
                return False  # nothing trusted in the rest of this file: try the next one
            self._pending = None
            yield Skipped(seg.start + pos, seg.start + nxt, seg.name, rec)
            pos = nxt

    def _walk_entries(self, seg: Segment, r: SegmentReader, pos: int):
        """Walk one DLedger data file entry by entry (store/dledger): each entry's record is decoded at the
        entry + 48, inside the entry's body. A damaged record in a sound entry is a :class:`Skipped` range
        and the walk goes on (RocketMQ's reput does); a header DLedger's recovery refuses ends the walk (or,
        with ``keep_going``, is stepped over to the next sound header). Return True when the walk is over."""
        if pos and isinstance(read_entry(r, pos), Invalid) and pos >= DLEDGER_BODY_OFFSET \
                and not isinstance(read_entry(r, pos - DLEDGER_BODY_OFFSET), Invalid):
            pos -= DLEDGER_BODY_OFFSET  # --from-offset names a record: start at its entry
        last: tuple[int, int] | None = None  # (index, term) of the previous entry of this file
        next_release = pos + _RELEASE_EVERY
        while True:
            if pos >= next_release:
                r.release(pos - (1 << 20))
                next_release = pos + _RELEASE_EVERY
            if self.end is not None and seg.start + pos + DLEDGER_BODY_OFFSET >= self.end:  # its record's offset
                self.stop = Invalid(seg.start + pos, seg.name, pos, END_OF_DATA, f"reached --to-offset {self.end}")
                return True
            if pos >= r.size:
                return False
            ent = read_entry(r, pos)
            if isinstance(ent, Blank):
                self.end_offset = seg.start + seg.size
                yield ent
                return False
            if not isinstance(ent, Invalid) and last is not None and (ent.index != last[0] + 1 or ent.term < last[1]):
                ent = Invalid(seg.start + pos, seg.name, pos, DLEDGER_ENTRY,
                              f"entry index {ent.index} term {ent.term} after index {last[0]} term {last[1]} "
                              "(DLedger's recovery needs index + 1 and a term that does not go back)")
            if isinstance(ent, Invalid):
                if not self.keep_going:
                    self.stop = ent
                    return True
                nxt = resync_entry(r, pos + 1)
                if nxt is None:
                    if self._pending is None:
                        self._pending, self._pending_end = ent, seg.end
                    return False
                self._pending = None
                last = None
                yield Skipped(seg.start + pos, seg.start + nxt, seg.name, ent)
                pos = nxt
                continue
            last = (ent.index, ent.term)
            rec = read_record(r, pos + DLEDGER_BODY_OFFSET, check_crc=self.check_crc, read_body=self.read_body,
                              max_record_size=self.max_record_size, limit=ent.body_length)
            if isinstance(rec, Message) and rec.size == ent.body_length:
                self.records += 1
                self.end_offset = seg.start + pos + ent.size
                pos += ent.size
                yield rec
                continue
            if not isinstance(rec, Invalid):
                rec = Invalid(seg.start + pos + DLEDGER_BODY_OFFSET, seg.name, pos + DLEDGER_BODY_OFFSET,
                              LENGTH_MISMATCH, f"the entry body ({ent.body_length} bytes) holds "
                              + (f"a record of TOTALSIZE {rec.size}" if isinstance(rec, Message) else "a BLANK"))
            self.end_offset = seg.start + pos + ent.size
            yield Skipped(rec.offset, max(rec.offset, seg.start + pos + ent.size), seg.name, rec)
            pos += ent.size

    def _resync(self, seg: Segment, r: SegmentReader, lo: int) -> int | None:
        """First segment position >= ``lo`` holding a trusted record, or None.

        Bounded work: candidates are CRC-checked against a budget of :data:`RESYNC_CRC_BASE` bytes plus
        :data:`RESYNC_CRC_PER_BYTE` per byte scanned, so overlapping crafted candidates (valid headers,
        wrong CRCs, big bodies) cost time linear in the file, never quadratic. When the budget runs out
        the search gives up (None; :attr:`resync_gave_up` holds the bytes checked).
        """
        self.resync_gave_up = 0
        spent = 0
        damaged_bodies: dict[int, int] = {}  # end -> start of candidates with a sound header but a wrong CRC
        p = lo + 4  # the magic of a record starting at >= lo sits at >= lo + 4
        probe = p
        stop_at = jump = None  # a hole follows: search up to stop_at, then go on at jump (None: no data left)
        while p + 4 <= r.size:
            if p >= probe and stop_at is None:
                # jump over the holes of a sparse file without reading them (SEEK_DATA), asked from the page
                # after p's: on tmpfs an mmap read allocates every page it touches, so p's own page (read by
                # us) always looks like data, and asking from p would read a 4 GiB hole through
                edge = min((p // _PAGE + 1) * _PAGE, r.size)
                nxt = r.next_data(edge) if edge < r.size else None
                if nxt is None or nxt > edge:
                    stop_at, jump = edge, nxt
                probe = edge + _HOLE_PROBE_EVERY
            buf, i, avail = r.view(p, min(_RESYNC_CHUNK, r.size - p) if stop_at is None else stop_at - p)
            if avail < 4 and stop_at is None:
                return None
            cands = []
            for magic in _MAGICS if avail >= 4 else ():
                f = buf.find(magic, i, i + avail)
                while f >= 0:
                    cands.append(p + (f - i) - 4)
                    f = buf.find(magic, f + 1, i + avail)
            for cand in sorted(cands):
                cost = self._candidate_cost(seg, r, cand)
                if cost < 0:
                    continue
                spent += cost
                if spent > RESYNC_CRC_BASE + RESYNC_CRC_PER_BYTE * (cand - lo):
                    self.resync_gave_up = spent
                    return None
                rec = read_record(r, cand, check_crc=True, read_body=False, max_record_size=self.max_record_size)
                if isinstance(rec, Message) and (rec.crc_ok or (rec.body_length <= 0 and rec.body_crc == 0)):
                    # a record whose body alone is damaged (wrong CRC) and that ends exactly where this
                    # trusted one starts is a real record: resume there, so it is reported at its own
                    # offset instead of vanishing into the damaged range before it
                    return damaged_bodies.get(cand, cand)
                if isinstance(rec, Invalid) and rec.kind == BODY_CRC:
                    damaged_bodies.setdefault(cand + cost, cand)
            if stop_at is not None and p + avail >= stop_at:  # p's page is searched: on to the next data
                if jump is None:
                    return None
                p, stop_at = jump, None
                probe = p + _HOLE_PROBE_EVERY
                r.release(p - 8)
                continue
            p += max(1, avail - 3)
        return None

    def with_give_up(self, rec: Invalid) -> Invalid:
        """``rec`` with a note when the last resync ran out of its CRC budget (else ``rec`` itself)."""
        if not self.resync_gave_up:
            return rec
        return Invalid(rec.offset, rec.file, rec.file_pos, rec.kind,
                       f"{rec.detail}; resynchronisation gave up after CRC-checking {self.resync_gave_up} bytes of "
                       "candidate records (crafted or heavily damaged bytes): the rest of this file is one damaged "
                       "range", rec.size)

    def _candidate_cost(self, seg: Segment, r: SegmentReader, cand: int) -> int:
        """Bytes a CRC check of the candidate at ``cand`` would read (its TOTALSIZE), or -1 when its
        header already rules it out (PHYSICALOFFSET not its position, TOTALSIZE out of range)."""
        buf, i, avail = r.view(cand, SYSFLAG_POSITION)
        if avail < SYSFLAG_POSITION or INT64.unpack_from(buf, i + PHY_POS_POSITION)[0] != seg.start + cand:
            return -1
        total = INT32.unpack_from(buf, i)[0]
        if total < MIN_RECORD_SIZE_V1_IPV4 or total > min(self.max_record_size, r.size - cand):
            return -1
        return total


def read_record(r: SegmentReader, pos: int, *, check_crc: bool = True, read_body: bool = True,
                max_record_size: int = MAX_RECORD_SIZE, limit: int | None = None) -> Message | Blank | Invalid:
    """Decode the record at segment position ``pos`` through a reader (two small views); ``limit``: the record
    must end within that many bytes (a DLedger entry's body), else up to the end of the file."""
    seg = r.segment
    to_end = r.size - pos if limit is None else min(limit, r.size - pos)
    if type(r) is MmapReader:  # the whole file is mapped: no windowing needed
        return decode_record(r.mm, pos, max(to_end, 0), pos, seg.start, seg.name, to_end=to_end,
                             check_crc=check_crc, read_body=read_body, max_record_size=max_record_size)
    buf, i, avail = r.view(pos, min(8, max(to_end, 0)))
    need = record_extent(buf, i, avail, to_end, max_record_size)
    if need > avail:
        buf, i, avail = r.view(pos, need)
    return decode_record(buf, i, min(avail, max(to_end, 0)), pos, seg.start, seg.name, to_end=to_end,
                         check_crc=check_crc, read_body=read_body, max_record_size=max_record_size)
