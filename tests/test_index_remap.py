"""An index file RocketMQ itself wrote over a same-named one (``fixtures/bugs/index-remap``): verify raises
no error or warning on the clean store, names the irregular links once (info), and lookup answers every
query at least as RocketMQ's ``IndexService.queryOffset`` did."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from rmqdump.cli import cli

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "bugs" / "index-remap"


def _manifest() -> list[dict]:
    return [json.loads(x) for x in (FIX / "manifest.jsonl").read_text(encoding="utf-8").splitlines() if x.strip()]


def test_verify_is_clean_and_names_the_irregular_file():
    res = CliRunner().invoke(cli, ["verify", str(FIX / "store"), "-f", "json", "-q"])
    doc = json.loads(res.stdout)
    loud = [f for f in doc["findings"] if f["severity"] in ("error", "warning")]
    assert loud == [] and res.exit_code == 0
    info = [f for f in doc["findings"] if f["kind"] == "index_chain_irregular"]
    assert [f["file"] for f in info] == ["index/20261125091814129"]


def test_lookup_answers_what_rocketmq_answers():
    runner = CliRunner()
    for q in (m for m in _manifest() if m["type"] == "index_query"):
        res = runner.invoke(cli, ["lookup", str(FIX / "store"), "--key", q["key"], "--topic", q["topic"], "-f",
                                  "jsonl", "-q"])
        assert res.exit_code in (0, 1), res.output
        got = {json.loads(x)["offset"] for x in res.stdout.splitlines() if x.strip()}
        assert set(q["phyOffsets_in_returned_order"]) <= got, f"{q['topic']}#{q['key']}"
