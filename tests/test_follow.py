"""`scan --follow` / :class:`rmqdump.analysis.follow.Follower` against a store being written concurrently."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import real_store
from rmqdump.analysis.follow import Follower, FollowNotice
from rmqdump.cli import cli
from rmqdump.codec.encoder import encode_fields
from rmqdump.codec.record import Blank, Message
from rmqdump.write.writer import MessageSpec, StoreWriter

FILE_SIZE = 4096  # small segments: the writer rolls (BLANK + new file) many times during a test


def _spec(i: int) -> MessageSpec:
    return MessageSpec("TopicFollow", f"follow body {i} ".encode() * (1 + i % 7), queue_id=i % 3, tags=f"T{i % 4}",
                       keys=f"fk-{i}", uniq_key=f"{i:032X}")


class _Writer:
    """Appends batches in a background thread, syncing after each; ``appended`` lists where they landed."""

    def __init__(self, root: Path, kind: str, batches: int = 12, per_batch: int = 9, pause: float = 0.04):
        self.root, self.kind, self.batches, self.per_batch, self.pause = root, kind, batches, per_batch, pause
        self.appended = []
        self.error: BaseException | None = None
        self._n = 0
        if kind == "appender":
            appender = pytest.importorskip("rmqdump.write.appender")
            geo = appender.StoreGeometry(FILE_SIZE, 600, 500, 2000)
            self._app = appender.LockedAppender(root, create=True, geometry=geo, build_index=False).open()
            self._append, self._sync = self._app.append, self._app.commit
        else:
            self._w = StoreWriter(root, commitlog_file_size=FILE_SIZE, cq_file_size=600, build_index=False)
            self._append, self._sync = self._w.append, self._w.sync
        self.batch()  # the store exists (with one segment) before anyone follows it
        self.thread = threading.Thread(target=self._run, daemon=True)

    def batch(self) -> None:
        for _ in range(self.per_batch):
            self.appended.append(self._append(_spec(self._n)))
            self._n += 1
        self._sync()

    def _run(self) -> None:
        try:
            for _ in range(self.batches - 1):
                time.sleep(self.pause)
                self.batch()
        except BaseException as e:  # surfaced by the test
            self.error = e
        finally:
            if self.kind == "appender":
                self._app.close()
            else:
                self._w.close()

    def start(self) -> _Writer:
        self.thread.start()
        return self

    def join(self) -> None:
        self.thread.join(30)
        assert not self.thread.is_alive()
        if self.error:
            raise self.error


@pytest.mark.parametrize("kind", ["store_writer", "appender"])
def test_follower_sees_every_record_once(tmp_path, kind):
    w = _Writer(tmp_path / "s", kind)
    f = Follower(tmp_path / "s", idle_timeout=1.5, poll_interval=0.01, partial_timeout=5)
    w.start()
    got, notices, blanks = [], [], 0
    for item in f:
        if isinstance(item, Message):
            got.append(item)
        elif isinstance(item, Blank):
            blanks += 1
        else:
            notices.append(item)
    w.join()
    assert f.stop == "idle"
    assert [m.offset for m in got] == [a.offset for a in w.appended]  # each once, in order, none twice
    assert [m.keys[0] for m in got] == [f"fk-{i}" for i in range(len(w.appended))]
    assert all(m.crc_ok for m in got)
    assert blanks >= 5  # it rolled across segments
    assert not [n for n in notices if n.kind != "caught_up"]  # no damage, no odd roll


def test_scan_follow_cli_while_writing(tmp_path):
    w = _Writer(tmp_path / "s", "store_writer", batches=10)
    w.start()
    res = CliRunner().invoke(cli, ["scan", str(tmp_path / "s"), "--follow", "--until-idle", "1.5", "--poll-interval",
                                   "0.01", "-f", "jsonl", "--body", "text"])
    w.join()
    assert res.exit_code == 0, res.output
    rows = [json.loads(x) for x in res.stdout.splitlines()]
    assert [r["offset"] for r in rows] == [a.offset for a in w.appended]
    assert rows[-1]["body"].startswith(f"follow body {len(w.appended) - 1} ")
    assert "damage" not in res.stderr and "follow stopped (no new record for 1.5 s)" in res.stderr


def test_scan_follow_filters_limit_and_from_end(tmp_path):
    w = _Writer(tmp_path / "s", "store_writer", batches=1)
    w.thread.run()  # nothing more to write
    old = len(w.appended)
    res = CliRunner().invoke(cli, ["scan", str(tmp_path / "s"), "-F", "--until-idle", "0.3", "-f", "jsonl",
                                   "--tag", "T1", "-n", "2"])
    assert res.exit_code == 0 and [json.loads(x)["keys"][0] for x in res.stdout.splitlines()] == ["fk-1", "fk-5"]
    with StoreWriter(tmp_path / "s", commitlog_file_size=FILE_SIZE, cq_file_size=600, start_offset=w.appended[-1].offset +
                     w.appended[-1].size, build_index=False) as sw:
        later = threading.Timer(0.3, lambda: (sw.append(_spec(100)), sw.sync()))
        later.start()
        res = CliRunner().invoke(cli, ["scan", str(tmp_path / "s"), "--follow", "--from-end", "--until-idle", "1",
                                       "--poll-interval", "0.01", "-f", "jsonl"])
        later.join()
    assert [json.loads(x)["keys"] for x in res.stdout.splitlines()] == [["fk-100"]]
    assert old == 9


def _record(offset: int, i: int) -> bytes:
    return encode_fields(topic=b"TopicFollow", body=f"partial {i}".encode() * 20, properties=b"KEYS\x01p\x02",
                         queue_id=0, flag=0, queue_offset=i, physical_offset=offset, sys_flag=0,
                         born_timestamp=1, born_addr=b"\x7f\0\0\1", born_port=1, store_timestamp=2,
                         store_addr=b"\x7f\0\0\1", store_port=10911, reconsume_times=0,
                         prepared_transaction_offset=0)


def test_partial_record_at_frontier_is_waited_for(tmp_path):
    (tmp_path / "commitlog").mkdir()
    seg = tmp_path / "commitlog" / "00000000000000000000"
    seg.write_bytes(bytes(FILE_SIZE))
    first, second = _record(0, 0), _record(0, 1)
    second = _record(len(first), 1)
    fd = os.open(seg, os.O_WRONLY)
    os.pwrite(fd, first, 0)
    os.pwrite(fd, second[:40], len(first))  # header and a few fields: the rest still zero
    f = Follower(tmp_path, idle_timeout=1.5, poll_interval=0.01, partial_timeout=10)
    got = []

    def finish():
        time.sleep(0.5)
        os.pwrite(fd, second[40:], len(first) + 40)

    t = threading.Thread(target=finish)
    t.start()
    for item in f:
        got.append(item)
    t.join()
    os.close(fd)
    msgs = [x for x in got if isinstance(x, Message)]
    assert [m.offset for m in msgs] == [0, len(first)] and msgs[1].crc_ok
    assert not [x for x in got if isinstance(x, FollowNotice) and x.kind == "damage"]


def test_torn_tail_is_damage_after_the_partial_timeout(store_copy):
    s = store_copy("crash_torn")
    t0 = time.monotonic()
    f = Follower(s, idle_timeout=30, poll_interval=0.01, partial_timeout=0.5)
    items = list(f)
    assert time.monotonic() - t0 < 10
    assert sum(isinstance(x, Message) for x in items) == 231
    assert f.stop == "damage" and items[-1].kind == "damage" and items[-1].offset == 396985
    res = CliRunner().invoke(cli, ["scan", str(s), "--follow", "--partial-timeout", "0.3", "--until-idle", "5",
                                   "-f", "jsonl", "--poll-interval", "0.01"])
    assert res.exit_code == 1 and len(res.stdout.splitlines()) == 231
    assert "stopped at damage" in res.stderr and "396985" in res.stderr


def test_preallocated_zero_segment_is_not_damage():
    # crash_kill9 has a third, pre-allocated all-zero segment: the frontier is in the second one
    f = Follower(real_store("crash_kill9"), idle_timeout=0.3, poll_interval=0.01)
    items = list(f)
    assert sum(isinstance(x, Message) for x in items) == 464
    assert f.stop == "idle" and f.offset == 338738
    assert not [x for x in items if isinstance(x, FollowNotice) and x.kind != "caught_up"]


def test_roll_without_blank_when_the_next_segment_has_data(tmp_path):
    (tmp_path / "commitlog").mkdir()
    a = tmp_path / "commitlog" / "00000000000000000000"
    b = tmp_path / "commitlog" / f"{FILE_SIZE:020d}"
    r0 = _record(0, 0)
    a.write_bytes(r0 + bytes(FILE_SIZE - len(r0)))
    r1 = _record(FILE_SIZE, 1)
    b.write_bytes(r1 + bytes(FILE_SIZE - len(r1)))
    items = list(Follower(tmp_path, idle_timeout=0.3, poll_interval=0.01, partial_timeout=0.3))
    assert [x.offset for x in items if isinstance(x, Message)] == [0, FILE_SIZE]
    (n,) = [x for x in items if isinstance(x, FollowNotice) and x.kind == "rolled_without_blank"]
    assert f"[{len(r0)}, {FILE_SIZE})" in n.detail


def test_stop_event_and_single_segment_file(tmp_path):
    seg = real_store("clean") / "commitlog" / "00000000000000262144"
    f = Follower(seg, poll_interval=0.01)
    threading.Timer(0.5, f.request_stop).start()
    items = list(f)
    assert f.stop == "stopped"
    assert [x.offset for x in items if isinstance(x, Message)][0] == 262144
    assert sum(isinstance(x, Message) for x in items) == 57


def test_sigint_stops_cleanly(tmp_path):
    w = _Writer(tmp_path / "s", "store_writer", batches=1)
    w.thread.run()
    proc = subprocess.Popen([sys.executable, "-m", "rmqdump.cli", "scan", str(tmp_path / "s"), "--follow",
                             "-f", "jsonl", "--poll-interval", "0.01"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(len(w.appended))]
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert [json.loads(x)["offset"] for x in lines] == [a.offset for a in w.appended] and out == ""
    assert "follow stopped (interrupted)" in err and "Traceback" not in err


@pytest.mark.parametrize("args", [["--follow", "--no-crc"], ["--follow", "--keep-going"], ["--from-end"],
                                  ["--until-idle", "1"]])
def test_follow_option_combinations_are_usage_errors(args):
    res = CliRunner().invoke(cli, ["scan", str(real_store("clean")), *args])
    assert res.exit_code == 2 and "Error:" in res.output
