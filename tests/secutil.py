"""Helpers for the security tests: hostile stores, file snapshots, bounded CLI runs, write audits."""

from __future__ import annotations

import hashlib
import os
import select
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from rmqdump.codec.encoder import encode_fields
from rmqdump.codec.layout import MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2

SEG0 = "00000000000000000000"
RMQDUMP = [sys.executable, "-c", "import sys; from rmqdump.cli import main; sys.argv[0] = 'rmqdump'; main()"]
# A fresh small interpreter starts rmqdump and reports its peak RSS: measured from the test
# process itself, a forked child would count the (large) parent's pages as its own.
_RSS_WRAPPER = """
import os, resource, signal, subprocess, sys
r = subprocess.run(sys.argv[1:])
with open(os.environ["RMQDUMP_RSS_FILE"], "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))
if r.returncode < 0:
    signal.signal(-r.returncode, signal.SIG_DFL)
    os.kill(os.getpid(), -r.returncode)
sys.exit(r.returncode)
"""


# --- hostile stores ---------------------------------------------------------------------------


def record(topic: bytes, body: bytes = b"body", properties: bytes = b"", offset: int = 0, queue_id: int = 0,
           queue_offset: int = 0, store_timestamp: int = 1795297000000, sys_flag: int = 0) -> bytes:
    """One well-formed record (valid CRC, PHYSICALOFFSET = ``offset``) with raw, untrusted parts."""
    magic = MESSAGE_MAGIC_CODE_V2 if len(topic) > 127 else MESSAGE_MAGIC_CODE
    return encode_fields(topic=topic, body=body, properties=properties, queue_id=queue_id, queue_offset=queue_offset,
                         physical_offset=offset, sys_flag=sys_flag, born_timestamp=store_timestamp - 5,
                         store_timestamp=store_timestamp, magic=magic)


def props(**kv: str) -> bytes:
    return "\x02".join(f"{k}\x01{v}" for k, v in kv.items()).encode("utf-8", "surrogateescape")


def build_store(root: Path, items: list[tuple[bytes, bytes, bytes]], file_size: int = 1 << 20) -> list[int]:
    """A store whose commitlog holds one record per ``(topic, body, properties)``; returns offsets.

    Written directly with :func:`encode_fields` (the dispatching StoreWriter refuses unsafe
    topic names, as it should). Queue offsets count per topic.
    """
    cl = root / "commitlog"
    cl.mkdir(parents=True, exist_ok=True)
    for d in ("consumequeue", "index", "config"):
        (root / d).mkdir(exist_ok=True)
    data = bytearray()
    offsets = []
    qoff: dict[bytes, int] = {}
    for i, (topic, body, prop) in enumerate(items):
        q = qoff.get(topic, 0)
        qoff[topic] = q + 1
        offsets.append(len(data))
        data += record(topic, body, prop, offset=len(data), queue_offset=q, store_timestamp=1795297000000 + i)
    if len(data) > file_size:
        raise ValueError("records do not fit one segment")
    (cl / SEG0).write_bytes(bytes(data) + bytes(file_size - len(data)))
    return offsets


