"""Writers (``append``, ``repair --apply``, ``repair --rebuild-* --to``) never follow links out of the
store, refuse a store whose lock they cannot take, and report fsync errors as failures.

Links planted in a store (segment, consume-queue file and directory, index file, lock,
checkpoint, abort marker - including dangling links, the classic "create through a link"
attack) point at files outside it; after the command those must be byte-identical (or
still absent). fsync failures are simulated in-process by making ``os.fsync`` raise EIO
- once (a retry would then "succeed": the fsyncgate trap) or always.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from secutil import sha256_file, snapshot

from conftest import real_store
from rmqdump.cli import COMMANDS, cli

SEG1 = "00000000000000262144"


def _require(cmd: str) -> None:
    if cmd not in COMMANDS:
        pytest.skip(f"command {cmd!r} is not registered yet (rmqdump {cmd} missing)")


def _copy(tmp_path: Path, name: str) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(real_store(name), dst)
    for p in [dst, *dst.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def _append(store: Path, *extra: str):
    return CliRunner().invoke(cli, ["append", str(store), "--topic", "TopicTest", "--body", "hello", "-f", "jsonl",
                                    *extra], catch_exceptions=True)


def _repair_apply(store: Path, tmp_path: Path, *extra: str):
    return CliRunner().invoke(cli, ["repair", str(store), "--apply", "--backup-dir", str(tmp_path / "backup"),
                                    "-f", "json", *extra], catch_exceptions=True)


def _no_traceback(res) -> None:
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)


# (what, path relative to the store, whether the target exists outside)
LINKS = [
    ("last segment", f"commitlog/{SEG1}", True),
    ("cq file", "consumequeue/TopicTest/0/00000000000000000600", True),
    ("cq topic dir", "consumequeue/TopicTest", True),
    ("cq queue dir", "consumequeue/TopicTest/0", True),
    ("index file", "index/*", True),
    ("lock", "lock", True),
    ("checkpoint", "checkpoint", True),
    ("dangling abort", "abort", False),
    ("dangling new cq dir", "consumequeue/TopicNew", False),
]


def _plant(store: Path, outside: Path, rel: str, exists: bool) -> Path:
    """Replace ``store/rel`` by a link to a copy (or to a missing path) in ``outside``."""
    if "*" in rel:
        rel = str(next(store.glob(rel)).relative_to(store))
    p = store / rel
    target = outside / rel.replace("/", "__")
    if exists:
        if p.is_dir():
            shutil.copytree(p, target)
            shutil.rmtree(p)
        else:
            shutil.copy2(p, target)
            p.unlink()
    elif p.exists():
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    p.symlink_to(target, target_is_directory=exists and target.is_dir())
    return target


@pytest.mark.parametrize("what,rel,exists", LINKS, ids=[x[0] for x in LINKS])
def test_append_never_writes_through_a_link(tmp_path, what, rel, exists):
    _require("append")
    store = _copy(tmp_path, "clean")
    outside = tmp_path / "outside"
    outside.mkdir()
    target = _plant(store, outside, rel, exists)
    before = snapshot(outside)
    spec = ["--topic", "TopicNew"] if "TopicNew" in rel else []
    res = _append(store, *spec)
    _no_traceback(res)
    assert snapshot(outside) == before, f"append wrote through the {what} link: {res.stdout}{res.stderr}"
    assert exists or not target.exists()


@pytest.mark.parametrize("what,rel,exists", LINKS, ids=[x[0] for x in LINKS])
def test_repair_apply_never_writes_through_a_link(tmp_path, what, rel, exists):
    _require("repair")
    store = _copy(tmp_path, "crash_torn")  # damaged: the repair truncates, fixes CQ, index, checkpoint
    outside = tmp_path / "outside"
    outside.mkdir()
    target = _plant(store, outside, rel, exists)
    before = snapshot(outside)
    res = _repair_apply(store, tmp_path)
    _no_traceback(res)
    assert snapshot(outside) == before, f"repair wrote through the {what} link: {res.stdout}{res.stderr}"
    assert exists or not target.exists()


def test_repair_rebuild_to_never_writes_through_a_link(tmp_path):
    _require("repair")
    store = _copy(tmp_path, "clean")
    outside = tmp_path / "outside"
    (outside / "TopicTest").mkdir(parents=True)
    to = tmp_path / "rebuilt"
    (to / "consumequeue").mkdir(parents=True)
    (to / "consumequeue" / "TopicTest").symlink_to(outside / "TopicTest", target_is_directory=True)
    (to / "index").symlink_to(outside, target_is_directory=True)
    res = CliRunner().invoke(cli, ["repair", str(store), "--rebuild-cq", "--rebuild-index", "--to", str(to),
                                   "-f", "json"])
    _no_traceback(res)
    assert not any(outside.rglob("*0*")), sorted(outside.rglob("*"))


CQ_WRONG_SIZE = Path(__file__).resolve().parents[1] / "fixtures" / "bugs" / "cq-wrong-size" / "store"
CQ_RUNS = {
    "append": ["append", "{s}", "--topic", "TopicTest", "--body", "hello"],
    "repair": ["repair", "{s}", "-f", "json"],
}


@pytest.mark.parametrize("cmd", sorted(CQ_RUNS))
def test_a_consume_queue_problem_is_reported_not_crashed(tmp_path, cmd):
    """fixtures/bugs/cq-wrong-size: fixtures/store with TopicTest/0's CQ file cut to 580 bytes
    (recovery.CqProblem objects in appender/repair warnings crashed both; fixed in b9ce84c)."""
    _require(cmd)
    from secutil import run_cli

    store = tmp_path / "s"
    shutil.copytree(CQ_WRONG_SIZE, store)
    r = run_cli([a.replace("{s}", str(store)) for a in CQ_RUNS[cmd]], timeout=60)
    assert r.returncode in (0, 1, 2) and "Traceback" not in r.stderr, r.describe()


# --- fsync failures ---------------------------------------------------------------------------


class _FailingFsync:
    def __init__(self, always: bool):
        self.always = always
        self.calls = 0
        self.failed = 0
        self.real = os.fsync

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.always or self.failed == 0:
            self.failed += 1
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        self.real(fd)


@pytest.mark.parametrize("always", [True, False], ids=["always", "once"])
def test_append_reports_fsync_failure(tmp_path, monkeypatch, always):
    _require("append")
    store = _copy(tmp_path, "clean")
    fsync = _FailingFsync(always)
    monkeypatch.setattr(os, "fsync", fsync)
    res = _append(store)
    _no_traceback(res)
    assert fsync.failed >= 1, "append never called fsync"
    assert res.exit_code == 2, f"fsync EIO reported as success: {res.stdout}{res.stderr}"
    assert '"offset"' not in res.stdout, "a record was acknowledged although its fsync failed"
    lines = [x for x in res.stderr.splitlines() if x.startswith("rmqdump: error")]
    assert lines and ("fsync" in lines[0] or "Input/output error" in lines[0]), res.stderr


@pytest.mark.parametrize("always", [True, False], ids=["always", "once"])
def test_repair_apply_reports_fsync_failure(tmp_path, monkeypatch, always):
    _require("repair")
    store = _copy(tmp_path, "crash_torn")
    fsync = _FailingFsync(always)
    monkeypatch.setattr(os, "fsync", fsync)
    res = _repair_apply(store, tmp_path)
    _no_traceback(res)
    assert fsync.failed >= 1, "repair --apply never called fsync"
    assert res.exit_code == 2, f"fsync EIO reported as success: {res.stdout}{res.stderr}"


def test_repair_rebuild_to_reports_fsync_failure(tmp_path, monkeypatch):
    _require("repair")
    store = _copy(tmp_path, "clean")
    fsync = _FailingFsync(True)
    monkeypatch.setattr(os, "fsync", fsync)
    res = CliRunner().invoke(cli, ["repair", str(store), "--rebuild-cq", "--to", str(tmp_path / "to"), "-f", "json"])
    _no_traceback(res)
    assert fsync.failed >= 1 and res.exit_code == 2, f"{fsync.calls} fsync calls; {res.stdout}{res.stderr}"


# --- locks ------------------------------------------------------------------------------------


@pytest.fixture
def locked(tmp_path):
    """A copy of crash_torn whose broker lock another process holds."""
    store = _copy(tmp_path, "crash_torn")
    code = ("import sys, time; from rmqdump.broker.lock import StoreLock; l = StoreLock(sys.argv[1]).acquire(); "
            "print('locked', flush=True); sys.stdin.read()")
    p = subprocess.Popen([sys.executable, "-c", code, str(store)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout.readline().strip() == "locked"
    yield store, p.pid
    p.stdin.close()
    p.wait(timeout=10)


def test_append_refuses_a_locked_store(locked):
    _require("append")
    store, pid = locked
    before = snapshot(store)
    res = _append(store, "--force")
    _no_traceback(res)
    assert res.exit_code == 2 and str(pid) in res.stderr, res.stderr
    assert snapshot(store) == before


def test_repair_apply_refuses_a_locked_store(locked, tmp_path):
    _require("repair")
    store, pid = locked
    before = snapshot(store)
    res = _repair_apply(store, tmp_path)
    _no_traceback(res)
    assert res.exit_code == 2 and str(pid) in res.stderr, res.stderr
    assert snapshot(store) == before


@pytest.mark.parametrize("cmd", ["append", "repair"])
def test_writers_refuse_a_lock_they_cannot_take(tmp_path, cmd):
    """``lock`` is a directory: no lock can be taken, so nothing is written."""
    _require(cmd)
    store = _copy(tmp_path, "crash_torn" if cmd == "repair" else "clean")
    (store / "lock").unlink()
    (store / "lock").mkdir()
    before = snapshot(store)
    res = _append(store, "--force") if cmd == "append" else _repair_apply(store, tmp_path)
    _no_traceback(res)
    assert res.exit_code == 2, res.stdout + res.stderr
    assert snapshot(store) == before


def test_fsync_file_is_real(tmp_path):
    """Sanity for the fixtures above: the clean copy appends fine (the tests are not vacuous)."""
    _require("append")
    store = _copy(tmp_path, "clean")
    seg = store / "commitlog" / SEG1
    h = sha256_file(seg)
    t0 = time.time()
    res = _append(store)
    assert res.exit_code == 0 and '"offset"' in res.stdout, res.stdout + res.stderr
    assert sha256_file(seg) != h and time.time() - t0 < 30


def _fixture_copy(tmp_path: Path) -> Path:
    dst = tmp_path / "store"
    shutil.copytree(Path(__file__).resolve().parent.parent / "fixtures" / "store", dst)
    return dst


def _hold(code: str, *args: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", code, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


@pytest.mark.skipif(not hasattr(__import__("fcntl"), "F_OFD_SETLK"), reason="no OFD locks here")
def test_an_ofd_lock_holder_is_not_called_process_minus_one(tmp_path):
    """F_GETLK reports pid -1 for an open-file-description lock: the refusal says so in words."""
    _require("append")
    store = _fixture_copy(tmp_path)
    code = ("import fcntl, os, struct, sys; fd = os.open(sys.argv[1], os.O_RDWR); "
            "fcntl.fcntl(fd, fcntl.F_OFD_SETLK, struct.pack('hhqqi4x', fcntl.F_WRLCK, 0, 0, 1, 0)); "
            "print('ready', flush=True); sys.stdin.read()")
    p = _hold(code, str(store / "lock"))
    try:
        before = snapshot(store)
        res = _append(store, "--force")
        _no_traceback(res)
        assert res.exit_code == 2 and "process -1" not in res.stderr, res.stderr
        assert "open-file-description lock" in res.stderr, res.stderr
        assert snapshot(store) == before
    finally:
        p.stdin.close()
        p.wait(timeout=10)


def test_a_quoted_command_line_stays_one_printable_line(tmp_path):
    """The refusal names a process that has the store open by its command line: escapes and newlines in it
    are shown escaped, on the error's one line."""
    _require("append")
    store = _fixture_copy(tmp_path)
    seg = sorted((store / "commitlog").iterdir())[0]
    inner = "import sys; f = open(sys.argv[1], 'rb'); print('ready', flush=True); sys.stdin.read()"
    code = "import os, sys; os.execv(sys.executable, [sys.argv[2], '-c', sys.argv[3], sys.argv[1]])"  # argv[0] is ours
    p = _hold(code, str(seg), "\x1b[2Jfake\nSECOND LINE\u202e", inner)
    try:
        res = _append(store)
        _no_traceback(res)
        err = res.stderr
        assert res.exit_code == 2 and str(p.pid) in err, err
        assert "\x1b" not in err and "\u202e" not in err and len(err.strip().splitlines()) == 1, repr(err)
        assert "\\x1b[2Jfake\\x0aSECOND LINE" in err, repr(err)
    finally:
        p.stdin.close()
        p.wait(timeout=10)
