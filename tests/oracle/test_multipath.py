"""Multi-path commitlogs (issue 19, item 3) written by RocketMQ 4.9.8's own ``MultiPathMappedFileQueue``
(``commitLogPaths``: three folders, 240 records over many 4 KiB files) and read back by its ``run --set
commitLogPaths=...``: ``scan`` with ``--commitlog-path`` equals the read-back field for field and ``verify``
raises no false finding."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from rmqdump.cli import cli

from .harness import expected_row, load, put, unavailable_reason

pytestmark = [pytest.mark.oracle]

PATHS = ["commitlog", "disk2/commitlog", "disk3"]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    reason = unavailable_reason("498")
    if reason:
        pytest.skip(reason)
    store = tmp_path_factory.mktemp("mp") / "store"
    spec = [{"type": "settings", "mappedFileSizeCommitLog": 4096, "mappedFileSizeConsumeQueue": 320,
             "maxHashSlotNum": 16, "maxIndexNum": 256, "commitLogPaths": PATHS}]
    spec += [{"topic": f"T{i % 5}", "queueId": i % 3, "keys": [f"k{i}"], "tags": "t",
              "body": f"m{i} " + "y" * (i * 13 % 700)} for i in range(240)]
    put("498", store, spec)
    manifest = load("498", store, ["4096", "320", "16", "256", f"--set=commitLogPaths={','.join(PATHS)}"])
    return store, manifest


def test_scan_equals_rocketmq_and_verify_is_clean(written):
    store, manifest = written
    used = {p for p in PATHS if any((store / p).iterdir())}
    assert len(used) == 3  # RocketMQ spread the files over every folder
    r = CliRunner().invoke(cli, ["scan", str(store), "-f", "jsonl", "--body", "base64",
                                 "--commitlog-path", ",".join(PATHS)], catch_exceptions=False)
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    expected = [expected_row(m) for m in manifest if m["type"] == "message"]
    assert len(expected) == 240 and rows == expected
    r = CliRunner().invoke(cli, ["verify", str(store), "-f", "json", "--commitlog-path", ",".join(PATHS)],
                           catch_exceptions=False)
    doc = json.loads(r.stdout)
    assert [f for f in doc["findings"] if f["severity"] != "info"] == []
    info = next(m for m in manifest if m["type"] == "store_info")
    assert doc["recovery"]["max_offset"] == info["commitlog_max_offset_after_recovery"]
