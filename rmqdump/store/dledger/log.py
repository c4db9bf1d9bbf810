"""The commitlog of a DLedger store: ``dledger-<id>/data`` as a :class:`~rmqdump.store.commitlog.CommitLog`
(records at their entry + 48, the offsets ConsumeQueue, IndexFile and offsetMsgId use), the entry headers
walked as DLedger's recovery walks them, and the cross-checks of the index units and text files."""

from __future__ import annotations

from dataclasses import dataclass

from rmqdump.codec.dledger import (
    DLEDGER_INDEX_FILE_SIZE,
    DLEDGER_INDEX_UNIT,
    EntryHeader,
    IndexUnit,
    decode_index_unit,
)
from rmqdump.codec.layout import STORE_COMMITLOG_DIR
from rmqdump.codec.record import END_OF_DATA, Blank, Invalid
from rmqdump.disk.segment import Segment, parse_file_name
from rmqdump.errors import UnsupportedError
from rmqdump.findings import ERROR, INFO, WARNING, Finding
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.dledger.files import DLEDGER_ENTRY, DLedgerDir, is_dledger_segment, read_entry


@dataclass
class EntryAt:
    """One entry as the header walk met it."""

    seg: Segment
    file_pos: int
    header: EntryHeader

    @property
    def offset(self) -> int:
        return self.seg.start + self.file_pos

    @property
    def end(self) -> int:
        return self.offset + self.header.size


@dataclass
class HeaderWalk:
    """Where a header walk ended: ``stop`` (None: the last file ended with its blank), ``end`` (the end of the
    last sound entry, or the start of the file after a blank: DLedger's ``processOffset``)."""

    stop: Invalid | None = None
    end: int = 0
    last: EntryAt | None = None
    entries: int = 0


