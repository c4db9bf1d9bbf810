"""Hostile-length corpus: every length or count field of a real store set to 0, -1, 7, 2^15,
2^31-1 and "just past the end", run through every reader command.

Each run is a subprocess with a 5 s wall-clock limit and its own peak RSS measured; it must
end with exit 0/1 (findings) or 2 with exactly one stderr line, never a traceback, and stay
within a small multiple of the largest legal record above what the same command needs on
the undamaged store. Values too wide for a field saturate to its maximum (int8 topic length
and int16 properties length).
"""

from __future__ import annotations

import shutil
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from secutil import SEG0, run_cli

from conftest import real_store
from rmqdump.cli import COMMANDS
from rmqdump.codec.layout import MAX_RECORD_SIZE

TIMEOUT_S = 5.0
#: RSS allowance over the undamaged run of the same command: 16 x the largest legal record
RSS_SLACK_KB = 16 * MAX_RECORD_SIZE // 1024

REC = 239  # the second record of broker498/clean: TopicTest, key-1, 239 bytes
SEG_SIZE = 262144
CQ_FILE = ("TopicTest", "0", "00000000000000000000")
CQ_ENTRY = 3  # commitLogOffset 3358, size 242
CL_END = 2 * SEG_SIZE
INDEX_SLOTS, INDEX_ENTRIES, INDEX_COUNT = 500, 2000, 602
INT_VALUES = [0, -1, 7, 2**15, 2**31 - 1]

COMMANDS_BY_PART = {
    "commitlog": [["scan", "{s}", "-f", "jsonl"], ["scan", "{s}", "--keep-going", "--no-mmap", "-f", "jsonl"],
                  ["verify", "{s}", "-f", "json"], ["lookup", "{s}", "--offset", str(REC), "-f", "jsonl"],
                  ["lookup", "{s}", "--key", "key-1", "--topic", "TopicTest", "-f", "jsonl"],
                  ["info", "{s}", "-f", "json"], ["stats", "{s}", "-f", "json"]],
    "cq": [["cq", "{s}", "-f", "json"], ["cq", "{s}", "--topic", "TopicTest", "--queue", "0", "--raw", "-f", "jsonl"],
           ["verify", "{s}", "-f", "json"], ["lookup", "{s}", "--queue", "TopicTest", "0", "3", "-f", "jsonl"],
           ["consumers", "{s}", "-f", "json", "--unconsumed"], ["info", "{s}", "-f", "json"]],
    "index": [["index", "{s}", "-f", "json"], ["index", "{s}", "--entries", "-f", "jsonl"],
              ["lookup", "{s}", "--key", "key-1", "--topic", "TopicTest", "-f", "jsonl"],
              ["lookup", "{s}", "--key", "order-0", "-f", "jsonl"], ["verify", "{s}", "-f", "json"],
              ["info", "{s}", "-f", "json"]],
}


def _fit(value: int, fmt: str) -> int:
    bits = struct.calcsize(fmt) * 8
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    return max(lo, min(hi, value))


def _values(fmt: str, past_end: int, extra: tuple = ()) -> list:
    out = []
    for v in [*INT_VALUES, past_end]:
        v = _fit(v, fmt)
        if v not in out:
            out.append(v)
    return out + list(extra)


def _index_chain_head() -> tuple[int, int]:
    """(entry number, its prevIndex) of the newest entry of a chain of length >= 3 in clean's index."""
    from rmqdump.store.indexfile import IndexFile

    path = next((real_store("clean") / "index").iterdir())
    with IndexFile(path) as f:
        for slot in range(f.geometry.hash_slot_num):
            chain = list(f.walk(slot))
            if len(chain) >= 3:
                return chain[0].number, chain[0].prev_index
    raise AssertionError("no chain of 3 entries in the real index")


# (part, field name, file (relative), byte position or callable, struct format, values)
def _cases() -> list[tuple]:
    cases = []
    body_pos = REC + 88
    topic_len_pos = body_pos + 16
    props_len_pos = topic_len_pos + 1 + 9
    seg = f"commitlog/{SEG0}"
    cl_fields = [
        ("TOTALSIZE", REC, ">i", SEG_SIZE - REC + 1),
        ("BODYLEN", REC + 84, ">i", 239 - 88 + 1),
        ("TOPICLEN", topic_len_pos, ">b", 239 - (topic_len_pos - REC) - 1 - 2 + 1),
        ("PROPERTIESLEN", props_len_pos, ">h", 239 - (props_len_pos + 2 - REC) + 1),
    ]
    for name, pos, fmt, past in cl_fields:
        for v in _values(fmt, past):
            cases.append(("commitlog", name, seg, pos, fmt, v))
    cq = "consumequeue/" + "/".join(CQ_FILE)
    for v in _values(">q", CL_END):
        cases.append(("cq", "cq_offset", cq, CQ_ENTRY * 20, ">q", v))
    for v in _values(">i", CL_END - 3358 + 1):
        cases.append(("cq", "cq_size", cq, CQ_ENTRY * 20 + 8, ">i", v))
    idx = "index/*"
    for v in _values(">i", INDEX_ENTRIES + 1):
        cases.append(("index", "indexCount", idx, 36, ">i", v))
    for v in _values(">i", INDEX_SLOTS + 1):
        cases.append(("index", "hashSlotCount", idx, 32, ">i", v))
    slot_pos = 40 + 217 * 4  # the slot of TopicTest#key-1 (value 5)
    for v in _values(">i", INDEX_COUNT):
        cases.append(("index", "slot", idx, slot_pos, ">i", v))
    for v in _values(">i", INDEX_COUNT, extra=("self", "cycle")):
        cases.append(("index", "prevIndex", idx, "chain_head", ">i", v))
    return cases


