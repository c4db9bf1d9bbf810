"""Is a broker running or starting on this store? The ``abort`` marker (:func:`read_abort`), other processes
with the store's files open or mapped (:func:`processes_using`) and a live PID in ``abort``
(:func:`broker_evidence`)."""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from rmqdump.codec.layout import (
    STORE_ABORT_FILE,
)
from rmqdump.disk.fileio import open_read
from rmqdump.errors import StoreError

#: content of the ``abort`` marker rmqdump creates (the broker only checks that the file exists)
ABORT_TAG = b"rmqdump"
#: the end of a repair's marker written over an interrupted append's (the append's evidence carried on)
AFTER_APPEND = b" after append"


@dataclass
class AbortInfo:
    """The ``abort`` file: present, who wrote it, and whether it is newer than the last record."""

    path: Path
    content: bytes
    mtime_ms: int

    @property
    def ours(self) -> bool:
        return self.content.startswith(ABORT_TAG)

    @property
    def by_append(self) -> bool:
        """Left by rmqdump's appender (what lies past its end was never acknowledged), or by a repair of such a
        store that was itself interrupted (it carries the append's marker on)."""
        first = self.content.split(b"\n", 1)[0]
        return first.startswith(ABORT_TAG + b" append") or (first.startswith(ABORT_TAG + b" repair ")
                                                            and first.endswith(AFTER_APPEND))

    @property
    def pid(self) -> int | None:
        """The PID a 5.x broker writes into ``abort`` (None for 4.x's empty file or ours)."""
        text = self.content.strip()
        return int(text) if text.isdigit() and 0 < len(text) <= 10 else None


def read_abort(root: Path) -> AbortInfo | None:
    path = root / STORE_ABORT_FILE
    try:
        fd = open_read(path, follow=False)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise StoreError("abort is a symlink; refusing to touch this store", path) from None
        raise StoreError(f"cannot open: {e.strerror}", path) from None
    try:
        st = os.fstat(fd)
        content = os.pread(fd, 256, 0) if stat.S_ISREG(st.st_mode) else b""
    finally:
        os.close(fd)
    return AbortInfo(path, content, st.st_mtime_ns // 1_000_000)


def _proc_name(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read(300).replace(b"\0", b" ").strip().decode("utf-8", "replace")
    except OSError:
        cmd = ""
    if not cmd:
        try:
            with open(f"/proc/{pid}/comm", "rb") as f:
                cmd = f.read(64).strip().decode("utf-8", "replace")
        except OSError:
            cmd = "?"
    return _printable(cmd[:120])


def _printable(s: str) -> str:
    """Another process's command line as one printable line (controls, newlines, bidi: ``\\xNN``/``\\uNNNN``)."""
    return "".join(c if c.isprintable() and not 0x202A <= ord(c) <= 0x202E and not 0x2066 <= ord(c) <= 0x2069
                   else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}") for c in s)


def processes_using(root: str | os.PathLike) -> list[tuple[int, str, str]]:
    """Other processes with a file of the store open or mapped: (pid, command, one path).

    Reads ``/proc`` (Linux); processes of other users that cannot be inspected are skipped.
    """
    proc = Path("/proc")
    if not proc.is_dir():
        return []
    real = os.path.realpath(root)
    prefix = real.rstrip("/") + "/"
    me = os.getpid()
    out = []
    try:
        pids = [int(n) for n in os.listdir(proc) if n.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid == me:
            continue
        hit = None
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                except OSError:
                    continue
                if target == real or target.startswith(prefix):
                    hit = target
                    break
        except OSError:
            pass
        if hit is None:
            try:
                with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as f:
                    for line in f:
                        parts = line.split(None, 5)
                        if len(parts) == 6 and parts[5].strip().startswith(prefix):
                            hit = parts[5].strip()
                            break
            except OSError:
                pass
        if hit is not None:
            out.append((pid, _proc_name(pid), hit))
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def broker_evidence(root: Path, abort: AbortInfo | None) -> list[str]:
    """Reasons to believe a broker (or another writer) is running or starting on this store."""
    reasons = []
    for pid, cmd, path in processes_using(root):
        reasons.append(f"process {pid} ({cmd}) has {path} open: a broker may be starting or running")
    if abort is not None and abort.pid is not None and abort.pid != os.getpid() and pid_alive(abort.pid):
        reasons.append(f"abort names process {abort.pid} ({_proc_name(abort.pid)}), which is alive: "
                       "a 5.x broker may be starting")
    return reasons
