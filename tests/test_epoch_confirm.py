"""A truncated controller-mode slave (issue 19; apache/rocketmq #10666): RocketMQ 5.3.3's slave truncates to the
consistent point with ``DefaultMessageStore.truncateFiles``, which lowers the commitlog's confirmOffset to it and so
the checkpoint's ``confirmPhyOffset`` (bytes 32..40, ``CommitLog.setConfirmOffset`` -> ``StoreCheckpoint``), while
``MappedFileQueue.truncateDirtyFiles`` leaves the bytes after it in the file. Built from ``fixtures/store``
(69 records, valid end 13848) and ``fixtures/controller``: the checkpoint's confirm offset set to a record
boundary, as the truncation leaves it; verify must report exactly the records after it."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from click.testing import CliRunner

from rmqdump.cli import cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture
def store(controller_store) -> Path:
    return controller_store


def set_confirm(st: Path, offset: int) -> None:
    b = bytearray((st / "checkpoint").read_bytes())
    struct.pack_into(">q", b, 32, offset)
    (st / "checkpoint").write_bytes(bytes(b))


def unconfirmed(st: Path) -> list[dict]:
    r = CliRunner().invoke(cli, ["verify", str(st), "-f", "json"], catch_exceptions=False)
    return [f for f in json.loads(r.stdout)["findings"] if f["kind"] == "epoch_unconfirmed_records"]


def scan_offsets(st: Path) -> list[int]:
    r = CliRunner().invoke(cli, ["scan", str(st)], catch_exceptions=False)
    return [json.loads(x)["offset"] for x in r.stdout.splitlines()]


def test_records_past_the_confirm_offset_are_reported_exactly(store):
    offsets = scan_offsets(store)
    cut = offsets[60]  # the consistent point: 9 records (60..68) stay on disk after it
    set_confirm(store, cut)
    (f,) = unconfirmed(store)
    after = [o for o in offsets if o >= cut]
    assert len(after) == 9 and f["offset"] == cut and f["severity"] == "warning"
    assert f["detail"].startswith(f"9 record(s), {13848 - cut} bytes ({', '.join(map(str, after))})")


def test_confirmed_to_the_end_or_never_stored_reports_nothing(store):
    assert unconfirmed(store) == []  # confirmPhyOffset 0: not stored, nothing judged
    set_confirm(store, 13848)
    assert unconfirmed(store) == []


def test_confirm_offset_inside_a_record(store):
    offsets = scan_offsets(store)
    set_confirm(store, offsets[60] + 7)
    (f,) = unconfirmed(store)
    assert "not at a record boundary" in f["detail"]


def test_without_controller_files_nothing_is_judged(tmp_path):
    st = tmp_path / "plain"
    shutil.copytree(FIXTURES / "store", st)
    set_confirm(st, scan_offsets(st)[60])
    assert unconfirmed(st) == []
