"""The atheris harness (fuzz/fuzz_store.py): every crash ever found is replayed; CI fuzzes for a bounded time.

``RMQDUMP_FUZZ_SECONDS`` sets the CI run (default 60; 0 skips it). New crashes land in
``fuzz/crashes/`` and fail the test with their reproducer; each fixed one is kept under
``fixtures/bugs/fuzz/`` and replayed by :func:`test_known_crashes_replay_cleanly`.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
HARNESS = REPO / "fuzz" / "fuzz_store.py"
CRASHES = REPO / "fuzz" / "crashes"
KNOWN = REPO / "fixtures" / "bugs" / "fuzz"


def _harness():
    spec = importlib.util.spec_from_file_location("fuzz_store", HARNESS)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_seed_corpus_runs_cleanly(tmp_path):
    """Every seed (real stores + fixtures) goes through every target without an escape."""
    fz = _harness()
    n = fz.make_seeds(tmp_path / "seeds")
    from conftest import REAL

    assert n > (100 if REAL.is_dir() else 50)  # the real stores beside the checkout add most seeds
    assert fz.replay(sorted(map(str, (tmp_path / "seeds").iterdir()))) == n


def test_known_crashes_replay_cleanly():
    """Each input the fuzzer ever crashed on is a fixture and must now pass."""
    files = sorted(p for p in KNOWN.iterdir() if p.is_file() and not p.name.endswith(".md")) if KNOWN.is_dir() else []
    if not files:
        pytest.skip("no recorded fuzz crashes")
    _harness().replay([str(p) for p in files])


OPEN = REPO / "fixtures" / "bugs" / "fuzz-open"
#: open fuzz findings (fixtures/bugs/fuzz-open/<file>) -> the bug; fixed ones move to fixtures/bugs/fuzz/
OPEN_BUGS: dict[str, str] = {}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=r))
                                  for n, r in sorted(OPEN_BUGS.items())] or
                         [pytest.param("-", marks=pytest.mark.skip(reason="no open fuzz findings"))])
def test_open_fuzz_findings(monkeypatch, name):
    """Each open finding still reproduces in strict mode (XPASS once fixed: move it to fixtures/bugs/fuzz)."""
    fz = _harness()
    monkeypatch.setattr(fz, "STRICT", True)
    fz.replay([str(OPEN / name)])


def test_open_findings_are_all_listed():
    files = {p.name for p in OPEN.iterdir() if p.is_file() and not p.name.endswith(".md")} if OPEN.is_dir() else set()
    assert files == set(OPEN_BUGS)
    assert len(_harness().KNOWN_OPEN) == len(OPEN_BUGS)


def test_lookup_msg_id_with_spaces_is_a_one_line_error(tmp_path):
    """fixtures/bugs/fuzz/crash-eb7887...: a 32-char msg id with spaces (struct.error escaped; fixed in a1a3321)."""
    from secutil import run_cli

    from conftest import real_store

    r = run_cli(["lookup", real_store("clean"), "--msg-id", "7F00F00000000000 0000000000 0000"], timeout=30)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.describe()
    assert len([x for x in r.stderr.splitlines() if x.strip()]) == 1


def test_harness_rejects_a_foreign_exception():
    """The harness is not vacuous: an exception other than RmqdumpError escapes TestOneInput."""
    fz = _harness()
    original = fz.TARGETS[fz.TARGET_IDS["props"]]

    def boom(data: bytes) -> None:
        raise ValueError("not an RmqdumpError")

    fz.TARGETS[fz.TARGET_IDS["props"]] = boom
    try:
        with pytest.raises(ValueError):
            fz.TestOneInput(bytes([fz.TARGET_IDS["props"]]) + b"x")
    finally:
        fz.TARGETS[fz.TARGET_IDS["props"]] = original


def test_fuzz_for_a_bounded_time(tmp_path):
    """libFuzzer for RMQDUMP_FUZZ_SECONDS (60) seconds from the seed corpus: no finding."""
    seconds = int(os.environ.get("RMQDUMP_FUZZ_SECONDS", "60"))
    if seconds <= 0:
        pytest.skip("RMQDUMP_FUZZ_SECONDS=0")
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris is not installed (dev extra)")
    seeds, corpus = tmp_path / "seeds", tmp_path / "corpus"
    corpus.mkdir()
    CRASHES.mkdir(exist_ok=True)
    before = set(CRASHES.iterdir())
    subprocess.run([sys.executable, str(HARNESS), "--make-seeds", str(seeds)], check=True, cwd=REPO,
                   capture_output=True)
    cmd = [sys.executable, str(HARNESS), f"-max_total_time={seconds}", "-timeout=10", "-rss_limit_mb=2048",
           "-max_len=8192", "-print_final_stats=1", f"-artifact_prefix={CRASHES}/", str(corpus), str(seeds)]
    p = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=seconds + 300)
    new = sorted(set(CRASHES.iterdir()) - before)
    tail = "\n".join(p.stderr.splitlines()[-40:])
    stats = [line for line in p.stderr.splitlines() if line.startswith("stat::") or " DONE " in line]
    print("\n".join(stats))
    if new or p.returncode != 0:
        repro = "\n".join(f"  python fuzz/fuzz_store.py --replay {c.relative_to(REPO)}" for c in new)
        pytest.fail(f"fuzzer finding (exit {p.returncode}); reproduce with:\n{repro}\n{tail}")
