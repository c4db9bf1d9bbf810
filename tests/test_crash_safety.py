"""kill -9 the appender at random points of a bulk append; repair; every acknowledged record survives.

The appender prints (here: writes to a pipe) each acknowledgement only after its commit
returned (data, metadata and directories fsynced). After SIGKILL at a random moment,
``repair --apply`` must leave a store whose every acknowledged record is present and
intact (commitlog, ConsumeQueue and index), which ``verify`` finds clean and the appender
accepts again. The store lives on tmpfs (/dev/shm) when available: SIGKILL leaves the page
cache intact either way, and tmpfs keeps 50+ runs fast on 2 cores. The real CLI
(``python -m rmqdump.cli append --jsonl``) is killed >= 50 times too, as a subprocess, once it
has printed a random number of acknowledgements; RocketMQ judges a sample (``-m oracle``).
``tests/test_crash_repair.py`` does the same to ``repair --apply``.
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
    assert mid_write >= KILL_POINTS and killed >= mid_write


def _parse(line: str) -> tuple[int, int, int, str]:
    off, size, qoff, uniq = line.split()
    return int(off), int(size), int(qoff), uniq


CLI_KILLS = 50


def _jsonl(path: Path, n: int = 3000) -> None:
    with path.open("w") as f:
        for i in range(n):
            s = spec(i)
            f.write(json.dumps({"topic": s.topic, "queue_id": s.queue_id, "tags": s.tags, "keys": s.keys.split(),
                                "properties": s.properties, "body": base64.b64encode(s.body).decode()}) + "\n")


def kill_cli_appender(store: Path, jl: Path, acks: int, delay: float, batch: int) -> tuple[list[dict], bool, bool]:
    """Run ``rmqdump append STORE --jsonl`` (the real CLI) and SIGKILL it once it has printed ``acks``
    acknowledgements (0: ``delay`` seconds after its start). Returns (acknowledgements, killed, whether
    the kill landed inside the write phase: the appender's ``abort`` marker is there)."""
    proc = subprocess.Popen([sys.executable, "-m", "rmqdump.cli", "append", str(store), "--jsonl", str(jl),
                             "--batch-bytes", str(batch), "-f", "jsonl", "-q"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    lines: list[bytes] = []
    if acks == 0:
        time.sleep(delay)
    else:
        while len(lines) < acks:
            line = proc.stdout.readline()
            if not line:
                break
            lines.append(line)
    proc.kill()
    rest = proc.stdout.read()  # the same buffered reader as the lines before
    proc.wait(timeout=60)
    err = proc.stderr.read().decode("utf-8", "replace")
    proc.stderr.close()
    proc.stdout.close()
    assert proc.returncode in (0, -signal.SIGKILL), err
    text = (b"".join(lines) + rest).decode()
    done = text.split("\n")[:-1]  # a line cut by the kill has no newline: not an acknowledgement
    return [json.loads(x) for x in done], proc.returncode == -signal.SIGKILL, (store / "abort").exists()


def check_cli_acks(store: Path, acks: list[dict], full: bool) -> None:
    """Every acknowledged line's record is there, intact (body, ids, queue position, ConsumeQueue and index
    entries); nothing torn is accepted; the store is clean for the appender; ``verify`` clean (``full``)."""
    walk = CommitLog.open(store).walk()
    msgs = {m.offset: m for m in walk if isinstance(m, Message)}
    assert walk.stop.kind == END_OF_DATA, walk.stop
    assert len([m for m in msgs.values() if m.topic.startswith("Crash")]) >= len(acks)
    with IndexStore(store) as idx:
        for i, a in enumerate(acks):
            m = msgs.get(a["offset"])
            assert m is not None, f"acknowledged record {i} at {a['offset']} is gone"
            assert (m.msg_id, m.uniq_key, m.queue_offset, m.size) == (a["msg_id"], a["uniq_key"], a["queue_offset"],
                                                                      a["size"])
            assert m.crc_ok and m.body == spec(i).body and m.properties["i"] == str(i)
            if full or i % 20 == 0 or i == len(acks) - 1:
                e = ConsumeQueue.open(store, m.topic, m.queue_id).entry_at(m.queue_offset)
                assert (e.commit_log_offset, e.size) == (m.offset, m.size)
                assert m.offset in idx.query(m.topic, f"ck-{i}").phy_offsets
    if full:
        assert [f for f in verify_store(store).findings if f.severity == "error"] == []
    st = inspect_store(store)
    assert st.dirty == [] and st.overwrite == [] and st.abort is None


def test_kill9_the_cli_appender(workdir):
    """The real command line, killed >= 50 times while it streams JSONL in, at a random number of
    acknowledgements (a few at start-up): every acknowledged line survives repair."""
    base = workdir / "seed"
    seed(base)
    jl = workdir / "in.jsonl"
    _jsonl(jl)
    rng = random.Random(int(os.environ.get("RMQDUMP_CRASH_SEED", "11")))
    killed = mid_write = acked = 0
    started = time.monotonic()
    for n in range(3 * CLI_KILLS):
        if mid_write >= CLI_KILLS:
            break
        store = workdir / f"c{n}"
        shutil.copytree(base, store)
        target = 0 if n % 10 == 9 else rng.randrange(1, 700)
        acks, was_killed, inside = kill_cli_appender(store, jl, target, rng.uniform(0, 0.6),
                                                     rng.choice((2048, 4096, 16384)))
        killed += was_killed
        mid_write += was_killed and inside
        acked += len(acks)
        apply_plan(store, backup_dir=workdir / f"cbk{n}")
        check_cli_acks(store, acks, full=n % 5 == 0)
        shutil.rmtree(store)
        shutil.rmtree(workdir / f"cbk{n}", ignore_errors=True)
    print(f"\nreal CLI appender: {killed} kill -9 of `rmqdump append --jsonl`, {mid_write} inside the write phase "
          f"(abort marker present), {acked} acknowledged records, 0 lost; {time.monotonic() - started:.1f} s")
    assert mid_write >= CLI_KILLS


@pytest.mark.oracle
def test_rocketmq_reads_every_acknowledged_record_after_a_cli_kill(workdir):
    """RocketMQ 4.9.8 judges a sample: after kill -9 of the CLI appender and repair, it loads the store
    and reads back every acknowledged record (offset, msgId, UNIQ_KEY, queue position, body)."""
    from oracle.harness import cq_entries, load, unavailable_reason

    reason = unavailable_reason("498")
    if reason:
        pytest.skip(reason)
    base = workdir / "seed"
    seed(base)
    jl = workdir / "in.jsonl"
    _jsonl(jl, 1500)
    args = [str(GEO.commitlog_file_size), str(GEO.cq_file_size), str(GEO.index_slots), str(GEO.index_entries)]
    for n, target in enumerate((37, 301, 888)):
        store = workdir / f"o{n}"
        shutil.copytree(base, store)
        acks, _, _ = kill_cli_appender(store, jl, target, 0, 4096)
        apply_plan(store, backup_dir=workdir / f"obk{n}")
        manifest = load("498", store, args)
        assert next(m for m in manifest if m["type"] == "store_info")["load_ok"]
        read = {m["commitLogOffset"]: m for m in manifest if m["type"] == "message"}
        entries = cq_entries(manifest)
        for i, a in enumerate(acks):
            m = read.get(a["offset"])
            assert m is not None, f"RocketMQ does not read acknowledged record {i} at {a['offset']}"
            assert (m["msgId_offset"], m["uniqKey"], m["queueOffset"]) == (a["msg_id"], a["uniq_key"],
                                                                           a["queue_offset"])
            assert base64.b64decode(m["body_b64"]) == spec(i).body
            assert entries[(a["topic"], a["queue_id"], a["queue_offset"])][:2] == (a["offset"], a["size"])