CASES = _cases()


def _apply(store: Path, rel: str, pos, fmt: str, value) -> None:
    path = next(store.glob(rel))
    data = bytearray(path.read_bytes())
    if pos == "chain_head":
        number, prev = _index_chain_head()
        pos = 40 + INDEX_SLOTS * 4 + number * 20 + 16
        if value == "self":
            value = number
        elif value == "cycle":
            # the older entry points back to the head: head -> prev -> head -> ...
            struct.pack_into(fmt, data, 40 + INDEX_SLOTS * 4 + prev * 20 + 16, number)
            value = prev
    struct.pack_into(fmt, data, pos, value)
    path.write_bytes(bytes(data))


_clean_rss: dict[tuple, int] = {}


def _clean_baseline(tmp_path_factory, argv: list[str]) -> int:
    key = tuple(argv)
    if key not in _clean_rss:
        d = tmp_path_factory.mktemp("clean") / "s"
        shutil.copytree(real_store("clean"), d)
        r = run_cli([a.replace("{s}", str(d)) for a in argv], timeout=60)
        _clean_rss[key] = r.maxrss_kb
    return _clean_rss[key]


def _check(run, baseline_kb: int) -> list[str]:
    problems = []
    if run.timed_out:
        problems.append(f"did not finish within {TIMEOUT_S} s")
    elif run.returncode not in (0, 1, 2):
        problems.append(f"exit code {run.returncode}")
    if "Traceback" in run.stderr or "Traceback" in run.stdout:
        problems.append("traceback")
    if run.returncode == 2:
        lines = [line for line in run.stderr.splitlines() if line.strip()]
        if len(lines) != 1 or not lines[0].startswith("rmqdump: error: "):
            problems.append(f"exit 2 without exactly one error line: {lines[:3]}")
    if run.maxrss_kb > baseline_kb + RSS_SLACK_KB:
        problems.append(f"peak RSS {run.maxrss_kb} KiB > {baseline_kb} + {RSS_SLACK_KB} KiB")
    return problems


@pytest.mark.parametrize("part,field,rel,pos,fmt,value", CASES,
                         ids=[f"{c[1]}={c[5]}" for c in CASES])
def test_hostile_length(tmp_path, tmp_path_factory, part, field, rel, pos, fmt, value):
    store = tmp_path / "s"
    shutil.copytree(real_store("clean"), store)
    _apply(store, rel, pos, fmt, value)
    argvs = [[a.replace("{s}", str(store)) for a in argv] for argv in COMMANDS_BY_PART[part]
             if argv[0] in COMMANDS]
    baselines = [_clean_baseline(tmp_path_factory, argv) for argv in COMMANDS_BY_PART[part] if argv[0] in COMMANDS]
    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda a: run_cli(a, timeout=TIMEOUT_S), argvs))
    problems = []
    for run, base in zip(runs, baselines, strict=True):
        for p in _check(run, base):
            problems.append(f"{p}: {run.describe()}")
    assert not problems, "\n\n".join(problems)


def test_the_corpus_damages_what_it_claims(tmp_path):
    """Not vacuous: a hostile TOTALSIZE makes scan stop at the record it names."""
    store = tmp_path / "s"
    shutil.copytree(real_store("clean"), store)
    _apply(store, f"commitlog/{SEG0}", REC, ">i", -1)
    r = run_cli(["scan", store, "-f", "jsonl"], timeout=TIMEOUT_S)
    assert r.returncode == 1 and len(r.stdout.splitlines()) == 1
    assert f"at byte {REC}" in r.stderr


BOMB = Path(__file__).resolve().parents[1] / "fixtures" / "bugs" / "decompression-bomb" / "store"


def _bomb_store(root: Path, inflated: int) -> None:
    """How fixtures/bugs/decompression-bomb was made (one zlib record inflating to ``inflated`` bytes)."""
    from rmqdump.codec.encoder import encode_fields

    body = zlib.compress(b"\0" * inflated, 9)
    rec = encode_fields(topic=b"TopicBomb", body=body, properties=b"", sys_flag=0x301,
                        store_timestamp=1795297000000, born_timestamp=1795297000000)
    (root / "commitlog").mkdir(parents=True)
    (root / "commitlog" / SEG0).write_bytes(rec + bytes(SEG_SIZE - len(rec)))


