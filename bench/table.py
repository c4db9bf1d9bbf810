"""The bench's table and measurement helpers: rows, targets, child processes, machine facts."""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.util
import json
import mmap
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
GiB = 1 << 30
MiB = 1 << 20
# the console script installed beside this interpreter (not a pyenv/asdf shim, which adds its own start-up)
_SCRIPT = Path(sys.executable).with_name("rmqdump")
RMQDUMP = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "rmqdump.cli"]


# --- table -----------------------------------------------------------------------------------------
@dataclass
class Row:
    key: str
    label: str
    figure: str = ""
    reference: str = ""
    ratio: str = ""
    target: str = ""
    result: str = ""  # pass | FAIL | info | n/a ... | error ...
    note: str = ""


ROWS: list[tuple[str, str, str]] = [
    # key, label, target text
    ("read_bw", "page-cache read bandwidth (mmap + numpy sum), 1 KiB store", "reference"),
    ("zlib_crc", "zlib.crc32 over the same mapped bytes (no copy), 1 core", "reference"),
    ("isal_crc", "ISA-L crc32 over the same mapped bytes, 1 core (pip install isal)", "reference"),
    ("rocketmq_ref", "RocketMQ 4.9.8 DefaultMessageStore.load() (recovery, CRC on), the CQ store", "reference"),
    ("crc_kernel", "rmqdump's compiled CRC-32 over the same mapped bytes, 1 core", ">= 0.8 x ISA-L"),
    ("pure_scan_1k", "pure Python walk, header decode, 1 KiB records", "info"),
    ("pure_verify_1k", "pure Python walk + body CRC, 1 KiB records", "info"),
    ("fast_scan_1k", "fast scan decode of all header fields, 1 KiB records", ">= 0.15 x read bw"),
    ("fast_scan_128", "fast scan decode of all header fields, 128 B records", ">= 20 M rec/s"),
    ("fast_verify_1core", "fast verify (walk + header checks + body CRC), 1 KiB, 1 core", ">= 0.75 x zlib"),
    ("fast_verify_jobs", "fast verify, all cores (segments in parallel)", ">= 1.3 x zlib 1-core"),
    ("verify_store", "rmqdump verify STORE (8 queues of CQ files), end to end", ">= 1.0 x zlib (CPU)"),
    ("verify_vs_rocketmq", "rmqdump verify STORE vs RocketMQ's load() of the same store (wall)", ">= 2 x faster"),
    ("verify_store_big", "rmqdump verify STORE, the --big-gib store", "RSS <= 1.1 x smaller store"),
    ("rebuild_cq", "rmqdump repair --rebuild-cq --to DIR, the CQ store (every queue regenerated)",
     "<= 2 x verify STORE"),
    ("rebuild_index", "rmqdump repair --rebuild-index --to DIR, the CQ store (full-size index files)",
     "<= 2 x verify STORE"),
    ("cmd_stats", "rmqdump stats STORE, the CQ store", "info"),
    ("cmd_pending", "rmqdump pending STORE, the CQ store", "info"),
    ("cmd_info", "rmqdump info STORE, the CQ store (walks its last 1 GiB file)", "info"),
    ("cmd_cq", "rmqdump cq STORE (the queue summary: every CQ unit counted), the CQ store", "info"),
    ("cmd_lookup_scan", "rmqdump lookup --key K STORE, the CQ store (no index: a commitlog scan)", "info"),
    ("cmd_scan_key", "rmqdump scan --key K -f jsonl STORE, the CQ store", "info"),
    ("verify_cli", "rmqdump verify --commitlog-only, end to end (process start incl.)", ">= 0.5 x zlib"),
    ("scan_head", "rmqdump scan STORE piped to head -n 1000 (time to first rows)", "info"),
    ("export_cli_parquet", "rmqdump export --to F.parquet (no bodies), 1 segment", ">= 1.5 M rec/s"),
    ("parquet_vs_arrow", "export --to F.parquet vs pyarrow write_table of its columns", ">= 0.5 x"),
    ("export_cli_jsonl", "rmqdump export --to F.jsonl (no bodies), 1 segment", ">= 1 M rec/s"),
    ("scan_jsonl", "rmqdump scan -f jsonl > file (1 KiB bodies, base64)", ">= 1 M rec/s"),
    ("jsonl_vs_orjson", "scan -f jsonl vs orjson encoding the same rows", ">= 0.5 x"),
    ("export_parquet", "Parquet export without bodies (rmqdump.rows.export)", ">= 1 M rec/s"),
    ("lookup_key", "rmqdump lookup --key, full-size index, above rmqdump --version", "<= 5 ms"),
    ("lookup_vs_scan", "lookup --key vs the scan fallback (lookup --scan)", ">= 1000 x"),
    ("version_wall", "rmqdump --version wall time", "<= 60 ms"),
    ("help_wall", "rmqdump --help wall time", "<= 0.3 s"),
    ("rss_scan", "peak RSS, rmqdump scan of the 4 GiB store", "<= 200 MB"),
    ("rss_verify", "peak RSS, rmqdump verify of the 4 GiB store", "<= 200 MB"),
    ("rss_fastwalk", "peak RSS, fastwalk.verify_segments of the 4 GiB store", "<= 200 MB"),
    ("rss_export", "peak RSS, rmqdump export --to F.parquet of the 4 GiB store", "<= 200 MB"),
    ("spark_per_core", "Spark export local[2] per core vs single-process export", ">= 0.8 x"),
    ("spark_scaling", "Spark export local[2] vs local[1]", ">= 1.7 x"),
    ("bulk_append", "bulk append (rmqdump.write.appender.bulk_append), fsync per 4 MiB", ">= 200 MB/s"),
]
ROW_KEYS = [k for k, _, _ in ROWS]


