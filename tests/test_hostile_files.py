"""Hostile file types inside a store: FIFOs, sockets and links to endless devices.

A store taken from a compromised machine may hold a FIFO named like a segment or the
checkpoint, or a link to /dev/zero in place of a config file. Readers must refuse such
files (or report them) within 5 s and bounded memory: never block on a FIFO open, never
read a device without end. Fixtures: ``fixtures/bugs/hostile-files/make_store.py`` (git
cannot store FIFOs or sockets).
"""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from secutil import run_cli

from conftest import real_store
from rmqdump.cli import COMMANDS
from rmqdump.codec.layout import MAX_RECORD_SIZE

TIMEOUT_S = 5.0
RSS_LIMIT_KB = 200 * 1024 + 16 * MAX_RECORD_SIZE // 1024
GEN = Path(__file__).resolve().parents[1] / "fixtures" / "bugs" / "hostile-files" / "make_store.py"

PARTS = {
    "segment": ("commitlog/00000000000000262144", ["scan", "info", "verify", "stats", "repair"]),
    "checkpoint": ("checkpoint", ["info", "verify", "repair"]),
    "abort": ("abort", ["info", "verify", "repair"]),
    "lock": ("lock", ["info", "verify"]),
    "config": ("config/topics.json", ["info", "verify", "pending"]),
    "consumer-offsets": ("config/consumerOffset.json", ["consumers", "verify"]),
    "index": ("index/*", ["index", "lookup", "verify"]),
    "cq": ("consumequeue/TopicTest/0/00000000000000000000", ["cq", "verify", "consumers"]),
}
ARGS = {"scan": ["-f", "jsonl"], "lookup": ["--key", "key-1", "--topic", "TopicTest", "-f", "jsonl"]}

KNOWN: dict[tuple[str, str], str] = {}  # every FIFO/device case below was fixed (rmqdump/disk/fileio.py)
CASES = [(part, kind) for part in PARTS for kind in ("fifo", "socket", "devzero", "urandom")]


def _gen():
    spec = importlib.util.spec_from_file_location("make_store", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("part,kind", [pytest.param(p, k, marks=pytest.mark.xfail(strict=True, reason=KNOWN[(p, k)]))
                                       if (p, k) in KNOWN else (p, k) for p, k in CASES],
                         ids=[f"{p}-{k}" for p, k in CASES])
def test_hostile_file_type(tmp_path, part, kind):
    rel, cmds = PARTS[part]
    store = tmp_path / "s"
    _gen().make(real_store("clean"), store, rel, kind)
    argvs = [[c, str(store), *ARGS.get(c, ["-f", "json"])] for c in cmds if c in COMMANDS]
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda a: run_cli(a, timeout=TIMEOUT_S), argvs))
    problems = []
    for r in runs:
        if r.timed_out:
            problems.append(f"hung (> {TIMEOUT_S} s): {r.describe()}")
        elif r.returncode not in (0, 1, 2) or "Traceback" in r.stderr:
            problems.append(r.describe())
        elif r.maxrss_kb > RSS_LIMIT_KB:
            problems.append(f"peak RSS {r.maxrss_kb} KiB: {r.describe()}")
    assert not problems, "\n\n".join(problems)