class DLedgerCommitLog(CommitLog):
    """``dledger-<id>/data`` of a store root. ``problems`` (the discovery's and the DLedger checks: entry
    continuity across files, index units, checkpoint, currterm) are worked out when first asked for."""

    dledger: DLedgerDir

    @classmethod
    def open_member(cls, dl: DLedgerDir) -> DLedgerCommitLog:
        cl = cls.from_directory(dl.data_dir)
        cl.dledger = dl
        return cl

    @classmethod
    def files_only(cls, cl: CommitLog) -> DLedgerCommitLog:
        """DLedger data files given alone (a file or a folder, without their store): read as entries; no index
        unit, checkpoint or currterm is checked, every entry counts as committed."""
        out = cls(cl.segments, cl.file_size, cl.location, cl.problems)
        out.dledger = DLedgerDir(cl.segments[0].path.parent.parent, "", files_only=True)
        return out

    def after_old_commitlog(self, old: CommitLog) -> DLedgerCommitLog:
        """A mixed store: the plain ``commitlog/`` files of the broker before it switched to DLedger, then the
        data files from ``dividedCommitlogOffset`` (the first data file's start; ``DLedgerCommitLog.recover``
        reads the old files up to it, their last one sealed with a BLANK). One offset space, walked in order."""
        divided = self.segments[0].start
        over = [s for s in old.segments if s.end > divided]
        if over:
            raise UnsupportedError(f"mixed store: {STORE_COMMITLOG_DIR}/{over[0].name} runs past the first DLedger data "
                                   f"file's offset {divided} (dividedCommitlogOffset); not a layout RocketMQ writes",
                                   over[0].path)
        problems = list(old.problems) + list(self._found)
        if old.segments and old.segments[-1].end != divided:
            problems.append(Finding(ERROR, "segment_gap", str(self.segments[0].path), None,
                                    f"the old commitlog ends at {old.segments[-1].end}, DLedger's data starts at "
                                    f"{divided}"))
        cl = DLedgerCommitLog(old.segments + self.segments, self.file_size or old.file_size, self.location, problems)
        cl.dledger = self.dledger
        return cl

    @property
    def dledger_segments(self) -> list[Segment]:
        """The DLedger data files (without a mixed store's old commitlog files)."""
        return [s for s in self.segments if is_dledger_segment(s)]

    @property
    def divided_offset(self) -> int:
        """``dividedCommitlogOffset``: where DLedger's data begins (the store's first offset without old files)."""
        segs = self.dledger_segments
        return segs[0].start if segs else self.min_offset

    @property
    def problems(self) -> list[Finding]:
        if self._checked is None:
            self._checked = list(self._found) + dledger_problems(self)
        return self._checked

    @problems.setter
    def problems(self, value: list[Finding]) -> None:
        self._found, self._checked = value, None

    # --- the entries ------------------------------------------------------------------------------------
    def header_walk(self, start_index: int = 0, on_entry=None) -> HeaderWalk:
        """Walk entry headers from the first entry of segment ``start_index`` as ``DLedgerMmapFileStore.recover``
        does (a blank moves to the next file; a refused header, a broken index or term sequence ends it),
        calling ``on_entry(EntryAt)`` for each sound entry."""
        segs = self.dledger_segments
        hw = HeaderWalk(end=segs[start_index].start if segs else 0)
        for seg in segs[start_index:]:
            hw.end = seg.start
            r = seg.open(True)
            try:
                pos = 0
                while True:
                    ent = read_entry(r, pos) if pos < r.size else Invalid(seg.end, seg.name, pos, END_OF_DATA,
                                                                        "end of file")
                    if isinstance(ent, Blank):
                        hw.end = seg.end
                        break
                    last = hw.last.header if hw.last else None
                    if not isinstance(ent, Invalid) and last is not None and (
                            ent.index != last.index + 1 or ent.term < last.term):
                        ent = Invalid(seg.start + pos, seg.name, pos, DLEDGER_ENTRY,
                                      f"entry index {ent.index} term {ent.term} after index {last.index} term "
                                      f"{last.term} (DLedger's recovery needs index + 1 and a term that does not "
                                      "go back)")
                    if isinstance(ent, Invalid):
                        hw.stop = ent
                        return hw
                    hw.last = EntryAt(seg, pos, ent)
                    hw.entries += 1
                    if on_entry is not None:
                        on_entry(hw.last)
                    pos += ent.size
                    hw.end = seg.start + pos
            finally:
                r.close()
        if segs[start_index:]:
            last = segs[-1]
            hw.stop = Invalid(last.end, last.name, last.size, END_OF_DATA, "the last data file ends with its blank")
        return hw

    def entry_at_index(self, index: int) -> EntryHeader | None:
        """The header of entry ``index`` through its index unit (as ``DLedgerMmapFileStore.get``), or None."""
        unit = self.index_unit(index)
        if unit is None or unit.size <= 0:
            return None
        seg = self.segment_for(unit.pos)
        if seg is None:
            return None
        r = seg.open(True)
        try:
            ent = read_entry(r, unit.pos - seg.start)
        finally:
            r.close()
        return ent if isinstance(ent, EntryHeader) else None

    # --- the index units --------------------------------------------------------------------------------
    def index_files(self) -> list[Segment]:
        """The files of ``dledger-<id>/index/`` (listed once)."""
        if getattr(self, "_index_files", None) is None:
            d = self.dledger.index_dir
            try:
                paths = sorted(p for p in d.iterdir() if parse_file_name(p.name) is not None and p.is_file())
            except OSError:
                paths = []
            self._index_files = [Segment(p, parse_file_name(p.name), p.stat().st_size) for p in paths]
            self._index_readers: dict = {}
        return self._index_files

    def index_unit(self, index: int) -> IndexUnit | None:
        """The 32-byte unit of entry ``index`` (None: no index file holds it). Index files stay open (read
        through pread) for the next unit."""
        at = index * DLEDGER_INDEX_UNIT
        for seg in self.index_files():
            if seg.start <= at and at + DLEDGER_INDEX_UNIT <= seg.end:
                r = self._index_readers.get(seg.path)
                if r is None:
                    r = self._index_readers[seg.path] = seg.open(False)
                return decode_index_unit(r.read(at - seg.start, DLEDGER_INDEX_UNIT))
        return None


