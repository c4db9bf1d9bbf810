"""Bad input: one-line errors naming file and offset (exit 2) or a clean stop — never a traceback."""

from __future__ import annotations

import os
import resource
import shutil
import struct
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import REPO, real_store
from rmqdump.cli import cli
from rmqdump.codec.record import Invalid, Message
from rmqdump.store.commitlog import CommitLog

SEG = "00000000000000000000"


def run_scan(path, *args):
    res = CliRunner().invoke(cli, ["scan", str(path), "-f", "jsonl", *args])
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    return res


def first_segment_copy(tmp_path, size=None) -> bytearray:
    data = bytearray((real_store("clean") / "commitlog" / SEG).read_bytes())
    return data if size is None else data[:size]


def write_segment(tmp_path, data) -> os.PathLike:
    d = tmp_path / "commitlog"
    d.mkdir(exist_ok=True)
    (d / SEG).write_bytes(bytes(data))
    return d


@pytest.mark.parametrize("value", [0, -1, 7, 2**31 - 1, 2**15, 90])
def test_hostile_totalsize_of_second_record(tmp_path, value):
    data = first_segment_copy(tmp_path)
    struct.pack_into(">i", data, 239, value)  # TOTALSIZE of the record at offset 239
    res = run_scan(write_segment(tmp_path, data))
    assert res.exit_code == 1
    assert len(res.stdout.splitlines()) == 1  # the first record still prints
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and "at byte 239 (offset 239)" in err[0]


@pytest.mark.parametrize("value", [0, -1, 7, 2**31 - 1])
def test_hostile_totalsize_of_first_record_is_an_error(tmp_path, value):
    data = first_segment_copy(tmp_path)
    struct.pack_into(">i", data, 0, value)
    res = run_scan(write_segment(tmp_path, data))
    assert res.exit_code == 2
    err = res.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("rmqdump: error: ") and f"{SEG} at byte 0" in err[0]


def test_zero_totalsize_and_magic_is_a_clean_end(tmp_path):
    data = first_segment_copy(tmp_path)
    data[478:] = bytes(len(data) - 478)
    res = run_scan(write_segment(tmp_path, data))
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 2
    assert res.stderr.startswith("end of valid data at 478: zero TOTALSIZE")


def test_truncated_file_stops_at_the_cut(tmp_path):
    data = first_segment_copy(tmp_path, 239 + 100)
    res = run_scan(write_segment(tmp_path, data))
    assert res.exit_code == 1 and len(res.stdout.splitlines()) == 1
    assert "at byte 239" in res.stderr and "runs past the end of the file" in res.stderr


def test_blank_overrunning_the_file(tmp_path):
    data = first_segment_copy(tmp_path)
    struct.pack_into(">iI", data, 478, len(data), 0xCBD43194)  # larger than the distance to the end
    res = run_scan(write_segment(tmp_path, data))
    assert res.exit_code == 1 and "bad_blank" in res.stderr and "at byte 478" in res.stderr


def test_random_bytes_and_empty_and_non_store(tmp_path):
    rnd = os.urandom(4096)
    assert run_scan(write_segment(tmp_path, rnd)).exit_code == 2
    (tmp_path / "commitlog" / SEG).write_bytes(b"")
    res = run_scan(tmp_path / "commitlog")
    assert res.exit_code in (0, 2) and "Traceback" not in res.stderr
    other = tmp_path / "empty"
    other.mkdir()
    res = run_scan(other)
    assert res.exit_code == 2 and "not a RocketMQ store" in res.stderr


def test_every_length_field_hostile_values_never_raise_foreign_errors(tmp_path):
    """TOTALSIZE, BODYLEN, topic and properties lengths set to hostile values: verdicts, not exceptions."""
    base = first_segment_copy(tmp_path)
    rec = next(r for r in CommitLog.open(real_store("clean")).walk() if isinstance(r, Message))
    body_len_pos = 84
    topic_len_pos = 88 + rec.body_length
    props_len_pos = topic_len_pos + 1 + len(rec.topic_raw)
    for pos, fmt, values in [
        (0, ">i", [0, -1, 7, 2**15, 2**31 - 1, len(base) + 1]),
        (body_len_pos, ">i", [0, -1, 7, 2**15, 2**31 - 1, len(base) + 1]),
        (topic_len_pos, ">b", [0, -1, 7, 127]),
        (props_len_pos, ">h", [0, -1, 7, 2**15 - 1]),
    ]:
        orig = struct.unpack_from(fmt, base, pos)[0]
        for v in values:
            data = bytearray(base)
            struct.pack_into(fmt, data, pos, v)
            d = write_segment(tmp_path, data)
            walk = CommitLog.open(d).walk()
            first = next(iter(walk), None)
            res = run_scan(d)
            if v == orig:  # the field unchanged: the record still decodes
                assert isinstance(first, Message) and res.exit_code == 0, (pos, v)
                continue
            # any other length makes the record inconsistent: the walk stops at offset 0 with an Invalid
            # verdict, and scan gives its one-line error (no valid record at the start), never an exception
            assert first is None and isinstance(walk.stop, Invalid) and walk.stop.offset == 0, (pos, v, first)
            assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, (pos, v, res.stderr)
    shutil.rmtree(tmp_path / "commitlog")


def test_memory_stays_bounded_on_a_huge_bodylen(tmp_path):
    """A 64 MiB segment whose first record claims a ~64 MiB body: no big allocation."""
    d = tmp_path / "commitlog"
    d.mkdir()
    data = bytearray(first_segment_copy(tmp_path, 239))
    struct.pack_into(">i", data, 0, 64 * 1024 * 1024 - 16)
    struct.pack_into(">i", data, 84, 64 * 1024 * 1024 - 200)
    with open(d / SEG, "wb") as f:
        f.write(data)
        f.truncate(64 * 1024 * 1024)
    script = ("import resource,sys;from rmqdump.cli import main\n"
              "try:\n main(['scan', sys.argv[1], '-f', 'jsonl', '--no-mmap'])\n"
              "except SystemExit as e:\n"
              " print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, e.code, file=sys.stderr)\n")

    def peak_rss_kb(path) -> tuple[int, str, str]:
        p = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=60)
        rss_kb, code = p.stderr.strip().splitlines()[-1].split()
        return int(rss_kb), code, p.stderr

    rss, code, err = peak_rss_kb(d)
    assert code == "2" and "exceeds the maximum record size" in err
    baseline, base_code, _ = peak_rss_kb(REPO / "fixtures" / "store")  # same imports, a tiny valid store
    assert base_code == "0"
    assert rss - baseline < 32 * 1024, (rss, baseline)  # far below the 64 MiB the record claims
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss > 0
