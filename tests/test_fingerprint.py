"""`rmqdump fingerprint`: digests per segment and per consume-queue file, compared across copies of real stores."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from rmqdump.analysis.fingerprint import compare_fingerprints, fingerprint_store
from rmqdump.cli import cli
from rmqdump.codec.record import Message
from rmqdump.store.commitlog import CommitLog

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SEG = "00000000000000004096"
ORACLE = sorted(p.parent.parent.name for p in (FIXTURES / "oracle").glob("*/store/commitlog"))  # not DLedger


def copy_store(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, symlinks=True)
    return dst


def first_message(store: Path, start: int) -> Message:
    return next(r for r in CommitLog.open(store).walk(start=start, read_body=True) if isinstance(r, Message))


def flip_body_byte(store: Path, start: int = 4096) -> int:
    """Flip one byte in the body of the first record at or after ``start``; its commitlog offset."""
    msg = first_message(store, start)
    seg = CommitLog.open(store).segment_for(msg.offset)
    data = bytearray(seg.path.read_bytes())
    pos = data.index(msg.body, msg.file_pos, msg.file_pos + msg.size) + len(msg.body) // 2
    data[pos] ^= 0x20
    seg.path.write_bytes(bytes(data))
    return seg.start + pos


def change_cq_entry(store: Path, topic: str = "TopicTest", qid: int = 0, unit: int = 1) -> None:
    p = store / "consumequeue" / topic / str(qid) / "00000000000000000000"
    data = bytearray(p.read_bytes())
    data[unit * 20 + 19] ^= 0x01  # the low byte of its tagsCode
    p.write_bytes(bytes(data))


def fingerprint(path: Path, **kw) -> dict:
    return fingerprint_store(path, version="test", **kw)


def test_identical_copies_have_equal_fingerprints(tmp_path):
    a = copy_store(FIXTURES / "store", tmp_path / "a")
    b = copy_store(FIXTURES / "store", tmp_path / "b")
    fa, fb = fingerprint(a), fingerprint(b)
    assert compare_fingerprints(fa, fb) == []
    assert fa["commitlog"]["segments"] == fb["commitlog"]["segments"]
    assert [s["end"] for s in fa["commitlog"]["segments"]] == ["blank", "blank", "blank", "end_of_data"]
    # bytes in use: up to the last record; a BLANK counts its 8-byte header, never the file's full size
    last = fa["commitlog"]["segments"][-1]
    assert last["used"] == 1560 < last["size"]
    assert fa["commitlog"]["segments"][0]["used"] == fa["commitlog"]["segments"][0]["end_pos"] + 8


def test_zero_tail_and_file_size_do_not_count(tmp_path):
    a = copy_store(FIXTURES / "store", tmp_path / "a")
    b = copy_store(FIXTURES / "store", tmp_path / "b")
    # the BLANK's filler and the unwritten tail of the last segment, and a longer CQ file: other bytes
    seg0 = b / "commitlog" / "00000000000000000000"
    data = bytearray(seg0.read_bytes())
    data[-4:] = b"\x00\x00\x00\x00"
    seg0.write_bytes(bytes(data))
    cq = b / "consumequeue" / "TopicTest" / "0" / "00000000000000000000"
    os.truncate(cq, cq.stat().st_size + 4000)
    assert compare_fingerprints(fingerprint(a), fingerprint(b)) == []


def test_body_flip_changes_only_that_segment(tmp_path):
    a = copy_store(FIXTURES / "store", tmp_path / "a")
    b = copy_store(FIXTURES / "store", tmp_path / "b")
    flip_body_byte(b)
    diffs = compare_fingerprints(fingerprint(a), fingerprint(b))
    assert [(d["part"], d["name"], d["data"]) for d in diffs] == [("commitlog", SEG, True)]
    assert "same length, different bytes" in diffs[0]["detail"]


def test_cq_entry_change_names_that_queue_file(tmp_path):
    a = copy_store(FIXTURES / "store", tmp_path / "a")
    b = copy_store(FIXTURES / "store", tmp_path / "b")
    change_cq_entry(b)
    diffs = compare_fingerprints(fingerprint(a), fingerprint(b))
    assert [(d["part"], d["name"]) for d in diffs] == [("consumequeue", "TopicTest/0")]
    assert "00000000000000000000" in diffs[0]["detail"]


def test_slave_behind_differs_in_bytes_in_use(tmp_path):
    a = copy_store(FIXTURES / "store", tmp_path / "a")
    b = copy_store(FIXTURES / "store", tmp_path / "b")
    last = b / "commitlog" / "00000000000000012288"
    msg = first_message(b, 12288)
    data = bytearray(last.read_bytes())
    data[msg.size:] = bytes(len(data) - msg.size)  # B holds only the first record of the last segment
    last.write_bytes(bytes(data))
    diffs = compare_fingerprints(fingerprint(a), fingerprint(b))
    assert [(d["part"], d["name"], d["a"], d["b"]) for d in diffs] == [
        ("commitlog", "00000000000000012288", 1560, msg.size)]


@pytest.mark.parametrize("name", ORACLE + ["store"])
def test_compiled_and_pure_paths_agree(name, monkeypatch):
    """The segment extent comes from the compiled walk on big segments, the pure walk on small ones."""
    from rmqdump.fast.engine import fast_available

    if not fast_available():
        pytest.skip("no compiled path here")
    path = FIXTURES / name if name == "store" else FIXTURES / "oracle" / name / "store"
    monkeypatch.setenv("RMQDUMP_FAST", "0")
    pure = fingerprint(path)
    monkeypatch.setenv("RMQDUMP_FAST", "1")
    assert fingerprint(path) == pure


def test_damaged_segment_covers_bytes_past_the_damage(tmp_path):
    """A walk stopped by damage: the digest runs to the last non-zero byte, so bytes after it count."""
    a = copy_store(FIXTURES / "store", tmp_path / "a")
    b = copy_store(FIXTURES / "store", tmp_path / "b")
    for s in (a, b):  # the same damage (a wrong TOTALSIZE) at the second record of segment 4096
        p = s / "commitlog" / SEG
        data = bytearray(p.read_bytes())
        data[195:199] = (7).to_bytes(4, "big")
        p.write_bytes(bytes(data))
    fa = fingerprint(a)
    seg = next(x for x in fa["commitlog"]["segments"] if x["file"] == SEG)
    assert seg["end"] not in ("blank", "end", "end_of_data") and seg["used"] > 195
    assert compare_fingerprints(fa, fingerprint(b)) == []
    p = b / "commitlog" / SEG
    data = bytearray(p.read_bytes())
    data[3000] ^= 0x20  # a record beyond the damage
    p.write_bytes(bytes(data))
    assert [d["name"] for d in compare_fingerprints(fa, fingerprint(b))] == [SEG]


def test_cli_against(tmp_path):
    a = copy_store(FIXTURES / "store", tmp_path / "a")
    b = copy_store(FIXTURES / "store", tmp_path / "b")
    runner = CliRunner()
    res = runner.invoke(cli, ["fingerprint", str(a), "-f", "json"])
    assert res.exit_code == 0, res.output
    saved = tmp_path / "a.json"
    saved.write_text(res.output)
    assert json.loads(res.output)["commitlog"]["segments"][1]["file"] == SEG
    res = runner.invoke(cli, ["fingerprint", str(b), "--against", str(saved), "-f", "json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["identical"] is True
    flip_body_byte(b)
    res = runner.invoke(cli, ["fingerprint", str(b), "--against", str(saved)])
    assert res.exit_code == 1, res.output
    assert SEG in res.output and "different bytes" in res.output
    (tmp_path / "junk.json").write_text('{"a": 1}')
    res = runner.invoke(cli, ["fingerprint", str(b), "--against", str(tmp_path / "junk.json")])
    assert res.exit_code == 2 and "not an rmqdump fingerprint" in res.output
    assert "Traceback" not in res.output


def _trimmed_reference(path: Path, limit: int, align: int) -> tuple[str, int]:
    """The whole file read, its trailing zeros stripped, rounded up to ``align`` within the zeros present."""
    import hashlib

    data = path.read_bytes()[:limit]
    n = len(data.rstrip(b"\0"))
    n += min(len(data) - n, -n % align)
    return hashlib.blake2b(data[:n], digest_size=32).hexdigest(), n


@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "zeros written"])
def test_trimmed_digest_is_the_whole_file_answer(tmp_path, sparse):
    """A queue file's digest covers its bytes up to the last non-zero one: only the chunks holding data are
    read now (a sparse 6 MB queue file was read whole: a store of 20,000 LMQ queues took over 5 minutes)."""
    import random

    from rmqdump.analysis.fingerprint import _Hasher

    rnd = random.Random(3)
    mib = 1 << 20
    layouts = [[], [(0, 60)], [(0, 60), (mib - 7, 20)], [(5, 3), (3 * mib + 11, 40), (6 * mib - 20, 20)],
               [(4090, 10)], [(mib, 1)]]
    for k, pieces in enumerate(layouts):
        p = tmp_path / f"f{k}"
        with open(p, "wb") as f:
            if not sparse:
                f.write(bytes(6 * mib))
            f.truncate(6 * mib)
            for at, n in pieces:
                f.seek(at)
                f.write(bytes(rnd.randrange(1, 256) for _ in range(n)))
        for limit, align in ((6 * mib, 20), (6 * mib, 1), (mib + 3, 20), (7 * mib, 20)):
            assert _Hasher().trimmed(p, limit, align) == _trimmed_reference(p, limit, align), (pieces, limit, align)


def test_a_sparse_queue_file_is_not_read_whole(tmp_path, monkeypatch):
    from sparsefiles import count_reads, require_holes, write_sparse

    from rmqdump.analysis.fingerprint import _Hasher

    p = write_sparse(tmp_path / "q", 6 << 20, {0: bytes(range(1, 61))})
    require_holes(p)
    read = count_reads(monkeypatch)
    assert _Hasher().trimmed(p, 6 << 20, 20)[1] == 60
    assert read() < 64 << 10
