"""A DLedger member's directory (``dledger-<selfId>/``) and one entry read at a data-file position."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.dledger import (
    DLEDGER_BLANK_MAGIC,
    DLEDGER_BODY_OFFSET,
    DLEDGER_CHECKPOINT,
    DLEDGER_CURRTERM,
    DLEDGER_DATA_DIR,
    DLEDGER_DIR_PREFIX,
    DLEDGER_INDEX_DIR,
    DLEDGER_MIN_BLANK_LEN,
    EntryHeader,
    decode_entry_header,
    entry_header_problem,
    looks_like_entry,
    parse_properties_text,
)
from rmqdump.codec.record import BAD_BLANK, END_OF_DATA, TRUNCATED, Blank, Invalid
from rmqdump.disk.fileio import open_read
from rmqdump.disk.segment import Segment, SegmentReader, parse_file_name
from rmqdump.errors import UnsupportedError

#: Invalid kind of an entry header DLedger's recovery stops at (magic, size, pos, index or term)
DLEDGER_ENTRY = "dledger_entry"


@dataclass
class DLedgerDir:
    """``dledger-<selfId>/`` of a store root: where its files are and what its text files say."""

    path: Path
    self_id: str
    checkpoint: dict[str, str] | None = None  # None: no file
    currterm: dict[str, str] | None = None
    problems: list[str] = field(default_factory=list)
    files_only: bool = False  # only data files were given: no index, checkpoint or currterm to read

    @property
    def data_dir(self) -> Path:
        return self.path / DLEDGER_DATA_DIR

    @property
    def index_dir(self) -> Path:
        return self.path / DLEDGER_INDEX_DIR

    @property
    def committed_index(self) -> int | None:
        """``committedIndex`` of the checkpoint as ``Long.valueOf`` reads it (None: absent or unreadable)."""
        return _long(self.checkpoint, "committedIndex")

    @property
    def curr_term(self) -> int | None:
        return _long(self.currterm, "currTerm")


def _long(props: dict[str, str] | None, key: str) -> int | None:
    """A number of a DLedger properties text file (None: the file or the key absent, or not a number)."""
    v = (props or {}).get(key)
    try:
        return int(v) if v else None
    except ValueError:
        return None


def _read_text(p: Path, problems: list[str]) -> dict[str, str] | None:
    if not p.is_file():
        return None
    try:
        fd = open_read(p)
    except OSError as e:
        problems.append(f"{p.name}: cannot read: {e.strerror}")
        return None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(1 << 20)
    return parse_properties_text(raw.decode("latin-1"))


def find_dledger(root: Path) -> DLedgerDir | None:
    """The ``dledger-<id>/`` directory of a store root holding a ``data/`` folder (the first by name when
    several do: a root belongs to one member), or None."""
    try:
        names = sorted(n for n in os.listdir(root) if n.startswith(DLEDGER_DIR_PREFIX))
    except OSError:
        return None
    for n in names:
        d = root / n
        if (d / DLEDGER_DATA_DIR).is_dir():
            probs: list[str] = []
            return DLedgerDir(d, n[len(DLEDGER_DIR_PREFIX):], _read_text(d / DLEDGER_CHECKPOINT, probs),
                              _read_text(d / DLEDGER_CURRTERM, probs), probs)
    return None


def has_data_files(d: Path) -> bool:
    try:
        return any(parse_file_name(n) is not None for n in os.listdir(d))
    except OSError:
        return False


def _sniff(seg: Segment) -> bool:
    """A lone file whose first bytes are a sound entry header at its own start offset."""
    if seg.size < DLEDGER_BODY_OFFSET:
        return False
    try:
        fd = open_read(seg.path)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as f:
        head = f.read(DLEDGER_BODY_OFFSET)
    return looks_like_entry(head, 0, seg.start, seg.size)


def is_dledger_segment(seg: Segment) -> bool:
    """Whether ``seg`` is a DLedger data file (entries wrapping records), not a plain commitlog file: it lies
    in ``dledger-<id>/data/``, or it starts with a sound entry header (a copied data file)."""
    parent = seg.path.parent
    if parent.name == DLEDGER_DATA_DIR and parent.parent.name.startswith(DLEDGER_DIR_PREFIX):
        return True
    if parent.name == "commitlog":
        return False
    return _sniff(seg)


def read_entry(r: SegmentReader, pos: int) -> EntryHeader | Blank | Invalid:
    """The entry at data-file position ``pos``: its header when DLedger's recovery would accept it there, the
    file's end blank, or why not (``dledger_entry``, ``truncated``, ``end_of_data``, ``bad_blank``)."""
    seg = r.segment
    at = seg.start + pos
    to_end = r.size - pos
    buf, i, avail = r.view(pos, min(DLEDGER_BODY_OFFSET, max(to_end, 0)))
    if avail < 4 or not any(memoryview(buf)[i:i + min(avail, 8)]):
        return Invalid(at, seg.name, pos, END_OF_DATA, "end of data (zero bytes)" if avail >= 4 else "end of file")
    magic = int.from_bytes(buf[i:i + 4], "big", signed=True)
    if magic == DLEDGER_BLANK_MAGIC:
        left = int.from_bytes(buf[i + 4:i + 8], "big", signed=True) if avail >= 8 else -1
        if avail < DLEDGER_MIN_BLANK_LEN or left != to_end:
            return Invalid(at, seg.name, pos, BAD_BLANK, f"DLedger end blank says {left} bytes left, the file has "
                                                         f"{to_end}")
        return Blank(at, seg.name, pos, left, to_end)
    if avail < DLEDGER_BODY_OFFSET:
        return Invalid(at, seg.name, pos, TRUNCATED, f"{to_end} bytes left, too few for a DLedger entry header")
    h = decode_entry_header(buf, i)
    why = entry_header_problem(h, at)
    if why is not None:
        return Invalid(at, seg.name, pos, DLEDGER_ENTRY, why)
    if h.size > to_end:
        return Invalid(at, seg.name, pos, TRUNCATED, f"DLedger entry of {h.size} bytes runs past the end of the "
                                                     f"file ({to_end} bytes left)")
    return h


