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
    # issue 16's hostile shapes are seeds: sparse segments, and crafted resync traps (overlapping candidates
    # whose headers hold up and whose BODYCRCs do not)
    names = [p.name for p in (tmp_path / "seeds").iterdir()]
    assert len([x for x in names if x.startswith("seed-walk_sparse-")]) >= 9
    trap = fz.crafted_candidates()
    from rmqdump.codec.record import BODY_CRC, decode_record

    heads = [pos - 4 for pos in range(len(trap)) if trap[pos:pos + 4] == b"\xda\xa3\x20\xa7"][1:]
    assert len(heads) > 40
    verdicts = {decode_record(trap + bytes(4096), h, len(trap) + 4096 - h, h, 0, "t", check_crc=True).kind
                for h in heads}
    assert verdicts == {BODY_CRC}, verdicts


def test_known_crashes_replay_cleanly():
    """Each input the fuzzer ever crashed on is a fixture and must now pass."""
    files = sorted(p for p in KNOWN.iterdir() if p.is_file() and not p.name.endswith(".md")) if KNOWN.is_dir() else []
    if not files:
        pytest.skip("no recorded fuzz crashes")
    _harness().replay([str(p) for p in files])


OPEN = REPO / "fixtures" / "bugs" / "fuzz-open"
#: open fuzz findings (fixtures/bugs/fuzz-open/<file>) -> the bug; fixed ones move to fixtures/bugs/fuzz/
OPEN_BUGS: dict[str, str] = {}


def _reproduces(fz, path: Path) -> bool:
    """Whether ``path`` still makes the harness raise a foreign exception (strict mode: known ones too)."""
    try:
        fz.replay([str(path)])
    except Exception:  # noqa: BLE001 - any escape is the finding reproducing
        return True
    return False


def test_open_fuzz_findings(monkeypatch, tmp_path):
    """Every open finding is listed (file <-> OPEN_BUGS <-> KNOWN_OPEN), still reproduces in strict mode
    (once fixed: move it to fixtures/bugs/fuzz) and is tolerated by the bounded run (not re-reported).
    The reproduction check itself is checked on a made-up crash, so this runs even while the list is empty."""
    files = {p.name for p in OPEN.iterdir() if p.is_file() and not p.name.endswith(".md")} if OPEN.is_dir() else set()
    fz = _harness()
    assert files == set(OPEN_BUGS), "every file in fixtures/bugs/fuzz-open needs an OPEN_BUGS entry and back"
    assert len(fz.KNOWN_OPEN) == len(OPEN_BUGS)
    monkeypatch.setattr(fz, "STRICT", True)
    fixed = [name for name in sorted(OPEN_BUGS) if not _reproduces(fz, OPEN / name)]
    assert fixed == [], f"fixed: move {fixed} to fixtures/bugs/fuzz and drop their OPEN_BUGS/KNOWN_OPEN entries"
    monkeypatch.setattr(fz, "STRICT", False)
    assert [name for name in sorted(OPEN_BUGS) if _reproduces(fz, OPEN / name)] == [], "KNOWN_OPEN misses one"
    # the check is not vacuous: a target that raises a foreign exception reproduces, a clean input does not
    target = fz.TARGET_IDS["props"]
    crash, clean = tmp_path / "crash", tmp_path / "clean"
    crash.write_bytes(bytes([target]) + b"boom")
    clean.write_bytes(bytes([target]) + b"KEYS\x01a b")
    original = fz.TARGETS[target]

    def boom(data: bytes) -> None:
        if data == b"boom":
            raise KeyError("a foreign exception")
        original(data)

    fz.TARGETS[target] = boom
    try:
        assert _reproduces(fz, crash) and not _reproduces(fz, clean)
    finally:
        fz.TARGETS[target] = original


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