def index_mismatch(unit: IndexUnit | None, e: EntryAt) -> str | None:
    """How the index unit of entry ``e`` disagrees with its header (the checks of DLedger's recovery)."""
    h = e.header
    if unit is None:
        return f"no index unit for entry {h.index}"
    for name, a, b in (("magic", unit.magic, h.magic), ("size", unit.size, h.size), ("index", unit.index, h.index),
                       ("term", unit.term, h.term), ("pos", unit.pos, e.offset)):
        if a != b:
            return f"index unit {name} {a} != entry {name} {b}"
    return None


def dledger_problems(cl: DLedgerCommitLog) -> list[Finding]:
    """The DLedger checks of a whole data-file list: entries continuous across files, every entry's index
    unit equal to its header, the index file's size, ``checkpoint`` and ``currterm`` against the entries."""
    dl = cl.dledger
    if dl.files_only:
        hw = cl.header_walk(0)
        stop = hw.stop
        return [] if stop is None or stop.kind != DLEDGER_ENTRY or stop.file_pos else [
            Finding(ERROR, DLEDGER_ENTRY, str(cl.segment_for(stop.offset).path), stop.offset, stop.detail)]
    base = str(dl.path)  # joined like the discovery's file names: verify makes them relative to the root
    out: list[Finding] = [Finding(WARNING, "dledger_text_file", base, None, p) for p in dl.problems]
    idx_files = cl.index_files()
    for s in idx_files:
        if s.size != DLEDGER_INDEX_FILE_SIZE:
            out.append(Finding(ERROR, "dledger_index_file", f"{base}/index/{s.name}", None,
                               f"size {s.size}, not DLedger's {DLEDGER_INDEX_FILE_SIZE}: DLedger's load fails "
                               "(the broker exits)"))
    bad_units: list[Finding] = []

    def check(e: EntryAt) -> None:
        if bad_units:
            return  # DLedger rewrites the index from the first mismatch on: one finding says it
        why = index_mismatch(cl.index_unit(e.header.index), e)
        if why is not None:
            name = f"{base}/index/{idx_files[0].name}" if idx_files else f"{base}/index"
            bad_units.append(Finding(ERROR, "dledger_index_mismatch", name, e.header.index * DLEDGER_INDEX_UNIT,
                                     f"{why} (entry at {e.offset}): DLedger's recovery rewrites the index from "
                                     "here"))

    hw = cl.header_walk(0, check) if cl.dledger_segments else HeaderWalk()
    out += bad_units
    if hw.stop is not None and hw.stop.kind == DLEDGER_ENTRY and hw.stop.file_pos == 0:
        out.append(Finding(ERROR, DLEDGER_ENTRY, f"{base}/data/{hw.stop.file}", hw.stop.offset, hw.stop.detail))
    last = hw.last.header if hw.last else None
    cp = dl.checkpoint
    if cp is not None and dl.committed_index is None:
        out.append(Finding(WARNING, "dledger_checkpoint", f"{base}/checkpoint", None,
                           f"no readable committedIndex in {cp!r}"))
    else:
        # a member that crashed before DLedger's periodic flush has no checkpoint file yet: the same -1 as one
        # flushed before any commit (the oracle's --crash-no-dispatch store has either, run to run)
        committed = -1 if cp is None else dl.committed_index
        if last is not None and committed is not None and committed < last.index:
            said = "no checkpoint file: committedIndex -1" if cp is None else f"committedIndex {committed}"
            out.append(Finding(INFO, "dledger_uncommitted", f"{base}/checkpoint", None,
                               f"{said} < last entry {last.index}: RocketMQ reads no record of the "
                               f"{last.index - committed} later entries until DLedger commits them"))
    if dl.currterm is None:
        out.append(Finding(INFO, "dledger_currterm", f"{base}/currterm", None, "no currterm file (term 0)"))
    elif last is not None and dl.curr_term is not None and last.term > dl.curr_term:
        out.append(Finding(WARNING, "dledger_currterm", f"{base}/currterm", None,
                           f"currTerm {dl.curr_term} is below the last entry's term {last.term}"))
    return out
