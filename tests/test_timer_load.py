"""Whether a 5.x broker starts with its timer store (``timerWheelEnable``, true by default in 5.3.3): its
``BrokerController`` builds a ``TimerWheel`` (which throws on a wheel of another length) and calls
``TimerMessageStore.load()``: the timerlog's ``MappedFileQueue.load`` and ``TimerMetrics.load`` (a
``ConfigManager``: the ``.bak`` when the file is missing, empty or bad; false only when that ``.bak`` holds bytes
that do not decode). verify must say "does not start" exactly when RocketMQ does not: judged by ``533/put``, which
loads the timer store as the broker does and exits 1 when it fails (where the oracle is)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from oracle_fixtures import copy_store, fixture_dir

from rmqdump.cli import cli

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from timer_wheel_fixture import rebuild  # noqa: E402

NAME = "533-timer"
TL = Path("timerlog")
METRICS = Path("config/timermetrics")


def _bak(s: Path) -> Path:
    return s / METRICS.with_name(METRICS.name + ".bak")


#: damage -> whether RocketMQ 5.3.3's broker start fails on it (each seen with 533/put)
CASES = {
    "nothing": (lambda s: None, False),
    "a full-size timerlog file named junk (Long.parseLong throws)": (
        lambda s: (s / TL / "junk").write_bytes((s / TL / "00000000000000000000").read_bytes()), True),
    "a small timerlog file named junk (its size differs)": (lambda s: (s / TL / "junk").write_bytes(b"x"), True),
    "a zero-length last timerlog entry (the load deletes it)": (lambda s: (s / TL / "zz").write_bytes(b""), False),
    "timermetrics and its .bak undecodable": (
        lambda s: ((s / METRICS).write_text("{bad"), _bak(s).write_text("{bad")), True),
    "timermetrics undecodable, no .bak (starts with empty metrics)": (
        lambda s: ((s / METRICS).write_text("{bad"), _bak(s).unlink()), False),
    "timermetrics undecodable, its .bak fine": (lambda s: (s / METRICS).write_text("{bad"), False),
    "a timer wheel of another length": (lambda s: (s / "timerwheel").write_bytes(bytes(100)), True),
    "timercheck garbage (read as it is)": (lambda s: (s / "config" / "timercheck").write_bytes(b"xx"), False),
}


def _stops(findings: list[dict]) -> bool:
    return any(f["severity"] == "error" and "does not start" in f["detail"]
               for f in findings if f["kind"].startswith("timer_"))


def _rocketmq_starts(store: Path, tmp_path: Path) -> bool:
    from oracle.harness import put

    settings = json.loads((fixture_dir(NAME) / "spec.jsonl").read_text().splitlines()[0])
    assert settings["type"] == "settings"
    try:
        put("533", shutil.copytree(store, tmp_path / "copy"), [settings])
    except RuntimeError as e:
        assert any(s in str(e) for s in ("TimerMessageStore.load() returned false", "NumberFormatException",
                                          "Timer wheel length")), str(e)[-2000:]
        return False
    return True


@pytest.mark.parametrize("case", list(CASES))
def test_verify_says_the_broker_does_not_start_when_rocketmq_does_not(case, tmp_path):
    """verify said nothing of a stray timerlog name (the broker does not start) and said "does not start" of
    an undecodable timermetrics with no .bak (the broker starts with empty metrics)."""
    store = copy_store(NAME, tmp_path / "s")
    rebuild(fixture_dir(NAME) / "timerwheel.slots.jsonl", store / "timerwheel")
    mutate, refuses = CASES[case]
    mutate(store)
    doc = json.loads(CliRunner().invoke(cli, ["verify", str(store), "-f", "json", "-q"]).stdout)
    assert _stops(doc["findings"]) is refuses, [f for f in doc["findings"] if f["kind"].startswith("timer_")]
    # the recovery prediction says so too (it said "mode normal" and nothing else), and when the broker stops:
    # a wheel of another length before its store loads, the timer store's load() after the store's recovery
    stages = {f["stage"] for f in doc["recovery"]["start_failures"]}
    assert bool(stages) is refuses and doc["next_start"]["starts"] is not refuses
    assert stages <= {"before the store loads" if "wheel" in case else "after the store's recovery"}
    from oracle.harness import unavailable_reason

    if unavailable_reason("533") is None:  # RocketMQ's own verdict where the oracle is
        assert _rocketmq_starts(store, tmp_path) is not refuses