def render_table(rows: dict[str, Row]) -> str:
    head = "| benchmark | figure | reference (same run) | ratio | target | result |\n|---|---|---|---|---|---|\n"
    lines = []
    for key, _, _ in ROWS:
        r = rows[key]
        res = r.result + (f" ({r.note})" if r.note else "")
        lines.append(f"| {r.label} | {r.figure} | {r.reference} | {r.ratio} | {r.target} | {res} |")
    return head + "\n".join(lines) + "\n"


# --- measurement helpers ------------------------------------------------------------------------------
def best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """Fastest of ``repeat`` timed calls: (seconds, last result)."""
    t_best, out = float("inf"), None
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        out = fn()
        t_best = min(t_best, time.perf_counter() - t0)
    return t_best, out


_LAUNCHER = """
import json, os, subprocess, sys, time
t0 = time.perf_counter()
p = subprocess.Popen(sys.argv[2:], stderr=subprocess.PIPE)
err = p.stderr.read()
_, status, ru = os.wait4(p.pid, 0)
wall = time.perf_counter() - t0
with open(sys.argv[1], "w") as f:
    json.dump({"wall": wall, "rss": ru.ru_maxrss * 1024, "code": os.waitstatus_to_exitcode(status),
               "cpu": ru.ru_utime + ru.ru_stime,
               "err": err[-4000:].decode("utf-8", "replace")}, f)
"""


def run_child(cmd: list[str], *, stdout=subprocess.DEVNULL, timeout: float = 3600, env=None,
              ok_codes=(0,)) -> tuple[float, int, int]:
    """(wall seconds, peak RSS bytes, exit code) of :func:`run_child_cpu`."""
    return run_child_cpu(cmd, stdout=stdout, timeout=timeout, env=env, ok_codes=ok_codes)[:3]