# --- snapshots ----------------------------------------------------------------------------------


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def snapshot(root: Path) -> dict[str, tuple]:
    """Every entry under ``root`` (not following links): kind, size, sha256, mtime_ns, mode."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in [*dirnames, *filenames]:
            p = Path(dirpath) / name
            st = os.lstat(p)
            rel = str(p.relative_to(root))
            if stat.S_ISREG(st.st_mode):
                out[rel] = ("file", st.st_size, sha256_file(p), st.st_mtime_ns, stat.S_IMODE(st.st_mode))
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p), st.st_mtime_ns)
            else:
                out[rel] = ("dir", st.st_mtime_ns, stat.S_IMODE(st.st_mode))
    out["."] = ("dir", os.lstat(root).st_mtime_ns)
    return out


def diff_snapshots(before: dict, after: dict) -> list[str]:
    changes = []
    for k in sorted(set(before) | set(after)):
        if before.get(k) != after.get(k):
            changes.append(f"{k}: {before.get(k)} -> {after.get(k)}")
    return changes


# --- bounded subprocess runs --------------------------------------------------------------------


@dataclass
class Run:
    args: list[str]
    returncode: int | None  # negative: killed by that signal; None: timed out
    stdout: str
    stderr: str
    maxrss_kb: int
    seconds: float

    @property
    def timed_out(self) -> bool:
        return self.returncode is None

    def describe(self) -> str:
        return (f"rmqdump {' '.join(self.args)} -> rc={self.returncode} rss={self.maxrss_kb} KiB "
                f"t={self.seconds:.2f}s\nstderr: {self.stderr[-2000:]}")


def run_cli(args: list[str], timeout: float = 5.0, env: dict | None = None, cwd: str | None = None,
            stdin: bytes | None = None, prefix: list[str] | None = None) -> Run:
    """Run rmqdump in a subprocess with a wall-clock limit; report its own peak RSS (wait4)."""
    fd, rss_file = tempfile.mkstemp(prefix="rmqdump-rss-")
    os.close(fd)
    full_env = dict(os.environ, NO_COLOR="1", COLUMNS="200", PYTHONDONTWRITEBYTECODE="1", RMQDUMP_RSS_FILE=rss_file)
    full_env.pop("FORCE_COLOR", None)
    if env:
        full_env.update(env)
    cmd = [*(prefix or []), sys.executable, "-c", _RSS_WRAPPER, *RMQDUMP, *map(str, args)]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=full_env, cwd=cwd,
                         start_new_session=True)
    out_chunks: list[bytes] = []
    err_chunks: list[bytes] = []

    def pump(stream, sink):
        for chunk in iter(lambda: stream.read(65536), b""):
            if sum(map(len, sink)) < 64 << 20:
                sink.append(chunk)

    threads = [threading.Thread(target=pump, args=(p.stdout, out_chunks), daemon=True),
               threading.Thread(target=pump, args=(p.stderr, err_chunks), daemon=True)]
    for t in threads:
        t.start()
    if stdin is not None:
        try:
            p.stdin.write(stdin)
            p.stdin.close()
        except BrokenPipeError:
            pass
    rc: int | None = None
    rss = 0
    deadline = t0 + timeout
    while True:
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            rc = os.waitstatus_to_exitcode(status)
            rss = ru.ru_maxrss
            break
        if time.monotonic() > deadline:
            os.killpg(p.pid, signal.SIGKILL)
            _, status, ru = os.wait4(p.pid, 0)
            rss = ru.ru_maxrss
            rc = None
            break
        select.select([], [], [], 0.01)
    p.returncode = -999 if rc is None else rc  # reaped above: keep Popen from waiting again
    for t in threads:
        t.join(5)
    try:
        rss = int(Path(rss_file).read_text() or 0) or rss
    except (OSError, ValueError):
        pass
    finally:
        os.unlink(rss_file)
    return Run(list(map(str, args)), rc, b"".join(out_chunks).decode("utf-8", "replace"),
               b"".join(err_chunks).decode("utf-8", "replace"), rss, time.monotonic() - t0)


def baseline_rss_kb() -> int:
    """Peak RSS of a trivial rmqdump run (interpreter + click + rich), cached."""
    global _BASELINE
    if _BASELINE is None:
        r = run_cli(["--help"], timeout=30)
        _BASELINE = r.maxrss_kb
    return _BASELINE


_BASELINE: int | None = None


# --- in-process write audit -------------------------------------------------------------------

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PATH_EVENTS = {"os.remove", "os.rmdir", "os.mkdir", "os.rename", "os.truncate", "os.chmod", "os.chown",
                "os.utime", "os.link", "os.symlink", "shutil.rmtree", "shutil.move", "shutil.copyfile"}
_watch: list | None = None
_watch_roots: list[str] = []
_hook = False


def _audit(event: str, args: tuple) -> None:
    w = _watch
    if w is None:
        return
    if event == "open":
        path, flags = args[0], args[2]
        if isinstance(flags, int) and flags & _WRITE_FLAGS and _under(path):
            w.append(f"open({path!r}, flags={flags:#o})")
    elif event in _PATH_EVENTS:
        for a in args[:2]:
            if _under(a):
                w.append(f"{event}{args!r}")
                break
    elif event == "mmap.__new__":
        # (fileno, length, access, offset): ACCESS_WRITE=2, ACCESS_DEFAULT=0 on a writable fd
        if len(args) > 2 and args[2] in (0, 2) and isinstance(args[0], int) and args[0] >= 0:
            try:
                target = os.readlink(f"/proc/self/fd/{args[0]}")
            except OSError:
                target = None
            if target is None or _under(target):
                w.append(f"mmap access={args[2]} of {target or args[0]} {args!r}")


def _under(path) -> bool:
    if path is None or isinstance(path, int):
        return False
    try:
        p = os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return False
    return any(p == r or p.startswith(r + os.sep) for r in _watch_roots)


class WriteAudit:
    """Collect every write-mode open / mutation of a path under ``roots`` in this process."""

    def __init__(self, *roots: Path):
        self.roots = [os.path.realpath(r) for r in roots]
        self.events: list[str] = []

    def __enter__(self) -> WriteAudit:
        global _watch, _watch_roots, _hook
        if not _hook:
            sys.addaudithook(_audit)
            _hook = True
        _watch_roots = self.roots
        _watch = self.events
        return self

    def __exit__(self, *exc) -> None:
        global _watch
        _watch = None


def make_read_only(root: Path) -> None:
    """chmod a-w every file and directory under ``root`` (bottom-up)."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for n in filenames:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                os.chmod(p, stat.S_IMODE(os.lstat(p).st_mode) & ~0o222)
        os.chmod(dirpath, stat.S_IMODE(os.lstat(dirpath).st_mode) & ~0o222)


