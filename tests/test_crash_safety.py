"""kill -9 the appender at random points of a bulk append; repair; every acknowledged record survives.

The appender prints (here: writes to a pipe) each acknowledgement only after its commit
returned (data, metadata and directories fsynced). After SIGKILL at a random moment,
``repair --apply`` must leave a store whose every acknowledged record is present and
intact (commitlog, ConsumeQueue and index), which ``verify`` finds clean and the appender
accepts again. The store lives on tmpfs (/dev/shm) when available: SIGKILL leaves the page
cache intact either way, and tmpfs keeps 50+ runs fast on 2 cores. A few runs use the
real CLI (``python -m rmqdump.cli append --jsonl``) as a subprocess on the test's disk.
"""

from __future__ import annotations

import base64
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from rmqdump.analysis.verify import verify_store
from rmqdump.codec.record import END_OF_DATA, Message
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.consumequeue import ConsumeQueue
from rmqdump.store.indexfile import IndexStore
from rmqdump.write.appender import StoreGeometry, bulk_append, inspect_store
from rmqdump.write.repair import apply_plan
from rmqdump.write.writer import MessageSpec, StoreWriter

try:  # the index writer imports numpy lazily; do it before forking
    import numpy  # noqa: F401
except ImportError:  # pragma: no cover
    pass

GEO = StoreGeometry(64 * 1024, 600, 100, 400)  # small files: many segment, CQ and index rolls
KILL_POINTS = 50
RECORDS = 600


def spec(i: int) -> MessageSpec:
    body = (f"crash-safety body {i} ".encode() * (1 + (i * 7) % 40))[: 30 + (i * 131) % 3000]
    return MessageSpec(f"Crash{i % 3}", body, queue_id=i % 4, tags=f"T{i % 5}", keys=f"ck-{i} grp-{i // 10}",
                       properties={"i": str(i)})


def seed(path: Path) -> None:
    with StoreWriter(path, commitlog_file_size=GEO.commitlog_file_size, cq_file_size=GEO.cq_file_size,
                     index_slots=GEO.index_slots, index_entries=GEO.index_entries) as w:
        for i in range(40):
            w.append(MessageSpec("Seed", b"seed %d" % i, queue_id=i % 2, keys=f"seed-{i}"))
        w.sync()
    (path / "lock").write_bytes(b"lock")


@pytest.fixture
def workdir(tmp_path):
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        d = shm / f"rmqdump-crash-{os.getpid()}-{random.randrange(1 << 30)}"
        d.mkdir()
        yield d
        shutil.rmtree(d, ignore_errors=True)
    else:
        yield tmp_path


