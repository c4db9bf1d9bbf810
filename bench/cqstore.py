"""A production-shaped bench store for ``rmqdump verify STORE``: :mod:`bench.gen`'s commitlog (1 GiB segments of
~1 KiB records over ``QUEUES`` queues of one topic) plus its ConsumeQueue files, written as the broker's
dispatcher would (300,000-entry files, the last one preallocated), and a timing/RSS harness.

    python -m bench.cqstore [--size-gib 2] [--data bench/data]   # build (cached) and measure
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np

from bench.gen import QUEUES, TOPIC, StoreSpec, ensure_store
from rmqdump.codec.javahash import java_string_hash
from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, CQ_UNIT
from rmqdump.store.consumequeue.entries import file_name

CQ_FILE_ENTRIES = 300_000
SEGMENT = 1 << 30


def cq_dtype() -> np.dtype:
    fmt = CQ_UNIT.format.lstrip("<>!=@")
    return np.dtype([(n, ">" + c) for n, c in zip(("phys", "size", "tags"), fmt, strict=True)])


def write_consume_queues(store: Path, spec: StoreSpec) -> None:
    """Every record's entry: record ``i`` is queue ``i % QUEUES`` at queue offset ``i // QUEUES``."""
    per_seg = spec.records_per_segment
    total = per_seg * spec.segments
    tags = java_string_hash("bench") if spec.record_size >= 256 else 0
    file_bytes = CQ_FILE_ENTRIES * CQ_STORE_UNIT_SIZE
    for q in range(QUEUES):
        d = store / "consumequeue" / TOPIC.decode() / str(q)
        d.mkdir(parents=True, exist_ok=True)
        idx = np.arange(q, total, QUEUES, dtype=np.int64)
        units = np.zeros(idx.size, cq_dtype())
        units["phys"] = (idx // per_seg) * spec.segment_size + (idx % per_seg) * spec.record_size
        units["size"] = spec.record_size
        units["tags"] = tags
        for k in range(0, max(idx.size, 1), CQ_FILE_ENTRIES):
            part = units[k:k + CQ_FILE_ENTRIES]
            path = d / file_name(k * CQ_STORE_UNIT_SIZE)
            with open(path, "wb") as f:
                f.write(part.tobytes())
                f.truncate(file_bytes)


def ensure_cq_store(root: Path, size_gib: float, log=print) -> Path:
    segments = max(1, round(size_gib * (1 << 30) / SEGMENT))
    return ensure_cq_spec(root, StoreSpec(f"cq1k-{segments}", 1024, SEGMENT, segments), log)


def ensure_cq_spec(root: Path, spec: StoreSpec, log=print) -> Path:
    """:func:`bench.gen.ensure_store` plus the consume queues of its records (cached)."""
    d = ensure_store(root, spec, log)
    stamp = d / "cq.json"
    want = json.dumps({"queues": QUEUES, "file_entries": CQ_FILE_ENTRIES, "segments": spec.segments})
    if not stamp.exists() or stamp.read_text() != want:
        log(f"writing consume queues of {d}")
        write_consume_queues(d, spec)
        stamp.write_text(want)
    return d


def timed(cmd: list[str]) -> tuple[float, float, int, int]:
    """(wall seconds, CPU seconds (user + sys), peak RSS in MB, exit code) of ``cmd`` under /usr/bin/time -v."""
    t = time.perf_counter()
    res = subprocess.run(["/usr/bin/time", "-v", *cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr)
    cpu = sum(float(x) for x in re.findall(r"(?:User|System) time \(seconds\): ([\d.]+)", res.stderr))
    return wall, cpu, int(m.group(1)) // 1024 if m else -1, res.returncode


def crc_seconds(store: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of zlib.crc32 over the commitlog bytes (read from the page cache)."""
    t, c = time.perf_counter(), time.process_time()
    for p in sorted((store / "commitlog").iterdir()):
        with open(p, "rb") as f:
            while chunk := f.read(64 << 20):
                zlib.crc32(chunk)
    return time.perf_counter() - t, time.process_time() - c


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cqstore", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--data", default=str(Path(__file__).with_name("data")))
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--build-only", action="store_true")
    ap.add_argument("--python", default=None, help="run the commands as PYTHON -c 'rmqdump.cli.main()' instead")
    args = ap.parse_args(argv)
    store = ensure_cq_store(Path(args.data), args.size_gib, log=lambda m: print(m, file=sys.stderr))
    if args.build_only:
        print(store)
        return 0
    exe = [str(Path(sys.executable).with_name("rmqdump"))]
    if args.python:
        exe = [args.python, "-c", "import sys; from rmqdump.cli import main; sys.argv[0] = 'rmqdump'; main()"]
    rows = {"verify STORE": [*exe, "verify", str(store)],
            "verify --commitlog-only STORE": [*exe, "verify", "--commitlog-only", str(store)]}
    crc_seconds(store)  # warm the page cache
    crc_wall, crc_cpu = min(crc_seconds(store) for _ in range(args.repeat))
    print(f"zlib.crc32 over the commitlog: {crc_wall:.2f} s wall, {crc_cpu:.2f} s CPU")
    for name, cmd in rows.items():
        runs = [timed(cmd) for _ in range(args.repeat)]
        wall, cpu, _, rc = min(runs)
        print(f"{name}: {wall:.2f} s wall ({crc_wall / wall:.2f} x zlib), {cpu:.2f} s CPU ({crc_cpu / cpu:.2f} x zlib), "
              f"peak RSS {max(r[2] for r in runs)} MB, exit {rc}")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
