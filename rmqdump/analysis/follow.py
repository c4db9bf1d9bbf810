"""Follow the commitlog of a live store read-only, like ``tail -f`` (``scan --follow``).

The broker writes records in place into pre-allocated, zero-filled segment files. A
follower therefore must not mistake space that is *not yet written* for damage:

* only ``pread`` is used (never mmap: a file may change or be truncated under us), and
  every byte that did not decode as a complete record is read again from the file;
* a zero TOTALSIZE at the frontier means "not yet written": wait and re-read;
* a record that is present but incomplete (header written, the rest zero or short, body
  CRC not matching yet — CRCs are always checked) is also "not yet" — until it has stayed so for ``partial_timeout``
  seconds, when it is reported as damage and the follow stops;
* at a BLANK the follower rolls to the next segment (waiting for it to appear); if the
  frontier stays unwritten for ``partial_timeout`` seconds while the next segment already
  holds data, it rolls too, with a notice (a writer may hold back the first bytes of a batch
  until the rest is durable, so data in the next file alone does not prove it moved on);
* it stops on :attr:`Follower.request_stop` / a ``stop_event``, after ``idle_timeout``
  seconds without a new record, or at ``end``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rmqdump.codec.layout import BLANK_MAGIC_CODE, MAX_RECORD_SIZE, MIN_RECORD_SIZE_V1_IPV4, TOTALSIZE_MAGIC
from rmqdump.codec.record import END_OF_DATA, Blank, Invalid, Message, decode_record
from rmqdump.disk.fileio import open_regular
from rmqdump.disk.segment import offset_to_file_name, parse_file_name
from rmqdump.errors import StoreError
from rmqdump.store.commitlog import CommitLog

WINDOW = 1 << 20
DEFAULT_POLL_INTERVAL = 0.2
DEFAULT_PARTIAL_TIMEOUT = 5.0


@dataclass
class FollowNotice:
    """Something the reader should know that is not a record.

    kinds: ``caught_up`` (reached the write frontier, now waiting), ``rolled_without_blank``,
    ``damage`` (an invalid record that did not complete in time; the follow stops).
    """

    kind: str
    offset: int
    file: str
    detail: str


class _Wait:
    """Internal: nothing to yield yet. ``invalid``: a record is present but incomplete;
    ``roll_to``: the frontier is unwritten but the next segment (starting there) holds data."""

    __slots__ = ("invalid", "roll_to")

    def __init__(self, invalid: Invalid | None = None, roll_to: int | None = None):
        self.invalid = invalid
        self.roll_to = roll_to


_ROLLED = object()


def _open_ro(path: Path) -> int:
    return open_regular(path)  # read-only, never blocks on a FIFO, regular files only


class Follower:
    """Iterate the records of a commitlog as they are written; see the module docs.

    Yields :class:`~rmqdump.codec.record.Message`, :class:`~rmqdump.codec.record.Blank` and
    :class:`FollowNotice`. After iteration ``stop`` is ``"idle"``, ``"stopped"``,
    ``"damage"`` or ``"end"`` and ``offset`` is the next offset to read.
    """

    def __init__(self, path: str | os.PathLike, *, start: int | None = None, from_end: bool = False,
                 end: int | None = None, poll_interval: float = DEFAULT_POLL_INTERVAL,
                 idle_timeout: float | None = None, partial_timeout: float = DEFAULT_PARTIAL_TIMEOUT,
                 read_body: bool = True, max_record_size: int = MAX_RECORD_SIZE,
                 stop_event: threading.Event | None = None, clock=time.monotonic):
        p = Path(path)
        cl = CommitLog.open(p)
        self.single_file = p.is_file()
        self.directory = p.parent if self.single_file else cl.location
        self._single = (p, cl.segments[0].start) if self.single_file else None
        self.poll_interval = poll_interval
        self.idle_timeout = idle_timeout
        self.partial_timeout = partial_timeout
        self.check_crc = True  # the body CRC is what tells a half-copied record from a complete one
        self.read_body = read_body
        self.max_record_size = max_record_size
        self.end = end
        self.stop_event = stop_event or threading.Event()
        self.clock = clock
        self.stop: str | None = None
        self.stop_detail = ""
        self.records = 0
        if start is None:
            start = _frontier(cl) if from_end else cl.min_offset
        self.offset = start
        self._fd: int | None = None
        self._seg_start = 0
        self._seg_name = ""
        self._win = b""
        self._win_pos = 0

    # --- control -----------------------------------------------------------------------------
    def request_stop(self) -> None:
        """Ask the iteration to end at its next poll (thread-safe)."""
        self.stop_event.set()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # --- iteration ---------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Message | Blank | FollowNotice]:
        try:
            yield from self._run()
        finally:
            self.close()

    def _run(self):
        last_progress = self.clock()
        partial_since: float | None = None
        roll_since: float | None = None
        announced = False
        while True:
            if self.stop_event.is_set():
                self.stop, self.stop_detail = "stopped", "stop requested"
                return
            if self.end is not None and self.offset >= self.end:
                self.stop, self.stop_detail = "end", f"reached offset {self.end}"
                return
            item = self._step()
            if item is _ROLLED:
                last_progress = self.clock()
                continue
            if isinstance(item, (Message, Blank, FollowNotice)):
                if isinstance(item, Message):
                    self.records += 1
                last_progress = self.clock()
                partial_since = roll_since = None
                announced = False
                yield item
                continue
            now = self.clock()
            if item.roll_to is not None:
                # A writer may hold back the first bytes of a batch (a BLANK's or record's header) until
                # the rest is durable, so data in the next segment alone does not prove the writer left.
                if roll_since is None:
                    roll_since = now
                elif now - roll_since >= self.partial_timeout:
                    notice = self._roll(item.roll_to, blank=False)
                    if isinstance(notice, FollowNotice):
                        last_progress = now
                        roll_since = None
                        yield notice
                        continue
                self.stop_event.wait(self.poll_interval)
                continue
            roll_since = None
            inv = item.invalid
            if inv is not None:
                if partial_since is None:
                    partial_since = now
                elif now - partial_since >= self.partial_timeout:
                    yield self._damage(inv, now - partial_since)
                    return
            else:
                partial_since = None
            if self.idle_timeout is not None and now - last_progress >= self.idle_timeout:
                if partial_since is None:
                    self.stop, self.stop_detail = "idle", f"no new record for {self.idle_timeout:g} s"
                    return
                if now - partial_since >= min(self.idle_timeout, self.partial_timeout):
                    yield self._damage(inv, now - partial_since)
                    return
            if not announced and inv is None:
                announced = True
                yield FollowNotice("caught_up", self.offset, self._seg_name,
                                   f"caught up at offset {self.offset}; waiting for new records")
            self.stop_event.wait(self.poll_interval)

    def _damage(self, inv: Invalid, waited: float) -> FollowNotice:
        self.stop = "damage"
        self.stop_detail = (f"{inv.kind}: {inv.detail} (still invalid after {waited:.1f} s: an incomplete write "
                            "if the broker is still writing it, else a torn or damaged record)")
        return FollowNotice("damage", inv.offset, inv.file, self.stop_detail)

    # --- one step ----------------------------------------------------------------------------
    def _segment_path(self, start: int) -> Path:
        return self.directory / offset_to_file_name(start)

    def _open_segment_for(self, offset: int) -> bool:
        """Open the segment holding ``offset`` (or starting exactly there); False if none yet."""
        if self._single is not None:
            self._open(*self._single)
            return True
        best = None
        try:
            names = os.listdir(self.directory)
        except OSError as e:
            raise StoreError(f"cannot list directory: {e.strerror}", self.directory) from None
        for name in names:
            s = parse_file_name(name)
            if s is None or s > offset:
                continue
            if best is None or s > best:
                best = s
        if best is None:
            return False
        path = self._segment_path(best)
        try:
            size = os.stat(path).st_size
        except FileNotFoundError:
            return False
        if offset >= best + size and offset != best:
            return False  # the file holding it does not exist yet
        self._open(path, best)
        return True

    def _open(self, path: Path, start: int) -> None:
        self.close()
        self._fd = _open_ro(path)
        self._seg_start = start
        self._seg_name = path.name
        self._win, self._win_pos = b"", 0

    def _pread(self, n: int, pos: int) -> bytes:
        try:
            return os.pread(self._fd, n, pos)
        except OSError as e:
            raise StoreError(f"read failed: {e.strerror}", self.directory / self._seg_name, pos) from None

    def _step(self):
        if self._fd is None and not self._open_segment_for(self.offset):
            return _Wait()
        pos = self.offset - self._seg_start
        try:
            size = os.fstat(self._fd).st_size
        except OSError as e:
            raise StoreError(f"cannot stat: {e.strerror}", self.directory / self._seg_name) from None
        if pos >= size:
            if self.single_file:
                return _Wait()
            return self._roll(self._seg_start + size, blank=True)
        to_end = size - pos
        # 1) from the window (bytes read earlier) — only a complete, valid record is trusted there
        rec = self._decode_window(pos, to_end)
        if isinstance(rec, Message):
            self.offset += rec.size
            return rec
        # 2) fresh read: the header first (a poll at an idle frontier costs one 8-byte pread)
        head = self._pread(min(8, to_end), pos)
        if len(head) < 8:
            self._win, self._win_pos = head, pos
            if not any(head):
                return self._unwritten(pos, size)
        else:
            total, magic = TOTALSIZE_MAGIC.unpack_from(head)
            if total == 0 and magic == 0:
                return self._unwritten(pos, size)
            if magic == BLANK_MAGIC_CODE and total == to_end:
                blank = Blank(self.offset, self._seg_name, pos, total, to_end)
                self.offset += total
                self.close()
                return blank
            plausible = MIN_RECORD_SIZE_V1_IPV4 <= total <= min(to_end, self.max_record_size)
            self._win = self._pread(min(max(WINDOW, total if plausible else 8), to_end), pos)
            self._win_pos = pos
        rec = decode_record(self._win, 0, len(self._win), pos, self._seg_start, self._seg_name, to_end=to_end,
                            check_crc=self.check_crc, read_body=self.read_body, max_record_size=self.max_record_size)
        if isinstance(rec, Message):
            self.offset += rec.size
            return rec
        if isinstance(rec, Blank):  # cannot happen (handled above); keep the walk honest
            self.offset += rec.size
            self.close()
            return rec
        if rec.kind == END_OF_DATA:
            return self._unwritten(pos, size)
        return _Wait(rec)

    def _decode_window(self, pos: int, to_end: int):
        start = pos - self._win_pos
        if not self._win or start < 0 or start + 8 > len(self._win):
            return None
        total = int.from_bytes(self._win[start:start + 4], "big", signed=True)
        if not (MIN_RECORD_SIZE_V1_IPV4 <= total <= min(to_end, self.max_record_size)) \
                or start + total > len(self._win):
            return None
        return decode_record(self._win, start, total, pos, self._seg_start, self._seg_name, to_end=to_end,
                             check_crc=self.check_crc, read_body=self.read_body,
                             max_record_size=self.max_record_size)

    def _roll(self, next_start: int, blank: bool):
        path = self._segment_path(next_start)
        if not path.exists():
            return _Wait()
        prev, prev_name = self.offset, self._seg_name
        self.offset = next_start
        self._open(path, next_start)
        if blank:
            return _ROLLED
        return FollowNotice("rolled_without_blank", next_start, path.name,
                            f"skipped unwritten bytes [{prev}, {next_start}): the end of {prev_name} stayed "
                            f"unwritten for {self.partial_timeout:g} s while the next segment {path.name} "
                            "holds data: rolled to it (no BLANK record)")

    def _unwritten(self, pos: int, size: int):
        """At a zero header: wait, unless the writer has visibly moved on to the next segment."""
        if self.single_file:
            return _Wait()
        next_start = self._seg_start + size
        path = self._segment_path(next_start)
        if not path.exists():
            return _Wait()
        fd = None
        try:
            fd = open_regular(path)
            head = os.pread(fd, TOTALSIZE_MAGIC.size, 0)
        except (OSError, StoreError):
            return _Wait()
        finally:
            if fd is not None:
                os.close(fd)
        if not any(head):
            return _Wait()  # pre-allocated next file, still empty: the writer is still here
        again = self._pread(8, pos)
        if any(again):
            return _ROLLED  # our frontier got written meanwhile (a BLANK or a record): re-read it
        return _Wait(roll_to=next_start)


def _frontier(cl: CommitLog) -> int:
    """End of valid data (walked with pread from the start of the last segment holding data)."""
    start = cl.min_offset
    for seg in reversed(cl.segments):
        if seg.size == 0:
            continue
        with seg.open(False) as r:
            if any(r.read(0, 8)):
                start = seg.start
                break
    walk = cl.walk(start=start, check_crc=False, read_body=False, use_mmap=False)
    for _ in walk:
        pass
    return walk.end_offset