def run_child_cpu(cmd: list[str], *, stdout=subprocess.DEVNULL, timeout: float = 3600, env=None,
                  ok_codes=(0,)) -> tuple[float, int, int, float]:
    """Run a command; return (wall seconds, peak RSS bytes, exit code, CPU seconds (user + system)).

    A small launcher process starts and times the command, so that the command's peak RSS
    is its own (a child forked from this big process would inherit our high-water mark).
    """
    fd, report = tempfile.mkstemp(prefix="rmqdump-bench-", suffix=".json")
    os.close(fd)
    try:
        try:
            subprocess.run([sys.executable, "-c", _LAUNCHER, report, *cmd], stdout=stdout, timeout=timeout, env=env,
                           check=True)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{' '.join(cmd[:4])} timed out after {timeout:.0f} s") from None
        res = json.loads(Path(report).read_text())
    finally:
        os.unlink(report)
    if res["code"] not in ok_codes:
        err = res["err"].strip().splitlines()
        raise RuntimeError(f"exit {res['code']}: {err[-1] if err else ''}")
    return res["wall"], res["rss"], res["code"], res["cpu"]


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def map_file(path: Path) -> mmap.mmap:
    fd = os.open(path, os.O_RDONLY)
    try:
        return mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


def module_exists(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def cli_has(command: str) -> bool:
    try:
        from rmqdump.cli import COMMANDS
    except ImportError:
        return False
    return command in COMMANDS and module_exists(COMMANDS[command][0])


def against(row: Row, figure: str, reference: str, ratio: float, what: str, floor: float) -> None:
    """Fill ``row`` with a figure beside its same-run reference; pass when ``ratio >= floor``."""
    row.figure, row.reference, row.ratio = figure, reference, f"{ratio:.2f} x {what}"
    mark(row, ratio >= floor)


def mark(row: Row, ok: bool | None) -> None:
    row.result = "info" if ok is None else ("pass" if ok else "FAIL")


def machine_facts() -> dict[str, str]:
    """CPU, cores, memory, kernel and library versions for the results file."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem = ""
    with contextlib.suppress(OSError, ValueError, IndexError):
        kb = int(Path("/proc/meminfo").read_text().split("\n")[0].split()[1])
        mem = f"{kb / 1024 / 1024:.0f} GiB"
    versions = []
    for mod in ("numba", "numpy", "pyarrow", "pyspark"):
        with contextlib.suppress(Exception):
            from importlib.metadata import version

            versions.append(f"{mod} {version(mod)}")
    commit = ""
    with contextlib.suppress(Exception):
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                                timeout=10).stdout.strip()
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "load average (1/5/15 min) at the end": " / ".join(f"{x:.1f}" for x in os.getloadavg()),
        "cpu": f"{cpu}, {os.cpu_count()} cores",
        "memory": mem,
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "libraries": ", ".join(versions),
    }


def results_markdown(rows: dict[str, Row], facts: dict[str, str], args: argparse.Namespace, seconds: float) -> str:
    misses = [r for r in rows.values() if r.result == "FAIL"]
    other = [r for r in rows.values() if r.result.startswith(("n/a", "error", "skipped"))]
    lines = [
        "# rmqdump benchmark results", "",
        f"Command: `python -m bench.run{' --quick' if args.quick else ''} --size-gib {args.size_gib}"
        f"{f' --big-gib {args.big_gib:g}' if getattr(args, 'big_gib', 0) else ''}"
        f"{' --skip ' + ' '.join(args.skip) if getattr(args, 'skip', None) else ''}"
        f" --repeat {args.repeat or (1 if args.quick else 3)} --write-results` ({seconds:.0f} s)", "",
        "The machine may be shared (2 cores, other jobs running): figures can move by +-50%; read the ratios.", "",
        *[f"- {k}: {v}" for k, v in facts.items()], "",
        "Ratios compare figures with references measured in the same run (best of the repetitions).", "",
        render_table(rows),
    ]
    if misses:
        lines += ["Missed targets:", "", *[f"- {r.label}: {r.figure} ({r.ratio}; target {r.target})" for r in misses], ""]
    if other:
        lines += ["Not measured:", "", *[f"- {r.label}: {r.result}" for r in other], ""]
    return "\n".join(lines)