def run_forked(store: Path, batch: int) -> tuple[int, callable]:
    """Start a bulk append in a forked child; returns (pid, reader of the acknowledgement lines)."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: append, acknowledge after each commit, never return into pytest
        code = 0
        try:
            os.close(rfd)

            def ack(a) -> None:
                os.write(wfd, f"{a.offset} {a.size} {a.queue_offset} {a.uniq_key}\n".encode())

            bulk_append(store, (spec(i) for i in range(RECORDS)), batch_bytes=batch, on_ack=ack)
        except BaseException:  # noqa: BLE001 - report through the exit code
            code = 3
        finally:
            os._exit(code)
    os.close(wfd)
    chunks: list[bytes] = []
    first_ack: list[float] = []
    acked = [0]

    def drain() -> None:  # keep the pipe empty so the child never blocks on an acknowledgement
        while True:
            chunk = os.read(rfd, 1 << 16)
            if not chunk:
                break
            if not chunks:
                first_ack.append(time.monotonic())
            chunks.append(chunk)
            acked[0] += chunk.count(b"\n")
        os.close(rfd)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()

    def read() -> list[str]:
        read.first_ack = first_ack[0] if first_ack else None
        reader.join(timeout=60)
        assert not reader.is_alive(), "the acknowledgement pipe was not closed"
        return b"".join(chunks).decode().split("\n")[:-1]  # a line cut by the kill has no newline: not an ack

    read.acked = lambda: acked[0]
    return pid, read


def kill_after(pid: int, read, acks: int, jitter: float) -> int:
    """SIGKILL the child once it has acknowledged ``acks`` records (0: at once), ``jitter`` seconds later;
    returns its wait status. Progress, not wall-clock time, picks the point: a slow machine still
    gets its kills inside the write phase."""
    deadline = time.monotonic() + 120
    while read.acked() < acks and time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.0005)
    time.sleep(jitter)
    os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


def check_store(store: Path, acks: list[tuple[int, ...]], full: bool) -> None:
    """Every acknowledged record intact and reachable; nothing torn is accepted."""
    walk = CommitLog.open(store).walk()
    msgs = {m.offset: m for m in walk if isinstance(m, Message)}
    assert walk.stop.kind == END_OF_DATA, walk.stop
    appended = [m for m in msgs.values() if m.topic.startswith("Crash")]
    assert len(appended) >= len(acks)
    for i, (off, size, qoff, uniq) in enumerate(acks):
        m = msgs.get(off)
        s = spec(i)
        assert m is not None, f"acknowledged record {i} at {off} is gone"
        assert (m.size, m.queue_offset, m.uniq_key, m.topic, m.queue_id) == (size, qoff, uniq, s.topic, s.queue_id)
        assert m.crc_ok and m.properties["i"] == str(i)
        if full or i % 25 == 0:
            e = ConsumeQueue.open(store, s.topic, s.queue_id).entry_at(qoff)
            assert (e.commit_log_offset, e.size) == (off, size)
    with IndexStore(store) as idx:
        sample = acks if full else acks[::50] + acks[-3:]
        for off, _size, _qoff, uniq in sample:
            topic = msgs[off].topic
            assert off in idx.query(topic, uniq).phy_offsets
    if full:
        errors = [f for f in verify_store(store).findings if f.severity == "error"]
        assert errors == [], errors
    st = inspect_store(store)
    assert st.dirty == [] and st.overwrite == []


def test_kill9_at_random_points_then_repair(workdir):
    rng = random.Random(int(os.environ.get("RMQDUMP_CRASH_SEED", "5")))
    base = workdir / "seed"
    seed(base)
    # calibrate: how long an uninterrupted run takes (and that it completes)
    cal = workdir / "cal"
    shutil.copytree(base, cal)
    t0 = time.monotonic()
    pid, read = run_forked(cal, 8192)
    _, status = os.waitpid(pid, 0)
    duration = time.monotonic() - t0
    lines = read()
    writing_from = read.first_ack - t0  # inspection and locking are over, batches are being committed
    assert os.WEXITSTATUS(status) == 0 and len(lines) == RECORDS
    check_store(cal, [_parse(x) for x in lines], full=True)
    shutil.rmtree(cal)

    killed = mid_write = 0
    started = time.monotonic()
    for n in range(3 * KILL_POINTS):
        if mid_write >= KILL_POINTS:
            break
        store = workdir / f"s{n}"
        shutil.copytree(base, store)
        pid, read = run_forked(store, rng.choice((2048, 8192, 32768)))
        # mostly inside the write phase (after a random number of acknowledgements), some during start-up
        if n % 8 == 7:
            status = kill_after(pid, read, 0, rng.uniform(0, writing_from))
        else:
            status = kill_after(pid, read, rng.randrange(1, RECORDS - 20), rng.uniform(0, 0.003))
        acks = [_parse(x) for x in read()]
        if os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL:
            killed += 1
            mid_write += (store / "abort").exists()
        apply_plan(store, backup_dir=workdir / f"bk{n}")
        check_store(store, acks, full=n % 8 == 0)
        if n % 10 == 0:  # the repaired store takes appends again
            res = bulk_append(store, [spec(RECORDS + 1)])
            assert res.records == 1
        shutil.rmtree(store)
        shutil.rmtree(workdir / f"bk{n}", ignore_errors=True)
    elapsed = time.monotonic() - started
    print(f"\ncrash safety: {killed} kill -9 points ({mid_write} with the abort marker present, i.e. inside the "
          f"write phase), uninterrupted run {duration:.2f} s, total {elapsed:.1f} s")
    assert mid_write >= KILL_POINTS and killed > mid_write


def _parse(line: str) -> tuple[int, int, int, str]:
    off, size, qoff, uniq = line.split()
    return int(off), int(size), int(qoff), uniq


def test_kill9_the_cli_appender(tmp_path):
    """The real command line, killed while it streams JSONL in: acknowledged lines survive repair."""
    base = tmp_path / "seed"
    seed(base)
    jl = tmp_path / "in.jsonl"
    with jl.open("w") as f:
        for i in range(3000):
            s = spec(i)
            f.write(json.dumps({"topic": s.topic, "queue_id": s.queue_id, "tags": s.tags, "keys": s.keys.split(),
                                "body": base64.b64encode(s.body).decode()}) + "\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    rng = random.Random(11)
    for n in range(3):
        store = tmp_path / f"c{n}"
        shutil.copytree(base, store)
        proc = subprocess.Popen([sys.executable, "-m", "rmqdump.cli", "append", str(store), "--jsonl", str(jl),
                                 "--batch-bytes", "4096", "-f", "jsonl", "-q"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env)
        first = proc.stdout.readline()  # the appender is running and has acknowledged a batch
        time.sleep(rng.uniform(0, 0.5))
        proc.kill()
        rest = proc.stdout.read()  # the same buffered reader as the first line
        proc.wait(timeout=60)
        proc.stderr.close()
        lines = (first + rest).decode().split("\n")[:-1]
        acks = [json.loads(x) for x in lines]
        assert acks, "nothing was acknowledged before the kill"
        apply_plan(store, backup_dir=tmp_path / f"bk{n}")
        msgs = {m.offset: m for m in CommitLog.open(store).walk() if isinstance(m, Message)}
        for i, a in enumerate(acks):
            m = msgs[a["offset"]]
            assert (m.msg_id, m.uniq_key, m.queue_offset) == (a["msg_id"], a["uniq_key"], a["queue_offset"])
            assert m.body == spec(i).body
        assert [f for f in verify_store(store).findings if f.severity == "error"] == []
