"""Damage in one commitlog segment: a damaged byte range (recognising torn writes), and how the
segment ends (BLANK, zero tail, preallocated, full, damage or garbage)."""

from __future__ import annotations

from rmqdump.analysis.verify.result import SegmentResult
from rmqdump.codec.layout import MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2
from rmqdump.codec.record import BAD_BLANK, END_OF_DATA, Invalid
from rmqdump.findings import ERROR, WARNING

_MAGICS = (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)
_ZERO_CHUNK = 1 << 20
_ZEROS = bytes(_ZERO_CHUNK)
_HOLE_PROBE_EVERY = 64 << 20  # zero bytes read before asking the filesystem for the next data again


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
    probe = pos
    while pos < size:
        if pos >= probe:  # skip the holes of a sparse file without reading them (SEEK_DATA)
            nxt = reader.next_data(pos)
            if nxt is None:
                return None
            pos, probe = nxt, nxt + _HOLE_PROBE_EVERY
            reader.release(pos)
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
