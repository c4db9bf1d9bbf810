"""rmqdump benchmark suite: one command, one table, every figure beside its reference.

    python -m bench.run                     # full run (stores of >= 1 GiB in bench/data/, reused)
    python -m bench.run --quick             # tiny stores, one repetition (smoke test)
    python -m bench.run --write-results     # also write bench/RESULTS.md

Every target is a ratio to a reference measured in the same run (CPU speed varies a lot from
run to run here), except the absolute ones the issue states (records/s, ms, MB). Figures are
the best of ``--repeat`` runs, references too. Rows whose module does not exist yet print
"n/a (module missing)"; rows that fail print the error. Stores are generated with rmqdump's
own encoder (bench/gen.py). Not part of the pytest run (tests/test_bench_smoke.py runs --quick).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as _dt
import importlib.util
import json
import mmap
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.gen import BASE_TS, QUEUES, TOPIC, StoreSpec, ensure_store, key_for, link_prefix  # noqa: E402

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
    ("rocketmq_ref", "RocketMQ recovery walk (reported in the issue)", "reference"),
    ("pure_scan_1k", "pure Python walk, header decode, 1 KiB records", "info"),
    ("pure_verify_1k", "pure Python walk + body CRC, 1 KiB records", "info"),
    ("fast_scan_1k", "fast scan decode of all header fields, 1 KiB records", ">= 0.15 x read bw"),
    ("fast_scan_128", "fast scan decode of all header fields, 128 B records", ">= 20 M rec/s"),
    ("fast_verify_1core", "fast verify (walk + header checks + body CRC), 1 KiB, 1 core", ">= 0.75 x zlib"),
    ("fast_verify_jobs", "fast verify, all cores (segments in parallel)", ">= 1.3 x zlib 1-core"),
    ("verify_store", "rmqdump verify STORE (8 queues of CQ files), end to end", ">= 1.0 x zlib (CPU)"),
    ("verify_store_big", "rmqdump verify STORE, the --big-gib store", "RSS <= 1.1 x smaller store"),
    ("verify_cli", "rmqdump verify --commitlog-only, end to end (process start incl.)", ">= 0.5 x zlib"),
    ("scan_head", "rmqdump scan STORE piped to head -n 1000 (time to first rows)", "info"),
    ("export_cli_parquet", "rmqdump export --to F.parquet (no bodies), 1 segment", ">= 1.5 M rec/s"),
    ("export_cli_jsonl", "rmqdump export --to F.jsonl (no bodies), 1 segment", ">= 1 M rec/s"),
    ("scan_jsonl", "rmqdump scan -f jsonl > /dev/null", ">= 300 k rec/s"),
    ("export_parquet", "Parquet export without bodies (rmqdump.rows.export)", ">= 1 M rec/s"),
    ("lookup_key", "rmqdump lookup --key, full-size index, after start", "<= 50 ms"),
    ("lookup_vs_scan", "lookup --key vs the scan fallback (lookup --scan)", ">= 1000 x"),
    ("help_wall", "rmqdump --help wall time", "<= 0.3 s"),
    ("rss_scan", "peak RSS, rmqdump scan of the 4 GiB store", "<= 200 MB"),
    ("rss_verify", "peak RSS, rmqdump verify of the 4 GiB store", "<= 200 MB"),
    ("rss_fastwalk", "peak RSS, fastwalk.verify_segments of the 4 GiB store", "<= 200 MB"),
    ("rss_export", "peak RSS, rmqdump export --to F.parquet of the 4 GiB store", "<= 200 MB"),
    ("spark_per_core", "Spark export local[2] per core vs single-process export", ">= 0.5 x"),
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


def mark(row: Row, ok: bool | None) -> None:
    row.result = "info" if ok is None else ("pass" if ok else "FAIL")


# --- the suite -----------------------------------------------------------------------------------------
class Bench:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.quick = args.quick
        self.repeat = args.repeat or (1 if self.quick else 3)
        self.heavy_repeat = min(self.repeat, 2)  # rows that take minutes (export, Spark, append)
        self.data = Path(args.data) if args.data else BENCH / "data" / ("quick" if self.quick else "")
        self.out = Path(args.out) if args.out else BENCH / "out" / ("quick" if self.quick else "")
        self.rows = {k: Row(k, label, target=target) for k, label, target in ROWS}
        self.ref: dict[str, float] = {}
        seg = 2 * MiB if self.quick else GiB
        n1k = max(2, int(round(args.size_gib * GiB / seg))) if not self.quick else 4
        self.spec1k = StoreSpec("rec1k", 1024, seg, n1k)
        self.spec128 = StoreSpec("rec128", 128, seg, 1 if not self.quick else 2)
        self.skip = set(args.skip or ())

    def log(self, msg: str) -> None:
        if not self.args.silent:
            print(f"[bench] {msg}", file=sys.stderr, flush=True)

    # stores
    def prepare(self) -> None:
        # byte-compile rmqdump as a pip install does (an editable install under PYTHONDONTWRITEBYTECODE=1
        # would otherwise recompile ~200 KB of source in every CLI process the bench starts)
        import compileall

        compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "rmqdump"), quiet=1)
        self.data.mkdir(parents=True, exist_ok=True)
        self.out.mkdir(parents=True, exist_ok=True)
        from bench.cqstore import ensure_cq_spec

        if not self.quick:  # the production-shaped store: 1 GiB segments plus 8 queues of 300,000-entry CQ files
            self.spec1k = StoreSpec(f"cq1k-{self.spec1k.segments}", 1024, GiB, self.spec1k.segments)
        self.store1k = ensure_cq_spec(self.data, self.spec1k, self.log)
        self.store128 = ensure_store(self.data, self.spec128, self.log)
        half = max(1, self.spec1k.segments // 2)
        self.store_e2e = link_prefix(self.data, self.store1k, "rec1k_half", half)
        self.e2e_bytes = half * self.spec1k.segment_size
        self.seg1k = sorted((self.store1k / "commitlog").iterdir())[0]
        self.seg128 = sorted((self.store128 / "commitlog").iterdir())[0]

    def run(self) -> dict[str, Row]:
        self.prepare()
        steps = [
            ("read_bw", self.b_references), ("pure_scan_1k", self.b_pure), ("fast_scan_1k", self.b_fast_scan),
            ("fast_verify_1core", self.b_fast_verify), ("verify_store", self.b_verify_store),
            ("verify_cli", self.b_verify_cli), ("scan_head", self.b_scan_head),
            ("export_cli_parquet", self.b_export_cli), ("scan_jsonl", self.b_scan_jsonl), ("export_parquet", self.b_export), ("lookup_key", self.b_lookup),
            ("help_wall", self.b_help), ("rss_scan", self.b_rss), ("spark_per_core", self.b_spark),
            ("bulk_append", self.b_append),
        ]
        groups = {"read_bw": ["read_bw", "zlib_crc", "rocketmq_ref"], "pure_scan_1k": ["pure_scan_1k", "pure_verify_1k"],
                  "fast_scan_1k": ["fast_scan_1k", "fast_scan_128"],
                  "fast_verify_1core": ["fast_verify_1core", "fast_verify_jobs"],
                  "verify_store": ["verify_store", "verify_store_big"],
                  "export_cli_parquet": ["export_cli_parquet", "export_cli_jsonl"],
                  "lookup_key": ["lookup_key", "lookup_vs_scan"], "rss_scan": ["rss_scan", "rss_verify", "rss_fastwalk", "rss_export"],
                  "spark_per_core": ["spark_per_core", "spark_scaling"]}
        for key, fn in steps:
            keys = groups.get(key, [key])
            names = {key, *keys, key.split("_")[0]}
            only = set(self.args.only or ())
            if names & self.skip or (only and key != "read_bw" and not names & only):
                for k in keys:
                    self.rows[k].result = "skipped"
                continue
            self.log(f"running {key} ...")
            try:
                fn()
            except Exception as e:  # one broken benchmark must not hide the others
                if self.args.traceback:
                    traceback.print_exc()
                for k in keys:
                    if not self.rows[k].result:
                        self.rows[k].result = f"error: {type(e).__name__}: {str(e)[:160]}"
        return self.rows

    # references: read bandwidth, zlib CRC ---------------------------------------------------------------
    def b_references(self) -> None:
        mm = map_file(self.seg1k)
        try:
            words = [np.frombuffer(mm, dtype=np.uint64)]
            size = len(mm)
            t_sum, _ = best(lambda: int(words[0].sum()), self.repeat + 1)
            t_crc, _ = best(lambda: zlib.crc32(mm), self.repeat + 1)
            words.clear()
        finally:
            mm.close()
        self.ref["read_bw"] = gbps(size, t_sum)
        self.ref["zlib"] = gbps(size, t_crc)
        r = self.rows["read_bw"]
        r.figure = f"{self.ref['read_bw']:.2f} GB/s"
        r.result = "reference"
        r = self.rows["zlib_crc"]
        r.figure = f"{self.ref['zlib']:.2f} GB/s"
        r.ratio = f"{self.ref['zlib'] / self.ref['read_bw']:.3f} x read bw"
        r.result = "reference"
        r = self.rows["rocketmq_ref"]
        r.figure = f"~{0.55 * self.ref['zlib']:.2f} GB/s (0.55 x zlib)"
        r.reference = f"{self.ref['zlib']:.2f} GB/s zlib"
        r.ratio = "0.55 x zlib"
        r.result = "reference"

    # pure path --------------------------------------------------------------------------------------------
    def b_pure(self) -> None:
        from rmqdump.store.commitlog import CommitLog

        cl = CommitLog.open(self.seg1k)
        limit = cl.segments[0].size if self.quick else min(cl.segments[0].size, 256 * MiB)

        def walk(check_crc: bool) -> int:
            w = cl.walk(end=limit, check_crc=check_crc, read_body=False)
            for _ in w:
                pass
            return w.records

        for key, crc in (("pure_scan_1k", False), ("pure_verify_1k", True)):
            t, n = best(lambda crc=crc: walk(crc), self.repeat)
            r = self.rows[key]
            rate = gbps(limit, t)
            r.figure = f"{n / t / 1e6:.2f} M rec/s, {limit / t / 1e6:.0f} MB/s"
            r.reference = f"{self.ref['read_bw']:.2f} GB/s read, {self.ref['zlib']:.2f} GB/s zlib"
            r.ratio = f"{rate / self.ref['read_bw']:.3f} x read bw, {rate / self.ref['zlib']:.3f} x zlib"
            r.result = "info"
            r.note = f"first {limit // MiB} MiB"

    # fast scan ----------------------------------------------------------------------------------------------
    def _fast_walk(self, seg_path: Path, check_crc: bool) -> int:
        from rmqdump.fast import walk as fastwalk
        from rmqdump.store.commitlog import CommitLog

        seg = CommitLog.open(seg_path).segments[0]
        with fastwalk.walk_segment_fast(seg, 0, check_crc) as w:
            for _ in w:
                pass
        if w.stop.kind not in ("blank", "end"):
            raise RuntimeError(f"fast walk stopped at {w.stop}")
        return w.records

    def b_fast_scan(self) -> None:
        from rmqdump.fast import walk as fastwalk

        if not fastwalk.fast_available():
            for k in ("fast_scan_1k", "fast_scan_128"):
                self.rows[k].result = "n/a (numba/numpy missing)"
            return
        fastwalk.kernels()
        self._fast_walk(self.seg128, False)  # compile / load the cache outside the timing
        size = self.seg1k.stat().st_size
        t, n = best(lambda: self._fast_walk(self.seg1k, False), self.repeat)
        r = self.rows["fast_scan_1k"]
        rate = gbps(size, t)
        r.figure = f"{rate:.2f} GB/s, {n / t / 1e6:.1f} M rec/s"
        r.reference = f"{self.ref['read_bw']:.2f} GB/s read bw"
        ratio = rate / self.ref["read_bw"]
        r.ratio = f"{ratio:.3f} x"
        mark(r, ratio >= 0.15)
        size = self.seg128.stat().st_size
        t, n = best(lambda: self._fast_walk(self.seg128, False), self.repeat)
        r = self.rows["fast_scan_128"]
        rec = n / t
        r.figure = f"{rec / 1e6:.1f} M rec/s, {gbps(size, t):.2f} GB/s"
        r.reference = "absolute target"
        r.ratio = f"{rec / 20e6:.2f} x target"
        mark(r, rec >= 20e6)

    # fast verify ----------------------------------------------------------------------------------------------
    def b_fast_verify(self) -> None:
        from rmqdump.fast import walk as fastwalk
        from rmqdump.store.commitlog import CommitLog

        if not fastwalk.fast_available():
            for k in ("fast_verify_1core", "fast_verify_jobs"):
                self.rows[k].result = "n/a (numba/numpy missing)"
            return
        size = self.seg1k.stat().st_size
        self._fast_walk(self.seg1k, True)
        t, _ = best(lambda: self._fast_walk(self.seg1k, True), self.repeat)
        rate = gbps(size, t)
        r = self.rows["fast_verify_1core"]
        r.figure = f"{rate:.2f} GB/s"
        r.reference = f"{self.ref['zlib']:.2f} GB/s zlib 1-core"
        r.ratio = f"{rate / self.ref['zlib']:.2f} x"
        mark(r, rate / self.ref["zlib"] >= 0.75)
        b = fastwalk.backend()
        kind = "shared-library" if b.kind.startswith("shared library") else "numba-JIT"
        r.note = f"CRC: {'PCLMULQDQ folding' if b.clmul else 'slice-by-8 table'}, {kind} kernels"
        cl = CommitLog.open(self.store_e2e)
        jobs = fastwalk.default_jobs()

        def par() -> None:
            res = fastwalk.verify_segments(cl.segments, jobs=jobs)
            bad = [s for s in res if s.stop not in ("blank", "end")]
            if bad:
                raise RuntimeError(f"verify stopped: {bad[0]}")

        t, _ = best(par, self.repeat)
        rate = gbps(self.e2e_bytes, t)
        r = self.rows["fast_verify_jobs"]
        r.figure = f"{rate:.2f} GB/s ({jobs} threads, {len(cl.segments)} segments)"
        r.reference = f"{self.ref['zlib']:.2f} GB/s zlib 1-core"
        r.ratio = f"{rate / self.ref['zlib']:.2f} x"
        mark(r, rate / self.ref["zlib"] >= 1.3)

    # CLI end to end ----------------------------------------------------------------------------------------
    def b_verify_cli(self) -> None:
        r = self.rows["verify_cli"]
        if not cli_has("verify"):
            r.result = "n/a (module missing)"
            return
        cmd = [*RMQDUMP, "verify", "--commitlog-only", "-q", "-f", "json", str(self.store_e2e)]
        t = min(run_child(cmd, timeout=1800)[0] for _ in range(self.repeat))
        rate = gbps(self.e2e_bytes, t)
        r.figure = f"{rate:.2f} GB/s ({t:.2f} s for {self.e2e_bytes / GiB:.3g} GiB)"
        r.reference = f"{self.ref['zlib']:.2f} GB/s zlib 1-core"
        r.ratio = f"{rate / self.ref['zlib']:.3f} x"
        mark(r, rate / self.ref["zlib"] >= 0.5)

    def _cli_rows(self, cmd: list[str], **kw) -> tuple[float, int, float]:
        """Best wall, largest peak RSS and best CPU of ``self.repeat`` runs of ``cmd``."""
        runs = [run_child_cpu(cmd, timeout=1800, **kw) for _ in range(self.repeat)]
        return min(r[0] for r in runs), max(r[1] for r in runs), min(r[3] for r in runs)

    def _verify_store(self, store: Path, nbytes: int) -> tuple[str, str, float, int]:
        wall, rss, cpu = self._cli_rows([*RMQDUMP, "verify", "-q", str(store)], ok_codes=(0, 1))
        zlib_s = nbytes / (self.ref["zlib"] * 1e9)
        fig = f"{wall:.2f} s wall, {cpu:.2f} s CPU, peak RSS {rss / 1e6:.0f} MB ({nbytes / GiB:.3g} GiB)"
        return fig, f"{zlib_s:.2f} s zlib.crc32 1-core", zlib_s / cpu, rss

    def b_verify_store(self) -> None:
        r = self.rows["verify_store"]
        fig, ref, ratio, rss = self._verify_store(self.store1k, self.spec1k.total_bytes)
        r.figure, r.reference, r.ratio = fig, ref, f"{ratio:.2f} x zlib (CPU)"
        mark(r, ratio >= 1.0)
        r.note = "CQ join in bounded memory (64 MiB windows); wall: other jobs share the 2 cores"
        rb = self.rows["verify_store_big"]
        if not self.args.big_gib:
            rb.result = "skipped"
            return
        from bench.cqstore import SEGMENT, ensure_cq_spec

        n = max(1, round(self.args.big_gib * GiB / SEGMENT))
        spec = StoreSpec(f"cq1k-{n}", 1024, SEGMENT, n)
        existed = (self.data / spec.name).exists()
        big = ensure_cq_spec(self.data, spec, self.log)
        try:
            fig, ref, ratio_b, rss_b = self._verify_store(big, spec.total_bytes)
        finally:
            if not existed:
                shutil.rmtree(big)
        rb.figure, rb.reference = fig, f"{ref}; {rss / 1e6:.0f} MB at {self.spec1k.total_bytes / GiB:.3g} GiB"
        rb.ratio = f"{rss_b / rss:.2f} x RSS, {ratio_b:.2f} x zlib (CPU)"
        mark(rb, rss_b <= 1.1 * rss)

    def b_scan_head(self) -> None:
        r = self.rows["scan_head"]
        cmd = ["sh", "-c", f"{' '.join(RMQDUMP)} scan {self.store1k} | head -n 1000"]
        wall, rss, cpu = self._cli_rows(cmd)
        base = min(run_child([*RMQDUMP, "--version"])[0] for _ in range(self.repeat + 1))
        r.figure = f"{wall * 1e3:.0f} ms wall ({cpu * 1e3:.0f} ms CPU)"
        r.reference = f"start-up {base * 1e3:.0f} ms (rmqdump --version)"
        r.ratio = f"{wall / base:.2f} x start-up"
        r.result = "info"

    def b_export_cli(self) -> None:
        store = link_prefix(self.data, self.store1k, "rec1k_one", 1)
        rows = self.spec1k.records_per_segment
        for key, suffix in (("export_cli_parquet", "parquet"), ("export_cli_jsonl", "jsonl")):
            r = self.rows[key]
            out = self.out / f"export-cli.{suffix}"
            wall, rss, cpu = self._cli_rows([*RMQDUMP, "export", "-q", "--overwrite", str(store), "--to", str(out)])
            rate = rows / wall
            r.figure = f"{rate / 1e6:.2f} M rec/s ({rows} rows, {wall:.2f} s wall, {cpu:.2f} s CPU)"
            r.reference = "absolute target, process start incl."
            goal = 1.5e6 if suffix == "parquet" else 1e6
            r.ratio = f"{rate / goal:.2f} x target"
            mark(r, rate >= goal)
            r.note = f"peak RSS {rss / 1e6:.0f} MB"
            out.unlink(missing_ok=True)

    def b_scan_jsonl(self) -> None:
        r = self.rows["scan_jsonl"]
        if not cli_has("scan"):
            r.result = "n/a (module missing)"
            return
        nbytes = self.spec1k.segment_size if self.quick else 128 * MiB
        records = -(-nbytes // self.spec1k.record_size)
        records = min(records, self.spec1k.records_per_segment)
        cmd = [*RMQDUMP, "scan", "-f", "jsonl", "-q", "--max-bytes", str(nbytes), str(self.store1k)]
        t = min(run_child(cmd, timeout=1800)[0] for _ in range(self.repeat))
        r.figure = f"{records / t / 1e3:.0f} k rec/s ({records} records, {t:.2f} s)"
        r.reference = "absolute target"
        r.ratio = f"{records / t / 300e3:.2f} x target"
        mark(r, records / t >= 300e3)
        r.note = "default body mode (base64), process start incl."

    # Parquet export --------------------------------------------------------------------------------------
    def _single_export(self, store: Path, out: Path) -> dict:
        from rmqdump.rows import export as ex

        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        return ex.export_throughput(str(store), out, fmt="parquet", include_body=False)

    def b_export(self) -> None:
        r = self.rows["export_parquet"]
        if not (module_exists("rmqdump.rows.export") and module_exists("pyarrow")):
            r.result = "n/a (module missing)"
            return
        store = link_prefix(self.data, self.store1k, "rec1k_one", 1)
        best_rate, res = 0.0, None
        for _ in range(self.heavy_repeat):
            res = self._single_export(store, self.out / "export.parquet")
            best_rate = max(best_rate, res["rows_per_s"])
        self.ref["export_rows_per_s"] = best_rate
        r.figure = f"{best_rate / 1e6:.2f} M rec/s ({res['rows']} rows, {res['mb_per_s']:.0f} MB/s in)"
        r.reference = "absolute target"
        r.ratio = f"{best_rate / 1e6:.2f} x target"
        mark(r, best_rate >= 1e6)

    # lookup -------------------------------------------------------------------------------------------------
    def _index_store(self) -> tuple[Path, int]:
        """The 128 B store plus one full-size IndexFile of every record's KEYS (built once)."""
        from rmqdump.codec.layout import MAX_HASH_SLOT_NUM, MAX_INDEX_NUM
        from rmqdump.store.indexfile import IndexFileWriter

        root = self.data / "rec128_indexed"
        slots, entries = (MAX_HASH_SLOT_NUM, MAX_INDEX_NUM) if not self.quick else (20000, 40000)
        spec = self.spec128
        n = spec.records_per_segment * spec.segments
        stamp = root / "bench-index.json"
        want = {"store": json.loads((self.store128 / "bench.json").read_text()), "slots": slots, "entries": entries}
        if stamp.exists() and json.loads(stamp.read_text()) == want:
            return root, n
        if root.exists():
            shutil.rmtree(root)
        link_prefix(self.data, self.store128, "rec128_indexed", spec.segments)
        self.log(f"building a {slots}-slot / {entries}-entry index of {n} keys (once) ...")
        idx = np.arange(n, dtype=np.int64)
        hashes = _bench_key_hashes(idx)
        per = spec.records_per_segment
        phys = (idx // per) * spec.segment_size + (idx % per) * spec.record_size
        ts = BASE_TS + idx // 1000
        w = IndexFileWriter.create_in(root / "index", slots, entries, now_ms=BASE_TS, utc=True)
        try:
            put = w.put_hash
            for h, p, s in zip(hashes.tolist(), phys.tolist(), ts.tolist(), strict=True):
                if not put(h, p, s):
                    raise RuntimeError("index file full")
        finally:
            w.close()
        stamp.write_text(json.dumps(want))
        return root, n

    def b_lookup(self) -> None:
        r, rs = self.rows["lookup_key"], self.rows["lookup_vs_scan"]
        if not (cli_has("lookup") and module_exists("rmqdump.store.indexfile")):
            r.result = rs.result = "n/a (module missing)"
            return
        from rmqdump.store.indexfile import IndexFileWriter  # noqa: F401  (the writer must exist)

        root, n = self._index_store()
        key = key_for(n * 2 // 3)
        base = min(run_child([*RMQDUMP, "--version"])[0] for _ in range(self.repeat + 2))
        cmd = [*RMQDUMP, "lookup", str(root), "--key", key, "--topic", TOPIC.decode(), "-f", "jsonl", "-q"]
        out = self.out / "lookup.jsonl"
        with open(out, "wb") as f:
            run_child(cmd, stdout=f)
        hits = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
        if len(hits) != 1 or hits[0].get("keys") != [key]:
            raise RuntimeError(f"lookup --key {key} returned {len(hits)} records")
        t = min(run_child(cmd)[0] for _ in range(self.repeat + 2))
        after = max(t - base, 1e-4)
        r.figure = f"{after * 1e3:.1f} ms after start ({t * 1e3:.0f} ms wall)"
        r.reference = f"start-up {base * 1e3:.0f} ms (rmqdump --version)"
        r.ratio = f"{after / 0.05:.2f} x target"
        mark(r, after <= 0.05)
        r.note = f"{n} keys in the index"
        if {"lookup_vs_scan", "lookup_scan"} & self.skip:
            rs.result = "skipped"
            return
        scan_cmd = [*cmd, "--scan"]
        ts = min(run_child(scan_cmd, timeout=3600)[0] for _ in range(1 if not self.quick else 2))
        scan_after = max(ts - base, 1e-4)
        rs.figure = f"scan fallback {scan_after:.2f} s vs lookup {after * 1e3:.1f} ms"
        rs.reference = "lookup --key --scan, same store"
        rs.ratio = f"{scan_after / after:.0f} x"
        mark(rs, scan_after / after >= 1000)
        rs.note = f"{self.spec128.total_bytes / GiB:.3g} GiB commitlog of 128 B records"

    def b_help(self) -> None:
        r = self.rows["help_wall"]
        t = min(run_child([*RMQDUMP, "--help"])[0] for _ in range(self.repeat + 4))
        r.figure = f"{t:.3f} s"
        r.reference = "absolute target"
        r.ratio = f"{t / 0.3:.2f} x limit"
        mark(r, t <= 0.3)

    # memory ---------------------------------------------------------------------------------------------------
    def b_rss(self) -> None:
        size = self.spec1k.total_bytes
        what = f"{size / GiB:.3g} GiB" if size >= GiB else f"{size / MiB:.3g} MiB"
        rows = {
            "rss_scan": ([*RMQDUMP, "scan", "-q", "-f", "jsonl", "--topic", "__no_such_topic__", str(self.store1k)],
                         "scan"),
            "rss_verify": ([*RMQDUMP, "verify", "--commitlog-only", "-q", "-f", "json", str(self.store1k)], "verify"),
            "rss_fastwalk": ([sys.executable, "-c", _FASTWALK_RSS, str(self.store1k)], None),
            "rss_export": ([*RMQDUMP, "export", "-q", "--overwrite", str(self.store1k), "--to",
                            str(self.out / "rss-export.parquet")], "export"),
        }
        for key, (cmd, command) in rows.items():
            r = self.rows[key]
            r.label = r.label.replace("4 GiB", what)
            if command is not None and not cli_has(command):
                r.result = "n/a (module missing)"
                continue
            if command is None and not module_exists("numba"):
                r.result = "n/a (numba missing)"
                continue
            try:
                wall, rss, _ = run_child(cmd, timeout=3600)
            except Exception as e:
                r.result = f"error: {str(e)[:160]}"
                continue
            r.figure = f"{rss / 1e6:.0f} MB ({wall:.1f} s, {size / wall / 1e9:.2f} GB/s)"
            r.reference = "absolute target"
            r.ratio = f"{rss / 200e6:.2f} x limit"
            mark(r, rss <= 200e6)

    # Spark ------------------------------------------------------------------------------------------------------
    def b_spark(self) -> None:
        r1, r2 = self.rows["spark_per_core"], self.rows["spark_scaling"]
        if not (module_exists("rmqdump.spark") and module_exists("pyspark") and module_exists("rmqdump.rows.export")):
            r1.result = r2.result = "n/a (module missing)"
            return
        if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
            r1.result = r2.result = "n/a (no Java)"
            return
        store = self.store_e2e
        # The per-core reference is the single-process export on ONE core: unpinned, rmqdump.rows.export
        # encodes Parquet on a second thread while the main thread decodes, i.e. it uses up to two
        # cores, which would make "per core" compare one Spark core with two (shown in the note).
        single = single_1core = 0.0
        cpus = os.sched_getaffinity(0)
        for _ in range(self.heavy_repeat):
            single = max(single, self._single_export(store, self.out / "export-ref.parquet")["rows_per_s"])
            os.sched_setaffinity(0, {min(cpus)})  # this thread, and the encoder thread export() starts
            try:
                single_1core = max(single_1core,
                                   self._single_export(store, self.out / "export-ref.parquet")["rows_per_s"])
            finally:
                os.sched_setaffinity(0, cpus)
        res = {}
        for cores in (1, 2):
            out = self.out / f"spark-local{cores}"
            if out.exists():
                shutil.rmtree(out)
            jf = self.out / f"spark-local{cores}.json"
            cmd = [sys.executable, "-c", _SPARK_EXPORT, f"local[{cores}]", str(store), str(out), str(jf),
                   str(self.heavy_repeat)]
            run_child(cmd, timeout=3600)
            res[cores] = json.loads(jf.read_text())
        per_core = res[2]["rows_per_s"] / 2
        r1.figure = f"{per_core / 1e3:.0f} k rec/s per core (local[2]: {res[2]['rows_per_s'] / 1e3:.0f} k rec/s)"
        r1.reference = f"{single_1core / 1e3:.0f} k rec/s single-process export on 1 core"
        r1.ratio = f"{per_core / single_1core:.2f} x"
        mark(r1, per_core / single_1core >= 0.5)

        def tasks(r: dict) -> str:
            t = r.get("tasks") or []
            cpu = sum(x["cpu_seconds"] for x in t) / max(1, len(t))
            wall = sum(x["seconds"] for x in t) / max(1, len(t))
            return f"{len(t)} tasks of {wall:.2f} s ({cpu:.2f} s CPU) in a {r['seconds']:.2f} s job"

        r1.note = (f"unpinned single-process export {single / 1e3:.0f} k rec/s; local[2]: {tasks(res[2])}; "
                   f"not timed: session start {res[2]['session_seconds']:.1f} s, "
                   f"Python worker start {res[2]['warmup_seconds']:.1f} s")
        scale = res[2]["rows_per_s"] / res[1]["rows_per_s"]
        r2.figure = f"local[2] {res[2]['rows_per_s'] / 1e3:.0f} k rec/s"
        r2.reference = f"local[1] {res[1]['rows_per_s'] / 1e3:.0f} k rec/s"
        r2.ratio = f"{scale:.2f} x"
        mark(r2, scale >= 1.7)
        r2.note = f"{self.e2e_bytes // self.spec1k.segment_size} segments = tasks; local[1]: {tasks(res[1])}"

    # bulk append ---------------------------------------------------------------------------------------------------
    def b_append(self) -> None:
        r = self.rows["bulk_append"]
        if not module_exists("rmqdump.write.appender"):
            r.result = "n/a (module missing)"
            return
        from rmqdump.write.appender import bulk_append
        from rmqdump.write.writer import MessageSpec

        total = (8 if self.quick else 256) * MiB
        body = bytes(range(256)) * 4
        n = total // 1100
        best_rate, res = 0.0, None
        for _ in range(self.heavy_repeat):
            store = self.out / "append-store"
            if store.exists():
                shutil.rmtree(store)
            specs = (MessageSpec(topic="BenchAppend", body=body, queue_id=i % QUEUES, keys=f"a{i}",
                                 born_timestamp=BASE_TS, store_timestamp=BASE_TS) for i in range(n))
            res = bulk_append(store, specs, batch_bytes=4 * MiB, create=True)
            best_rate = max(best_rate, res.mb_per_s)
        r.figure = f"{best_rate:.0f} MB/s ({res.records} records, {res.bytes / MiB:.0f} MiB, {res.commits} fsyncs)"
        r.reference = "absolute target"
        r.ratio = f"{best_rate / 200:.2f} x target"
        mark(r, best_rate >= 200)
        r.note = "library API, 1 KiB bodies, index built"


def _bench_key_hashes(idx: np.ndarray) -> np.ndarray:
    """IndexFile keyHash of ``BenchTopic#<key_for(i)>`` for every i (vectorised Java hashCode)."""
    from rmqdump.codec.javahash import index_key_hash

    prefix = f"{TOPIC.decode()}#{key_for(0)[:1]}"
    h = np.full(len(idx), 0, dtype=np.uint64)
    m = np.uint64(0xFFFFFFFF)
    for ch in prefix:
        h = (h * np.uint64(31) + np.uint64(ord(ch))) & m
    key_digits = len(key_for(0)) - 1
    for k in range(key_digits - 1, -1, -1):
        d = (idx // (10 ** k)) % 10 + 48
        h = (h * np.uint64(31) + d.astype(np.uint64)) & m
    signed = h.astype(np.int64)
    signed = np.where(signed >= 1 << 31, signed - (1 << 32), signed)
    out = np.where(signed == -(1 << 31), 0, np.abs(signed))
    for i in (0, len(idx) // 2, len(idx) - 1):  # cross-check the vectorised hash
        assert out[i] == index_key_hash(f"{TOPIC.decode()}#{key_for(int(idx[i]))}")
    return out


_FASTWALK_RSS = """
import sys
from rmqdump.fast import walk as fastwalk
from rmqdump.store.commitlog import CommitLog
cl = CommitLog.open(sys.argv[1])
res = fastwalk.verify_segments(cl.segments, jobs=fastwalk.default_jobs())
bad = [s for s in res if s.stop not in ("blank", "end")]
sys.exit(1 if bad else 0)
"""

_SPARK_EXPORT = """
import json, shutil, sys, time
from pathlib import Path
from rmqdump.spark.session import build_session
from rmqdump.spark.jobs import export_throughput, warm_workers
master, store, out, jf, repeat = sys.argv[1], sys.argv[2], Path(sys.argv[3]), sys.argv[4], int(sys.argv[5])
t0 = time.perf_counter()
spark = build_session(master)
t1 = time.perf_counter()
warm_workers(spark)  # the executors' Python workers start once per session, like the session itself
t2 = time.perf_counter()
best = None
for _ in range(repeat):
    if out.exists():
        shutil.rmtree(out)
    r = export_throughput(spark, [store], str(out), fmt="parquet", include_body=False)
    if best is None or r["rows_per_s"] > best["rows_per_s"]:
        best = r
best["session_seconds"], best["warmup_seconds"] = t1 - t0, t2 - t1
Path(jf).write_text(json.dumps(best))
spark.stop()
"""


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-gib", type=float, default=4.0, help="size of the 1 KiB-record store (default 4)")
    ap.add_argument("--quick", action="store_true", help="tiny stores (MiBs), one repetition: a smoke run")
    ap.add_argument("--repeat", type=int, default=0, help="repetitions per figure (default 3, quick 1)")
    ap.add_argument("--data", help="store directory (default bench/data, quick: bench/data/quick)")
    ap.add_argument("--out", help="scratch output directory (default bench/out, quick: bench/out/quick)")
    ap.add_argument("--big-gib", type=float, default=0.0,
                    help="also run verify STORE on a CQ store of this size (built, and deleted after, if absent)")
    ap.add_argument("--skip", nargs="*", help="row keys (or prefixes such as 'spark') to skip")
    ap.add_argument("--only", nargs="*", help="run only these row keys or prefixes (the references always run)")
    ap.add_argument("--json", help="also write the rows as JSON to this file")
    ap.add_argument("--write-results", action="store_true", help="write bench/RESULTS.md")
    ap.add_argument("--traceback", action="store_true", help="print tracebacks of failing benchmarks")
    ap.add_argument("--silent", action="store_true", help="no progress lines on stderr")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    load0 = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    bench = Bench(args)
    rows = bench.run()
    seconds = time.perf_counter() - t0
    facts = machine_facts()
    facts = {**facts, "load average (1/5/15 min) at the start": load0}
    print(f"rmqdump bench, {facts['date']}, {facts['cpu']}, {facts['memory']} RAM, "
          f"{'quick' if args.quick else 'full'} run, {seconds:.0f} s\n")
    print(render_table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"facts": facts, "rows": [vars(rows[k]) for k in ROW_KEYS]}, indent=1))
    if args.write_results:
        (BENCH / "RESULTS.md").write_text(results_markdown(rows, facts, args, seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
