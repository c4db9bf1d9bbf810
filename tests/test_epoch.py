"""Controller-mode epoch files (issue 19, item 2): ``fixtures/controller`` (built from RocketMQ 5.3.3's
documented ``CheckpointFile``/``BrokerMetadata`` format; the oracle cannot write them) placed in a copy of
``fixtures/store`` (commitlog end 13848)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rmqdump.cli import cli
from rmqdump.store.epoch import parse_epoch_file, read_epochs


@pytest.fixture
def store(controller_store) -> Path:
    return controller_store


def verify_findings(st: Path) -> dict[str, dict]:
    r = CliRunner().invoke(cli, ["verify", str(st), "-f", "json"], catch_exceptions=False)
    return {f["kind"]: f for f in json.loads(r.stdout)["findings"]}


def info(st: Path) -> dict:
    return json.loads(CliRunner().invoke(cli, ["info", str(st), "-f", "json"], catch_exceptions=False).stdout)


def test_crc_matches_rocketmqs_documented_example():
    f = parse_epoch_file(b"2\n773307083\n7-7000\n8-8000\n", Path("x"))
    assert f.ok and f.crc_actual == 773307083 and [(e.epoch, e.start_offset) for e in f.entries] == [(7, 7000),
                                                                                                     (8, 8000)]


def test_info_shows_the_epochs_and_identity(store):
    c = info(store)["controller"]
    assert c["epochs"] == [{"epoch": 1, "start_offset": 0, "end_offset": 5000},
                           {"epoch": 2, "start_offset": 5000, "end_offset": 9000},
                           {"epoch": 4, "start_offset": 9000, "end_offset": None}]
    assert c["epoch_file"] == "epochFileCheckpoint"
    assert c["broker_identity"]["broker_name"] == "broker-a" and c["broker_identity"]["broker_id"] == 1
    text = CliRunner().invoke(cli, ["info", str(store)]).stdout
    assert "epochs (epochFileCheckpoint): 1: 0..5000, 2: 5000..9000, 4: 9000.." in text
    assert not any(k.startswith("epoch") for k in verify_findings(store))


def test_bad_crc_falls_back_to_bak(store):
    p = store / "epochFileCheckpoint"
    lines = p.read_text().split("\n")
    lines[1] = str(int(lines[1]) ^ 1)
    p.write_text("\n".join(lines))
    found = verify_findings(store)
    assert found["epoch_file_bad"]["severity"] == "warning"
    assert "CRC32" in found["epoch_file_bad"]["detail"] and ".bak" in found["epoch_file_bad"]["detail"]
    ep = read_epochs(store)
    assert ep.used is ep.bak and [e.epoch for e in ep.epochs] == [1, 2]
    assert info(store)["controller"]["epoch_file"] == "epochFileCheckpoint.bak"


def test_count_mismatch_without_bak_loads_no_epoch(store):
    p = store / "epochFileCheckpoint"
    p.write_text("4" + p.read_text()[1:])
    (store / "epochFileCheckpoint.bak").unlink()
    found = verify_findings(store)
    assert found["epoch_file_bad"]["severity"] == "error" and "expects 4 entries, holds 3" in found[
        "epoch_file_bad"]["detail"]
    assert "loads no epoch" in found["epoch_file_bad"]["detail"] and read_epochs(store).epochs == []


def test_unparsable_count_fails_the_load_without_trying_bak(store):
    (store / "epochFileCheckpoint").write_text("x\n0\n1-0\n")
    found = verify_findings(store)
    assert "epoch_load_fails" in found and found["epoch_load_fails"]["severity"] == "error"
    assert info(store)["controller"]["epoch_load_error"].startswith("epochFileCheckpoint: line 1")


def test_epoch_starting_past_the_commitlog_end(store):
    body = "1-0\n9-20000\n"
    from rmqdump.codec.crc import body_crc

    (store / "epochFileCheckpoint").write_text(f"2\n{body_crc(body.encode())}\n{body}")
    found = verify_findings(store)
    assert "epoch_past_end" in found and "13848" in found["epoch_past_end"]["detail"]