def resync_entry(r: SegmentReader, lo: int) -> int | None:
    """First data-file position >= ``lo`` holding a sound entry header (pos field = its offset), or None."""
    seg = r.segment
    magic = (1).to_bytes(4, "big")
    p = lo
    while p + DLEDGER_BODY_OFFSET <= r.size:
        nxt = r.next_data(p)  # holes of a sparse file are skipped unread (SEEK_DATA)
        if nxt is None:
            return None
        p = max(p, nxt)
        n = min(1 << 20, r.size - p)
        buf, i, avail = r.view(p, n)
        cands = []
        f = buf.find(magic, i, i + avail)
        while f >= 0:
            cands.append(p + (f - i))
            f = buf.find(magic, f + 1, i + avail)
        for q in cands:  # each view below may reuse the reader's window: candidates are collected first
            hb, hi, ha = r.view(q, DLEDGER_BODY_OFFSET)
            if looks_like_entry(hb, hi, seg.start + q, min(ha, r.size - q) if ha < DLEDGER_BODY_OFFSET
                                else r.size - q):
                return q
        if p + n >= r.size:
            break
        p += n - 3
    return None


def refuse_dledger(root: Path, action: str) -> None:
    """Raise when ``root`` is a DLedger store: writers (``append``, ``repair``) cannot yet write entries (header,
    index unit, checkpoint) that DLedger's recovery accepts."""
    dl = find_dledger(Path(root)) if Path(root).is_dir() else None
    if dl is not None:
        raise UnsupportedError(f"refusing to {action}: this is a DLedger store (enableDLegerCommitLog, "
                               f"{dl.path.name}/data/); rmqdump cannot yet write entries DLedger accepts", root)