def make_writable(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, 0o755)
        for n in filenames:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                os.chmod(p, 0o644)


def ro_mount_prefix(path: Path) -> list[str] | None:
    """A command prefix running its command with ``path`` bind-mounted read-only in a private
    mount namespace (needs ``unshare -m`` and mount rights: root in CI); None if unavailable."""
    if os.geteuid() != 0 or not Path("/usr/bin/unshare").exists():
        return None
    q = str(path).replace("'", "'\\''")
    script = f"mount --bind '{q}' '{q}' && mount -o remount,bind,ro '{q}' && exec \"$@\""
    prefix = ["unshare", "-m", "sh", "-c", script, "sh"]
    probe = subprocess.run([*prefix, "sh", "-c", f"! touch '{q}/.rmqdump-ro-probe' 2>/dev/null"],
                           capture_output=True, timeout=20)
    if probe.returncode != 0:
        return None
    try:
        os.unlink(path / ".rmqdump-ro-probe")
    except FileNotFoundError:
        pass
    return prefix


def crafted_resync_segment(path, file_size: int = 16 << 20, window: int = 8 << 20, spacing: int = 128,
                           claimed: int = 4 << 20) -> None:
    """A commitlog segment that is a resync trap: one good record, a damaged byte, then ``window`` bytes of
    overlapping candidates every ``spacing`` bytes, each structurally valid (V1 magic, PHYSICALOFFSET equal to
    its position, TOTALSIZE ``claimed`` with a consistent BODYLEN) but with a wrong BODYCRC. A resync that
    CRC-checks every candidate body costs O(window x claimed)."""
    from rmqdump.codec.encoder import encode_fields
    from rmqdump.codec.layout import MESSAGE_MAGIC_CODE, RECORD_FIXED_V4V4

    buf = bytearray(file_size)
    good = encode_fields(topic=b"T", body=b"ok", properties=b"", store_timestamp=1_700_000_000_000)
    buf[:len(good)] = good
    buf[len(good)] = 0x55  # damage right after it
    blen = claimed - RECORD_FIXED_V4V4.size - 1 - 2  # body, 1-byte topic length, empty topic, 2-byte props length
    for pos in range(len(good) + spacing, len(good) + window, spacing):
        RECORD_FIXED_V4V4.pack_into(buf, pos, claimed, MESSAGE_MAGIC_CODE, 12345, 0, 0, 0, pos, 0, 0,
                                    b"\x7f\0\0\1", 1, 0, b"\x7f\0\0\1", 2, 0, 0, blen)
    path.write_bytes(bytes(buf))
