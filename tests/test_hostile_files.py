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


@pytest.mark.parametrize("fast", ["0", "1"])
def test_segment_name_above_long_max(tmp_path, fast):
    """A 20-digit file name above Long.MAX_VALUE (the broker's Long.parseLong throws on it at load) is a
    finding in both engines, never an OverflowError; a consume-queue file so named is a stray file."""
    import json
    import shutil

    store = tmp_path / "store"
    shutil.copytree(Path(__file__).resolve().parent.parent / "fixtures" / "store", store)
    first = sorted((store / "commitlog").iterdir())[0]
    shutil.copy(first, store / "commitlog" / "99999999999999999999")
    qdir = next(p for p in (store / "consumequeue").glob("*/*") if p.is_dir())
    (qdir / "99999999999999999999").write_bytes(b"\0" * 20)
    env = {"RMQDUMP_FAST": fast}
    r = run_cli(["verify", store, "-f", "json"], timeout=120, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.describe()
    doc = json.loads(r.stdout)
    names = [f for f in doc["findings"] if f["kind"] == "segment_name"]
    assert names and names[0]["severity"] == "error" and "Long.MAX_VALUE" in names[0]["detail"], names
    assert doc["recovery"]["mode"] == "refuses_to_start", doc["recovery"]
    for args in (["export", store, "--to", tmp_path / "o.jsonl"], ["scan", store], ["stats", store, "-f", "json"],
                 ["cq", store]):
        r = run_cli(args, timeout=120, env=env)
        assert r.returncode in (0, 1) and "Traceback" not in r.stderr and "OverflowError" not in r.stderr, r.describe()


@pytest.mark.parametrize("fast", ["0", "1"])
@pytest.mark.parametrize("shape", ["oversized_segment", "single_sparse_segment", "sparse_config"])
def test_apparent_size_does_not_drive_work(tmp_path, shape, fast):
    """A file's claimed size costs nothing: a 4 GiB sparse segment among the store's small ones (read only
    up to the store's file size), a store of one 4 GiB sparse segment (holes skipped with SEEK_DATA), a
    600 MB sparse config file (refused by its size). Every reader stays fast and small."""
    import os
    import shutil

    store = tmp_path / "store"
    if shape == "single_sparse_segment":
        (store / "commitlog").mkdir(parents=True)
        with open(store / "commitlog" / "00000000000000000000", "wb") as f:
            f.truncate(4 << 30)
    else:
        shutil.copytree(Path(__file__).resolve().parent.parent / "fixtures" / "store", store)
        target = (sorted((store / "commitlog").iterdir())[-1] if shape == "oversized_segment"
                  else store / "config" / "topics.json")
        os.truncate(target, (4 << 30) if shape == "oversized_segment" else 600 << 20)
    env = {"RMQDUMP_FAST": fast}
    for args in (["verify", store, "-f", "json"], ["verify", store, "--keep-going", "-f", "json"],
                 ["stats", store, "-f", "json"], ["pending", store, "-f", "json"], ["scan", store, "--keep-going"],
                 ["consumers", store, "-f", "json"], ["info", store, "-f", "json"]):
        r = run_cli(args, timeout=30, env=env)
        clean_error = r.returncode == 2 and r.stderr.startswith("rmqdump: error:")  # e.g. consumers: no config
        assert (r.returncode in (0, 1) or clean_error) and "Traceback" not in r.stderr, r.describe()
        assert r.seconds < 10 and r.maxrss_kb < 200_000, r.describe()


SPARSE_GEN = Path(__file__).resolve().parents[1] / "fixtures" / "bugs" / "sparse-tmpfs-resync" / "make_segment.py"


@pytest.mark.parametrize("tail", [True, False], ids=["records-after-the-hole", "nothing-after-the-hole"])
@pytest.mark.parametrize("use_mmap", [True, False], ids=["mmap", "pread"])
def test_keep_going_jumps_a_tmpfs_hole_without_reading_it(tmp_path, use_mmap, tail):
    """fixtures/bugs/sparse-tmpfs-resync: damage, a 256 MiB hole, intact records at the end, on tmpfs. The
    resync finds the records after the hole and reads none of it: tmpfs allocates every page an mmap read
    touches, so the file's allocated size says what was read (was: the whole hole, 4 GiB for a 4 GiB file)."""
    import os
    import shutil

    from rmqdump.codec.record import Message
    from rmqdump.store.commitlog import CommitLog, Skipped

    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        pytest.skip("no writable tmpfs at /dev/shm")
    spec = importlib.util.spec_from_file_location("make_segment", SPARSE_GEN)
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    d = shm / f"rmqdump-sparse-{os.getpid()}-{tmp_path.name}"
    try:
        after = gen.make(d / "commitlog", tail=tail)
        seg = d / "commitlog" / gen.SEG0
        assert os.stat(seg).st_blocks * 512 < 1 << 20  # the hole is a hole
        walk = CommitLog.open(d).walk(keep_going=True, use_mmap=use_mmap)
        items = list(walk)
        assert [m.offset for m in items if isinstance(m, Message)] == [0, *after]
        assert len([s for s in items if isinstance(s, Skipped)]) == (1 if tail else 0)
        assert os.stat(seg).st_blocks * 512 <= 4 << 20, "the walk read the hole (tmpfs allocated its pages)"
    finally:
        shutil.rmtree(d, ignore_errors=True)