def test_decompression_bomb_is_bounded(tmp_path):
    store = tmp_path / "s"
    if BOMB.is_dir():
        shutil.copytree(BOMB, store)
    else:
        _bomb_store(store, 128 << 20)
    r = run_cli(["scan", store, "--decompress", "-f", "jsonl"], timeout=TIMEOUT_S * 4)
    base = run_cli(["scan", store, "-f", "jsonl"], timeout=TIMEOUT_S * 4)
    assert base.returncode == 0 and base.maxrss_kb < 200 * 1024, base.describe()
    problems = _check(r, base.maxrss_kb)
    assert not problems, "\n".join(problems) + "\n" + r.describe()


def test_long_legal_index_chain_is_bounded(tmp_path):
    """fixtures/bugs/index-long-chain/make_index.py: one key's chain spans the whole entry table."""
    import importlib.util

    gen = Path(__file__).resolve().parents[1] / "fixtures" / "bugs" / "index-long-chain" / "make_index.py"
    spec = importlib.util.spec_from_file_location("make_index", gen)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    store = tmp_path / "s"
    shutil.copytree(real_store("clean"), store)
    mod.make(store)
    base = _clean_baseline_plain(["lookup", "{s}", "--key", "key-0", "--topic", "TopicTest", "--max", "5"])
    r = run_cli(["lookup", store, "--key", "key-0", "--topic", "TopicTest", "--max", "5", "-f", "jsonl"],
                timeout=TIMEOUT_S)
    problems = _check(r, base)
    assert not problems, "\n".join(problems) + "\n" + r.describe()


def _clean_baseline_plain(argv: list[str]) -> int:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        shutil.copytree(real_store("clean"), Path(d) / "s")
        return run_cli([a.replace("{s}", str(Path(d) / "s")) for a in argv], timeout=60).maxrss_kb


@pytest.mark.parametrize("fast", ["0", "1"])
@pytest.mark.parametrize("argv", [["verify", "{cl}", "--keep-going", "-f", "json"], ["scan", "{cl}", "--keep-going"],
                                  ["stats", "{cl}", "-f", "json"], ["pending", "{cl}", "-f", "json"]])
def test_resync_trap_costs_linear_time(tmp_path, argv, fast):
    """Overlapping, structurally valid candidate records with wrong CRCs (a crafted resync trap) cost
    bounded CRC work: the command finishes in seconds, reports the damage, and says the resync gave up."""
    from secutil import crafted_resync_segment

    cl = tmp_path / "commitlog"
    cl.mkdir()
    crafted_resync_segment(cl / "00000000000000000000")
    r = run_cli([a.replace("{cl}", str(cl)) for a in argv], timeout=20, env={"RMQDUMP_FAST": fast})
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.describe()
    if argv[0] == "verify":
        assert "resynchronisation gave up" in r.stdout, r.stdout[:2000]
    assert r.maxrss_kb < 300_000, r.describe()


@pytest.mark.parametrize("fast", ["0", "1"])
def test_keep_going_reports_a_damaged_body_right_after_damage_at_its_own_offset(tmp_path, fast):
    """Damage at record 1 and a flipped body bit in record 2: --keep-going reports two damaged ranges, the
    second starting at record 2 (its own offset), not one range swallowing both."""
    import json

    from secutil import build_store

    offs = build_store(tmp_path, [(b"T", f"body-{i}".encode() * 8, b"") for i in range(5)])
    seg = tmp_path / "commitlog" / SEG0
    data = bytearray(seg.read_bytes())
    data[offs[1] + 4] ^= 0xFF  # record 1: bad magic
    data[offs[2] + 100] ^= 0x01  # record 2: one bit of its body
    seg.write_bytes(bytes(data))
    env = {"RMQDUMP_FAST": fast}
    r = run_cli(["scan", tmp_path, "--keep-going"], timeout=60, env=env)
    ranges = [line for line in r.stderr.splitlines() if "skipped damaged bytes" in line]
    assert ranges[0].startswith(f"skipped damaged bytes [{offs[1]}, {offs[2]})"), r.stderr
    assert ranges[1].startswith(f"skipped damaged bytes [{offs[2]}, {offs[3]})") and "body_crc" in ranges[1], r.stderr
    assert [json.loads(x)["offset"] for x in r.stdout.splitlines()] == [offs[0], offs[3], offs[4]]
    v = run_cli(["verify", tmp_path, "--keep-going", "-f", "json"], timeout=60, env=env)
    crc = [f for f in json.loads(v.stdout)["findings"] if f["kind"] == "body_crc"]
    assert [f["offset"] for f in crc] == [offs[2]], crc
