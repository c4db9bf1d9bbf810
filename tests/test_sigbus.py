"""Live stores: a segment truncated or replaced while it is being read.

``--no-mmap`` (pread) and ``--follow`` must never die from SIGBUS: they stop cleanly
(exit 0/1) or with one error line. The default mmap mode *is* at risk - touching a mapped
page past the new end of file raises SIGBUS, which Python cannot catch - so it is only run
in a subprocess and its fate is reported (documented: use --no-mmap on a live store).
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from secutil import RMQDUMP, SEG0

from rmqdump.codec.encoder import encode_fields
from rmqdump.disk.segment import Segment

SEG_SIZE = 64 << 20
BODY = bytes(range(256)) * 4


def _big_store(root: Path) -> int:
    """A store with one 64 MiB segment full of 1 KiB-body records; returns the record count."""
    rec = bytearray(encode_fields(topic=b"TopicLive", body=BODY, properties=b"KEYS\x01k",
                                  store_timestamp=1795297000000, born_timestamp=1795297000000))
    n = (SEG_SIZE - 8) // len(rec)
    data = bytearray(SEG_SIZE)
    for i in range(n):
        pos = i * len(rec)
        struct.pack_into(">q", rec, 20, i)  # QUEUEOFFSET
        struct.pack_into(">q", rec, 28, pos)  # PHYSICALOFFSET
        data[pos:pos + len(rec)] = rec
    (root / "commitlog").mkdir(parents=True)
    (root / "commitlog" / SEG0).write_bytes(data)
    return n


@pytest.fixture
def live(tmp_path):
    root = tmp_path / "store"
    n = _big_store(root)
    return root, root / "commitlog" / SEG0, n


def _scan_while(args: list[str], seg: Path, action, timeout: float = 120) -> tuple[int, int, str]:
    """Start rmqdump, wait for its first record, apply ``action(seg)``, drain; (rc, lines, stderr)."""
    env = dict(os.environ, NO_COLOR="1")
    p = subprocess.Popen([*RMQDUMP, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        first = p.stdout.readline()
        assert first, p.stderr.read().decode()
        action(seg)  # the reader is blocked on its full stdout pipe, a few hundred records in
        lines = 1 + sum(1 for _ in p.stdout)
        err = p.stderr.read().decode("utf-8", "replace")
        rc = p.wait(timeout=timeout)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return rc, lines, err


def _truncate_to(size: int):
    def act(seg: Path) -> None:
        os.truncate(seg, size)

    return act


def _replace(seg: Path) -> None:
    tmp = seg.with_name(".replacement")
    tmp.write_bytes(bytes(4096))
    os.replace(tmp, seg)


def _assert_clean(rc: int, err: str) -> None:
    assert rc >= 0, f"killed by {signal.Signals(-rc).name}: {err[-2000:]}"
    assert rc in (0, 1, 2) and "Traceback" not in err, err[-2000:]
    if rc == 2:
        assert len([x for x in err.splitlines() if x.strip()]) == 1, err


@pytest.mark.parametrize("cut", [0, 6 * (1 << 20) + 100], ids=["to-empty", "mid-record"])
def test_pread_scan_survives_truncation(live, cut):
    store, seg, n = live
    rc, lines, err = _scan_while(["scan", store, "--no-mmap", "-f", "jsonl", "--body", "none"], seg, _truncate_to(cut))
    _assert_clean(rc, err)
    assert lines < n, "the scan should not have seen the truncated records"


def test_pread_scan_survives_replacement(live):
    store, seg, n = live
    rc, lines, err = _scan_while(["scan", store, "--no-mmap", "-f", "jsonl", "--body", "none"], seg, _replace)
    _assert_clean(rc, err)
    assert rc == 0 and lines == n  # the open descriptor still reads the old file to its end


def test_follow_survives_truncation(live):
    store, seg, n = live
    rc, lines, err = _scan_while(["scan", store, "--follow", "--until-idle", "1", "--partial-timeout", "0.5",
                                  "-f", "jsonl", "--body", "none"], seg, _truncate_to(6 * (1 << 20) + 100))
    _assert_clean(rc, err)


def test_keep_going_scan_survives_truncation(live):
    store, seg, n = live
    rc, _, err = _scan_while(["scan", store, "--no-mmap", "--keep-going", "-f", "jsonl", "--body", "none"], seg,
                             _truncate_to(1 << 20))
    _assert_clean(rc, err)


def test_pread_reader_reads_a_shrunk_file_as_shorter(tmp_path):
    """In-process: after truncation, views past the new end are empty, never an error."""
    p = tmp_path / SEG0
    p.write_bytes(b"\1" * (8 << 20))
    r = Segment(p, 0, 8 << 20).open(use_mmap=False)
    try:
        buf, i, avail = r.view(0, 16)
        assert avail == 16
        os.truncate(p, 1000)
        buf, i, avail = r.view(5 << 20, 64)
        assert avail == 0 and r.size == 1000
        buf, i, avail = r.view(990, 64)
        assert avail == 10
    finally:
        r.close()


def test_a_live_brokers_store_is_read_without_mmap(live):
    """A store whose broker lock is held is read with pread even without --no-mmap: truncating the segment
    under the scan (as a broker's cleanup may) ends it cleanly, never with SIGBUS (mmap would)."""
    store, seg, n = live
    (store / "lock").write_bytes(b"")
    code = ("import sys; from rmqdump.broker.lock import StoreLock; l = StoreLock(sys.argv[1]).acquire(); "
            "print('locked', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(store)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        rc, lines, err = _scan_while(["scan", store, "-f", "jsonl", "--body", "none"], seg, _truncate_to(0))
    finally:
        holder.stdin.close()
        holder.wait(timeout=10)
    _assert_clean(rc, err)
    assert "reading with pread" in err and 0 < lines < n, (lines, err[-2000:])


def _rchar(pid: int) -> int:
    with open(f"/proc/{pid}/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


@pytest.mark.parametrize("cmd,extra", [("verify", ["-f", "json"]), ("stats", ["-f", "json"]),
                                       ("export", ["--to", "{tmp}/out.jsonl"])], ids=["verify", "stats", "export"])
def test_no_mmap_commands_survive_truncation(live, tmp_path, cmd, extra):
    """Commands that print only at the end: truncate while they walk (after a start-up delay)."""
    from rmqdump.cli import COMMANDS

    if cmd not in COMMANDS:
        pytest.skip(f"command {cmd!r} is not registered")
    store, seg, n = live
    args = [cmd, str(store), "--no-mmap", *(a.replace("{tmp}", str(tmp_path)) for a in extra)]
    p = subprocess.Popen([*RMQDUMP, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         env=dict(os.environ, NO_COLOR="1"))
    # stop it once it has read 8 MiB of the 64 MiB segment, truncate the file under it, let it go on
    deadline = time.monotonic() + 60
    while p.poll() is None and _rchar(p.pid) < (8 << 20) and time.monotonic() < deadline:
        time.sleep(0.0005)
    os.kill(p.pid, signal.SIGSTOP)
    try:
        read = _rchar(p.pid)
        assert p.poll() is None and read < SEG_SIZE, "the command was not mid-walk: the test would prove nothing"
        os.truncate(seg, (1 << 20) + 100)
    finally:
        os.kill(p.pid, signal.SIGCONT)
    err = p.stderr.read().decode("utf-8", "replace")
    rc = p.wait(timeout=300)
    _assert_clean(rc, err)
    print(f"{cmd} --no-mmap: truncated after {read} bytes read; rc={rc}")
