"""Mutation sweep: seeded damage to copies of the real broker498 commitlogs, verified every time.

Every run must end in a report or a one-line RmqdumpError — never a traceback, never over
5 s — and damage with a known location (a bit flipped inside a body, an overwritten length
field) must be reported at its record's offset. Two worker processes share the work; each
keeps one copy of every store and restores the mutated bytes after each run.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import struct
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import real_store
from rmqdump.analysis.verify import verify_store
from rmqdump.cli import cli
from rmqdump.codec.record import Blank, Message
from rmqdump.errors import RmqdumpError
from rmqdump.store.commitlog import CommitLog

SEED = 20261121
N_MUTATIONS = 1200
TIME_LIMIT_S = 5.0
CLI_EVERY = 40
STORES = ("clean", "crash_kill9", "corrupt_crc", "crash_torn", "crash_torn_props")
WORKERS = 2


@dataclass(frozen=True)
class Rec:
    offset: int
    segment: str
    pos: int  # position in the segment
    size: int
    body_pos: int  # absolute position in the segment
    body_len: int
    topic_len_pos: int
    props_len_pos: int


@dataclass(frozen=True)
class Mutation:
    n: int
    store: str
    segment: str
    kind: str  # bitflip | bodyflip | zero | truncate | length
    pos: int
    data: bytes  # bytes written at pos (truncate: empty, pos = new size)
    record: int | None  # offset of the record whose finding is required
    keep_going: bool
    cli: bool

    def describe(self) -> str:
        return f"#{self.n} {self.store}/{self.segment} {self.kind} @{self.pos} ({len(self.data)} B)"


def _records(name: str) -> tuple[list[Rec], list[tuple[str, int, int]], dict[str, int]]:
    """Intact records, BLANK positions and segment sizes of a real store."""
    cl = CommitLog.open(real_store(name))
    recs, blanks = [], []
    for r in cl.walk(read_body=False, keep_going=True):
        if isinstance(r, Message):
            bh = 20 if r.sys_flag & 0x10 else 8
            sh = 20 if r.sys_flag & 0x20 else 8
            body = r.file_pos + 72 + bh + sh
            tl = body + max(r.body_length, 0)
            recs.append(Rec(r.offset, r.file, r.file_pos, r.size, body, r.body_length, tl,
                            tl + 1 + len(r.topic_raw)))
        elif isinstance(r, Blank):
            blanks.append((r.file, r.file_pos, r.size))
    return recs, blanks, {s.name: s.size for s in cl.segments}


def make_mutations(seed: int = SEED, n: int = N_MUTATIONS) -> list[Mutation]:
    rng = random.Random(seed)
    info = {name: _records(name) for name in STORES}
    out: list[Mutation] = []
    kinds = ["bodyflip"] * 4 + ["bitflip"] * 3 + ["zero"] * 2 + ["length"] * 2 + ["truncate"]
    while len(out) < n:
        name = rng.choice(STORES)
        recs, blanks, sizes = info[name]
        kind = rng.choice(kinds)
        seg = rng.choice(sorted(sizes))
        record = None
        data = b""
        if kind == "bodyflip":
            cands = [r for r in recs if r.body_len > 0]
            r = rng.choice(cands)
            seg, pos, record = r.segment, r.body_pos + rng.randrange(r.body_len), r.offset
            data = None  # flip computed against the real byte below
        elif kind == "bitflip":
            pos = rng.randrange(sizes[seg])
        elif kind == "zero":
            pos = rng.randrange(sizes[seg])
            data = bytes(min(rng.choice((1, 4, 8, 64, 500, 5000)), sizes[seg] - pos))
        elif kind == "truncate":
            pos = rng.choice((0, rng.randrange(sizes[seg]), sizes[seg] - 1, sizes[seg] // 2))
        else:
            field = rng.choice(("total", "body", "topic", "props", "blank"))
            if field == "blank" and blanks:
                seg, bpos, bsize = rng.choice(blanks)
                pos, data = bpos, struct.pack(">i", rng.choice((bsize + 8, bsize - 8, 0, -1, 2**31 - 1)))
            else:
                r = rng.choice(recs)
                seg, record = r.segment, r.offset
                value = rng.choice((0, -1, 1, r.size - 1, r.size + 1, r.size * 3, rng.randrange(-2**31, 2**31)))
                if field in ("total", "blank"):
                    pos, data = r.pos, struct.pack(">i", value)
                elif field == "body":
                    pos, data = r.body_pos - 4, struct.pack(">i", value)
                elif field == "topic":
                    pos, data = r.topic_len_pos, bytes([value & 0xFF])
                else:
                    pos, data = r.props_len_pos, struct.pack(">h", (value + 2**15) % 2**16 - 2**15)
        if data is None:  # bodyflip / bitflip: one bit of the byte at pos
            data = b""
        # corrupt_crc has damage mid-file: walk past it so later records are checked too
        keep_going = name == "corrupt_crc" or rng.random() < 0.5
        bit = rng.randrange(8)
        if kind in ("bodyflip", "bitflip"):
            data = bytes([1 << bit])  # XOR mask, applied in the worker
        out.append(Mutation(len(out), name, seg, kind, pos, data, record, keep_going, len(out) % CLI_EVERY == 0))
    return out


class _Timeout(Exception):
    pass


def _alarm(signum, frame):
    raise _Timeout()


def _apply(path: Path, m: Mutation) -> tuple[bytes, bool]:
    """Apply ``m``; return what is needed to undo it and whether any byte changed."""
    if m.kind == "truncate":
        orig = path.read_bytes()
        os.truncate(path, m.pos)
        return orig, m.pos != len(orig)
    with open(path, "r+b") as f:
        f.seek(m.pos)
        orig = f.read(max(len(m.data), 1))
        new = bytes(a ^ b for a, b in zip(orig, m.data, strict=False)) if m.kind in ("bodyflip", "bitflip") \
            else m.data[:len(orig)]
        f.seek(m.pos)
        f.write(new)
    return orig, new != orig[:len(new)]


def _undo(path: Path, m: Mutation, orig: bytes) -> None:
    if m.kind == "truncate":
        path.write_bytes(orig)
        return
    with open(path, "r+b") as f:
        f.seek(m.pos)
        f.write(orig)


def run_batch(mutations: list[Mutation]) -> list[dict]:
    """Worker: one private copy of each store; apply, verify under a time limit, restore."""
    tmp = Path(tempfile.mkdtemp(prefix="rmqdump-mut-"))
    results = []
    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        roots = {}
        for name in {m.store for m in mutations}:
            dst = tmp / name
            shutil.copytree(real_store(name), dst)
            for p in [dst, *dst.rglob("*")]:
                p.chmod(0o755 if p.is_dir() else 0o644)
            roots[name] = dst
        for m in mutations:
            root = roots[m.store]
            path = root / "commitlog" / m.segment
            orig, changed = _apply(path, m)
            res = {"n": m.n, "desc": m.describe(), "changed": changed, "error": None, "traceback": None,
                   "findings": [], "cli": None}
            t0 = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S + 1)
            try:
                rep = verify_store(root, keep_going=m.keep_going)
                res["findings"] = [(f.severity, f.kind, f.offset) for f in rep.findings]
            except RmqdumpError as e:
                res["error"] = str(e)
            except _Timeout:
                res["traceback"] = "timeout"
            except Exception:
                res["traceback"] = traceback.format_exc()
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            res["seconds"] = time.perf_counter() - t0
            if m.cli:
                args = ["verify", str(root), "-f", "json", "-q"] + (["--keep-going"] if m.keep_going else [])
                cr = CliRunner().invoke(cli, args)
                exc = cr.exception if cr.exception is not None and not isinstance(cr.exception, SystemExit) else None
                res["cli"] = {"exit": cr.exit_code, "exception": repr(exc) if exc else None,
                              "stderr_lines": len(cr.stderr.strip().splitlines()), "stderr": cr.stderr[:300]}
            _undo(path, m, orig)
            results.append(res)
    finally:
        signal.signal(signal.SIGALRM, old)
        shutil.rmtree(tmp, ignore_errors=True)
    return results


@pytest.fixture(scope="module")
def sweep():
    for name in STORES:
        real_store(name)
    muts = make_mutations()
    batches = [muts[i::WORKERS] for i in range(WORKERS)]
    ctx = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=WORKERS, mp_context=ctx) as ex:
        results = [r for batch in ex.map(run_batch, batches) for r in batch]
    elapsed = time.perf_counter() - t0
    by_n = {r["n"]: r for r in results}
    return muts, by_n, elapsed


def test_sweep_size_and_determinism(sweep):
    muts, by_n, elapsed = sweep
    assert len(muts) >= 1000 and len(by_n) == len(muts)
    assert make_mutations()[:50] == muts[:50]  # seeded
    kinds = Counter(m.kind for m in muts)
    assert all(kinds[k] >= 50 for k in ("bodyflip", "bitflip", "zero", "length", "truncate"))
    print(f"\nmutation sweep: {len(muts)} runs in {elapsed:.1f} s, kinds {dict(kinds)}, "
          f"max run {max(r['seconds'] for r in by_n.values()):.3f} s")


def test_no_tracebacks_and_no_slow_runs(sweep):
    muts, by_n, _ = sweep
    bad = [(by_n[m.n]["desc"], by_n[m.n]["traceback"]) for m in muts if by_n[m.n]["traceback"]]
    assert bad == []
    slow = [(by_n[m.n]["desc"], by_n[m.n]["seconds"]) for m in muts if by_n[m.n]["seconds"] > TIME_LIMIT_S]
    assert slow == []


def test_every_run_ends_in_a_report_or_a_one_line_error(sweep):
    """Each run ends in exactly one of: a report, or a one-line RmqdumpError. A mutation that changed no
    byte (e.g. a flip undone by the value it wrote) reports exactly what the untouched store reports:
    no false alarm from bytes that did not change."""
    muts, by_n, _ = sweep
    unchanged: dict[tuple[str, bool], set] = {}
    for m in muts:
        r = by_n[m.n]
        assert r["traceback"] is None, r["desc"]
        if r["error"] is not None:
            assert r["findings"] == [], r["desc"]  # an error, not a report
        if not r["changed"]:
            assert r["error"] is None, r["desc"]
            unchanged.setdefault((m.store, m.keep_going), set()).add(frozenset(r["findings"]))
    assert unchanged, "no mutation left its bytes unchanged: the no-false-alarm check saw nothing"
    for (name, keep_going), reports in unchanged.items():
        clean = verify_store(real_store(name), keep_going=keep_going)
        assert reports == {frozenset((f.severity, f.kind, f.offset) for f in clean.findings)}, name
    for m in muts:
        r = by_n[m.n]
        if r["error"] is not None:
            assert "\n" not in r["error"]
        if m.kind == "truncate" and r["changed"]:
            kinds = {k for _, k, _ in r["findings"]}
            assert r["error"] is not None or kinds & {"segment_size", "zero_length_segment"}, r["desc"]


def test_cli_sample(sweep):
    muts, by_n, _ = sweep
    sample = [by_n[m.n] for m in muts if m.cli]
    assert len(sample) >= 25
    for r in sample:
        c = r["cli"]
        assert c["exception"] is None, (r["desc"], c)
        assert c["exit"] in (0, 1, 2), (r["desc"], c)
        if c["exit"] == 2:
            assert c["stderr_lines"] == 1 and c["stderr"].startswith("rmqdump: error: "), (r["desc"], c)
        else:
            assert c["exit"] == (1 if any(s == "error" for s, _, _ in r["findings"]) else 0), r["desc"]


def test_every_body_bit_flip_is_reported_at_its_record(sweep):
    muts, by_n, _ = sweep
    flips = [m for m in muts if m.kind == "bodyflip"]
    assert len(flips) >= 300
    missed = [by_n[m.n]["desc"] for m in flips
              if ("error", "body_crc", m.record) not in by_n[m.n]["findings"]]
    assert missed == []


def test_every_overwritten_length_field_is_reported_at_its_record(sweep):
    muts, by_n, _ = sweep
    fields = [m for m in muts if m.kind == "length" and m.record is not None and by_n[m.n]["changed"]]
    assert len(fields) >= 50
    missed = [by_n[m.n]["desc"] for m in fields
              if not any(s == "error" and o == m.record for s, _, o in by_n[m.n]["findings"])]
    assert missed == []


def test_detection_rate_of_blind_damage(sweep):
    """Random flips and zeroed ranges: most changed bytes are reported (opaque fields such as
    FLAG or the born host cannot be); the rate is printed for the record."""
    muts, by_n, _ = sweep
    blind = [m for m in muts if m.kind in ("bitflip", "zero") and by_n[m.n]["changed"]]
    seen = [m for m in blind if by_n[m.n]["findings"] or by_n[m.n]["error"]]
    rate = len(seen) / max(1, len(blind))
    print(f"\nblind damage reported: {len(seen)}/{len(blind)} = {rate:.1%}")
    assert rate >= 0.9
