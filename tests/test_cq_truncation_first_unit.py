"""``truncateDirtyLogicFiles`` keeps the first unit of a queue's last file unchecked (its ``i == 0`` branch tests
only the offset against the commitlog end). A file starting at the queue's recovered end, first unit not
written (a crash between creating the file and writing it), so gains a unit that is no message: RocketMQ 4.9.8
read back such a queue with max offset 1 and entry (0, 0, 0) in CI, where rmqdump predicted 0. The oracle
matrix holds the RocketMQ side (``zero-cq-queue``); here the truncation against the Java loop, unit by unit,
and what verify and repair make of it on the bundled store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from rmqdump.broker.recovery import queues as Q
from rmqdump.cli import cli
from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, CQ_UNIT
from rmqdump.store.root import Store

PER_FILE = 8
FILE = PER_FILE * CQ_STORE_UNIT_SIZE
END = 1000  # the commitlog end (processOffset)
FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "store"


def _java_truncation(files: list[list[tuple[int, int, int]]], phy: int) -> int:
    """``ConsumeQueue.truncateDirtyLogicFiles(phy)`` over the files ``recover()`` kept (units per file): the
    queue's max offset after it, unit by unit as the Java loop reads them."""
    files = list(files)
    while files:
        units = files[-1]
        base = (len(files) - 1) * PER_FILE
        for i, (off, size, _) in enumerate(units):
            if i == 0:
                if off >= phy:
                    files.pop()  # deleteLastMappedFile
                    break
                wrote = 1
            elif off >= 0 and size > 0:
                if off >= phy:
                    return base + wrote
                wrote = i + 1
                if wrote == PER_FILE:
                    return base + wrote
            else:
                return base + wrote
        else:
            return base + wrote
    return 0


FULL = [(i * 10, 10, 0) for i in range(PER_FILE)]
ZERO = (0, 0, 0)
#: the second (last) file, which starts at the queue's recovered end since its first unit is not valid
LAST_FILES = {
    "all zero": [ZERO] * PER_FILE,
    "valid units after the unwritten first": [ZERO, (100, 10, 0), (110, 10, 0), (END, 10, 0)] + [ZERO] * 4,
    "size 0, offset below the end": [(500, 0, 0), (100, 10, 0)] + [ZERO] * 6,
    "negative offset": [(-5, 10, 0)] + [ZERO] * 7,
    "first offset at the end: deleted": [(END, 0, 0), (100, 10, 0)] + [ZERO] * 6,
}


def _store(root: Path, last: list[tuple[int, int, int]]) -> Path:
    (root / "commitlog").mkdir(parents=True)
    (root / "commitlog" / ("0" * 20)).write_bytes(bytes(4096))
    qdir = root / "consumequeue" / "T" / "0"
    qdir.mkdir(parents=True)
    for i, units in enumerate((FULL, last)):
        (qdir / f"{i * FILE:020d}").write_bytes(b"".join(CQ_UNIT.pack(*u) for u in units))
    return qdir


@pytest.mark.parametrize("path", ["chunks", "unit by unit"])
@pytest.mark.parametrize("case", LAST_FILES)
def test_truncation_is_the_java_loop(tmp_path, monkeypatch, case, path):
    _store(tmp_path, LAST_FILES[case])
    if path == "unit by unit":  # the reader's path (files not whole or not alone at their place)
        monkeypatch.setattr(Q, "_file_keep", lambda *a: None)
    (st,), problems = Q.consume_queue_states(Store.open(tmp_path))
    assert problems == [] and st.max_offset == PER_FILE  # recover() stops at the second file's first unit
    cut = Q.cq_truncation(st, END, True)
    assert cut.new_end == _java_truncation([FULL, LAST_FILES[case]], END)
    first = LAST_FILES[case][0]
    if first[0] < END:
        assert cut.kept_invalid == (PER_FILE, first[0], first[1])
    else:
        assert cut.kept_invalid is None and cut.new_end == PER_FILE
    # valid units past the end that the truncation does not keep are dropped
    assert cut.dropped == [(PER_FILE + i, u[0]) for i, u in enumerate(LAST_FILES[case])
                           if PER_FILE + i >= cut.new_end and u[0] >= 0 and u[1] > 0]
    # no truncation (the queues end below the commitlog's end): nothing changes
    assert Q.cq_truncation(st, END, False).new_end == PER_FILE


def _verify(store: Path) -> dict:
    res = CliRunner().invoke(cli, ["verify", str(store), "-f", "json", "-q"])
    assert res.exit_code in (0, 1), res.output
    return json.loads(res.stdout)


def test_verify_and_repair_on_a_store(tmp_path):
    """The bundled store (shut down cleanly, its queues reach the commitlog's end: normal recovery truncates
    them) with an unwritten first file of a new queue: verify says the broker keeps an entry there, repair
    deletes the file (backed up) and RocketMQ's recovery then keeps nothing."""
    store = tmp_path / "store"
    shutil.copytree(FIXTURE, store)
    qfile = store / "consumequeue" / "TopicTest" / "9" / ("0" * 20)
    qfile.parent.mkdir()
    size = next((store / "consumequeue" / "TopicTest" / "0").iterdir()).stat().st_size
    qfile.write_bytes(bytes(size))
    doc = _verify(store)
    rec = doc["recovery"]
    assert rec["cq_truncated"]
    assert rec["invalid_cq_units_kept"] == {
        "TopicTest/9": {"queue_offset": 0, "commitlog_offset": 0, "size": 0, "new_max_offset": 1}}
    (f,) = [f for f in doc["findings"] if f["kind"] == "recovery_keeps_invalid_cq_unit"]
    assert (f["severity"], f["file"], f["offset"]) == ("warning", "consumequeue/TopicTest/9/" + "0" * 20, 0)
    text = CliRunner().invoke(cli, ["verify", str(store)], env={"COLUMNS": "200"}).output
    assert "invalid CQ units kept" in text and "TopicTest/9 at 0" in text

    res = CliRunner().invoke(cli, ["repair", str(store), "-f", "json"])  # the plan says so
    assert res.exit_code == 1, res.output
    steps = [s for s in json.loads(res.stdout)["steps"] if s["group"] == "consumequeue"]
    assert [(s["action"], s["queue"], s["files"]) for s in steps] == [("delete", "TopicTest/9", ["0" * 20])]
    res = CliRunner().invoke(cli, ["repair", str(store), "--apply", "--backup-dir", str(tmp_path / "bk"), "-q"])
    assert res.exit_code == 0, res.output
    assert not qfile.exists()
    after = _verify(store)
    assert after["recovery"]["invalid_cq_units_kept"] == {}
    assert after["findings"] == _verify(FIXTURE)["findings"]
    res = CliRunner().invoke(cli, ["repair", "--undo", str(tmp_path / "bk"), "-q"])
    assert res.exit_code == 0, res.output
    assert qfile.read_bytes() == bytes(size)
