"""repair's dispatch replay on the compiled walk (``fast.redispatch.dispatch_candidates``) plans exactly what the
pure walk plans: the records a consume queue already holds are skipped unseen, every other one is looked at.

Stores: the bundled ones written by RocketMQ (``fixtures/oracle``: LMQ, transactions, BatchCQ, CQ holes, a
crash with a lagging CQ, ...) and ``fixtures/store``, as they are and with their consume queues cut: the last
file of a queue deleted, a queue's tail zeroed, a whole queue directory gone, a file from the middle deleted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from oracle_fixtures import fixture_dir, writable_copy

from rmqdump.codec.layout import TRANSACTION_COMMIT_TYPE, TRANSACTION_NOT_TYPE, TRANSACTION_TYPE_MASK
from rmqdump.fast.engine import fast_available
from rmqdump.fast.redispatch import dispatch_candidates
from rmqdump.store.root import Store
from rmqdump.write.repair.plan import plan_repair

needs_kernels = pytest.mark.skipif(not fast_available(), reason="the compiled kernels are not available here")

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
STORES = ["store", *(f"oracle/{p.name}" for p in sorted((FIXTURES / "oracle").iterdir())
                     if (p / "store").is_dir() and "dledger" not in p.name)]


def _src(name: str) -> Path:
    return FIXTURES / name if name == "store" else fixture_dir(name.split("/", 1)[1]) / "store"


def _queues(root: Path) -> list[Path]:
    cq = root / "consumequeue"
    return sorted(q for q in cq.glob("*/*") if q.is_dir() and any(q.iterdir())) if cq.is_dir() else []


def _damage(root: Path, how: str) -> None:
    queues = _queues(root)
    if not queues:
        return
    q = max(queues, key=lambda d: sum(f.stat().st_size for f in d.iterdir()))
    files = sorted(q.iterdir())
    if how == "last-file-deleted":
        files[-1].unlink()
    elif how == "tail-zeroed":
        data = bytearray(files[-1].read_bytes())
        end = len(data.rstrip(b"\0"))
        cut = max(0, end - 3 * 20) // 20 * 20
        data[cut:end] = bytes(end - cut)
        files[-1].write_bytes(bytes(data))
    elif how == "queue-deleted":
        shutil.rmtree(q)
    elif how == "middle-file-deleted" and len(files) > 2:
        files[len(files) // 2].unlink()


def _plan(root: Path, monkeypatch, flag: str) -> dict:
    monkeypatch.setenv("RMQDUMP_FAST", flag)
    plan = plan_repair(root, name_clock=lambda: 1_700_000_000_000)
    try:
        doc = plan.to_dict()
    finally:
        plan.cleanup()
    return doc


@needs_kernels
@pytest.mark.parametrize("how", ["as-is", "last-file-deleted", "tail-zeroed", "queue-deleted", "middle-file-deleted"])
@pytest.mark.parametrize("name", STORES)
def test_compiled_dispatch_replay_plans_what_the_pure_one_plans(name, how, tmp_path, monkeypatch):
    root = writable_copy(_src(name), tmp_path / "s")
    _damage(root, how)
    assert _plan(root, monkeypatch, "1") == _plan(root, monkeypatch, "0")


@needs_kernels
def test_records_a_queue_holds_are_skipped_and_the_others_kept(tmp_path, monkeypatch):
    """On the healthy store nothing past the queues' ends: no record comes out; lower one queue's end and
    exactly its records past the new end come out, in commitlog order, as the pure walk decodes them."""
    monkeypatch.setenv("RMQDUMP_FAST", "1")
    cl = Store.open(FIXTURES / "store").commitlog
    pure = [r for r in cl.walk(check_crc=False, read_body=False) if hasattr(r, "topic")
            and r.sys_flag & TRANSACTION_TYPE_MASK in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)]
    end = max(r.offset + r.size for r in pure)
    built = {}
    for r in pure:
        key = (r.topic, r.queue_id)
        built[key] = max(built.get(key, -1), r.offset + r.size)
    assert list(dispatch_candidates(cl, cl.min_offset, end, built)) == []
    key, cut = next(iter(built)), None
    mine = [r for r in pure if (r.topic, r.queue_id) == key]
    cut = mine[len(mine) // 2].offset
    got = list(dispatch_candidates(cl, cl.min_offset, end, {**built, key: cut}, batch_records=3))
    assert [r.offset for r in got] == [r.offset for r in mine if r.offset + r.size > cut]
    def seen(r):  # what the replay reads of a record
        return r.offset, r.size, r.topic, r.queue_id, r.queue_offset, r.sys_flag, r.store_timestamp, r.properties

    assert [seen(r) for r in got] == [seen(r) for r in pure if r.offset in {g.offset for g in got}]


def test_repair_plans_without_numpy_and_numba(tmp_path, monkeypatch):
    """The base install (no ``fast`` extra): the plan comes from the pure walks, identical, never an ImportError."""
    root = writable_copy(_src("oracle/498-cq-hole"), tmp_path / "s")
    _damage(root, "tail-zeroed")
    code = ("import json, sys\n"
            "sys.modules['numpy'] = sys.modules['numba'] = None\n"
            "from rmqdump.write.repair.plan import plan_repair\n"
            "p = plan_repair(sys.argv[1], name_clock=lambda: 1_700_000_000_000)\n"
            "print(json.dumps(p.to_dict()))\n"
            "p.cleanup()\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "RMQDUMP_FAST"}
    res = subprocess.run([sys.executable, "-c", code, str(root)], capture_output=True, text=True, env=env, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    assert json.loads(res.stdout) == json.loads(json.dumps(_plan(root, monkeypatch, "0")))
