"""A real race: several ``rmqdump append`` processes released at once on one store; exactly one wins.

Each round starts ``RACERS`` real CLI appenders (``--jsonl -``) that import, then wait on one shared
pipe; closing its write end releases them together into the lock. The winner holds the broker's
lock while its stdin stays open (it has acknowledged its first records and waits for more); the
others must be refused with the lock error naming the winner, exit 2, and write nothing. Then the
winner's stdin is closed: it commits the rest and exits 0. Across the rounds every acknowledged
record is in the store (commitlog and ConsumeQueue), ``verify`` is clean and the store takes the
next round's appender as if nothing had happened.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time

from rmqdump.analysis.verify import verify_store
from rmqdump.codec.record import END_OF_DATA, Message
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.consumequeue import ConsumeQueue
from rmqdump.write.appender import inspect_store

RACERS = 4
ROUNDS = 5
# imports first (start-up time must not decide the race), then wait for the release, then the real CLI
RACER = ("import os, sys; from rmqdump.cli import main; print('ready', flush=True); "
         "os.read(int(sys.argv[1]), 1); sys.argv[0] = 'rmqdump'; main(sys.argv[2:])")


def _line(proc: subprocess.Popen, timeout: float = 60) -> str:
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    ready = sel.select(timeout)
    sel.close()
    assert ready, "no answer in time"
    return proc.stdout.readline()


def _record(rnd: int, racer: int, k: int) -> str:
    body = f"race round {rnd} racer {racer} record {k}".encode().hex()
    return json.dumps({"queue_id": k % 2, "keys": [f"r{rnd}-{racer}-{k}"], "body": body}) + "\n"


def _round(store, rnd: int) -> list[dict]:
    """One race; returns the winner's acknowledgements."""
    release_r, release_w = os.pipe()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), NO_COLOR="1")
    procs = []
    try:
        for _ in range(RACERS):
            procs.append(subprocess.Popen(
                [sys.executable, "-c", RACER, str(release_r), "append", str(store), "--jsonl", "-", "-t", "RaceTopic",
                 "--body-encoding", "hex", "--batch-bytes", "1", "-f", "jsonl", "-q"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                pass_fds=(release_r,)))
        for p in procs:
            assert _line(p).strip() == "ready"
            p.stdin.write(_record(rnd, procs.index(p), 0))  # every racer has a record to write at once
            p.stdin.flush()
    finally:
        os.close(release_r)
        os.close(release_w)  # EOF on the pipe: all racers go at once
    deadline = time.monotonic() + 60
    while sum(p.poll() is not None for p in procs) < RACERS - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    running = [p for p in procs if p.poll() is None]
    assert len(running) == 1, f"round {rnd}: {len(running)} appenders still hold on (want exactly one winner)"
    winner = running[0]
    first = json.loads(_line(winner))  # acknowledged while the others were refused
    for p in procs:
        if p is winner:
            continue
        err = p.stderr.read()
        assert p.wait() == 2, (rnd, p.returncode, err)
        assert f"locked by process {winner.pid}" in err and len(err.strip().splitlines()) == 1, (rnd, err)
        assert p.stdout.read() == "", "a refused appender acknowledged something"
    w = procs.index(winner)
    for k in range(1, 4):
        winner.stdin.write(_record(rnd, w, k))
    winner.stdin.close()
    rest = winner.stdout.read()
    assert winner.wait(timeout=60) == 0, winner.stderr.read()
    for p in procs:
        for stream in (p.stdout, p.stderr):
            stream.close()
    acks = [first] + [json.loads(x) for x in rest.splitlines()]
    assert len(acks) == 4
    return [dict(a, racer=w) for a in acks]


def test_concurrent_appenders_one_wins_each_round(store_copy):
    store = store_copy("clean")
    before = {m.offset for m in CommitLog.open(store).walk() if isinstance(m, Message)}
    acked: list[dict] = []
    for rnd in range(ROUNDS):
        acked += _round(store, rnd)
    walk = CommitLog.open(store).walk()
    msgs = {m.offset: m for m in walk if isinstance(m, Message)}
    assert walk.stop.kind == END_OF_DATA
    assert len(msgs) == len(before) + len(acked), "records beyond the winners' acknowledged ones were written"
    by_round: dict[int, int] = {}
    for a in acked:
        m = msgs[a["offset"]]
        assert m.crc_ok and (m.msg_id, m.queue_offset, m.topic) == (a["msg_id"], a["queue_offset"], "RaceTopic")
        rnd, racer, k = (int(x) for x in m.keys[0][1:].split("-"))
        assert racer == a["racer"] and m.body == f"race round {rnd} racer {racer} record {k}".encode()
        by_round.setdefault(rnd, racer)
        assert by_round[rnd] == racer, "two racers wrote in one round"
        e = ConsumeQueue.open(store, "RaceTopic", m.queue_id).entry_at(m.queue_offset)
        assert (e.commit_log_offset, e.size) == (m.offset, m.size)
    assert sorted(by_round) == list(range(ROUNDS))
    assert [f for f in verify_store(store).findings if f.severity == "error"] == []
    st = inspect_store(store)
    assert st.dirty == [] and st.abort is None
