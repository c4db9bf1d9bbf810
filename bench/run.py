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
import json
import os
import shutil
import sys
import time
import traceback
import zlib
from pathlib import Path

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench.gen import StoreSpec, ensure_store, link_prefix  # noqa: E402
from bench.heavy import HeavyRows  # noqa: E402
from bench.table import (  # noqa: E402
    BENCH,
    RMQDUMP,
    ROW_KEYS,
    ROWS,
    GiB,
    MiB,
    Row,
    against,
    best,
    cli_has,
    gbps,
    machine_facts,
    map_file,
    mark,
    module_exists,
    render_table,
    results_markdown,
    run_child,
    run_child_cpu,
)


# --- the suite -----------------------------------------------------------------------------------------
class Bench(HeavyRows):
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
        self._build_kernels()
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

    def _build_kernels(self) -> None:
        """Build (or load) every compiled library before anything is timed: a build runs in a child process
        whose time and memory would otherwise land in the first command's figures."""
        if not module_exists("numba"):
            return
        import importlib

        for name in ("engine", "render", "cqjoin", "indexjoin"):
            mod = importlib.import_module(f"rmqdump.fast.{name}")
            self.log(f"kernels: {mod.backend().kind}")

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
        groups = {"read_bw": ["read_bw", "zlib_crc", "isal_crc", "crc_kernel"], "pure_scan_1k": ["pure_scan_1k", "pure_verify_1k"],
                  "fast_scan_1k": ["fast_scan_1k", "fast_scan_128"],
                  "fast_verify_1core": ["fast_verify_1core", "fast_verify_jobs"],
                  "verify_store": ["verify_store", "rocketmq_ref", "verify_vs_rocketmq", "rebuild_cq", "rebuild_index",
                                   "cmd_stats", "cmd_pending", "cmd_info", "cmd_cq", "cmd_lookup_scan", "cmd_scan_key",
                                   "verify_store_big"],
                  "export_cli_parquet": ["export_cli_parquet", "parquet_vs_arrow", "export_cli_jsonl"],
                  "scan_jsonl": ["scan_jsonl", "jsonl_vs_orjson"], "help_wall": ["version_wall", "help_wall"],
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
        self._crc_references()

    def _crc_references(self) -> None:
        from bench.references import isal_crc_seconds

        mm = map_file(self.seg1k)
        try:
            size = len(mm)
            t_isal = isal_crc_seconds(mm, self.repeat + 1)
            t_ours = None
            if module_exists("numba"):
                from rmqdump.fast.engine import crc32 as fast_crc32

                if fast_crc32(mm) != zlib.crc32(mm):
                    raise RuntimeError("the compiled CRC-32 differs from zlib's")
                t_ours, _ = best(lambda: fast_crc32(mm), self.repeat + 1)
        finally:
            mm.close()
        r, k = self.rows["isal_crc"], self.rows["crc_kernel"]
        if t_isal is None:
            r.result = k.result = "n/a (pip install isal)"
            return
        self.ref["isal"] = gbps(size, t_isal)
        r.figure = f"{self.ref['isal']:.2f} GB/s"
        r.ratio = f"{self.ref['isal'] / self.ref['zlib']:.2f} x zlib"
        r.result = "reference"
        if t_ours is None:
            k.result = "n/a (numba missing)"
            return
        rate = gbps(size, t_ours)
        k.figure, k.reference = f"{rate:.2f} GB/s", f"{self.ref['isal']:.2f} GB/s ISA-L"
        k.ratio = f"{rate / self.ref['isal']:.2f} x ISA-L, {rate / self.ref['zlib']:.2f} x zlib"
        mark(k, rate >= 0.8 * self.ref["isal"])

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

    def _verify_store(self, store: Path, nbytes: int) -> tuple[str, str, float, int, float]:
        wall, rss, cpu = self._cli_rows([*RMQDUMP, "verify", "-q", str(store)], ok_codes=(0, 1))
        zlib_s = nbytes / (self.ref["zlib"] * 1e9)
        fig = f"{wall:.2f} s wall, {cpu:.2f} s CPU, peak RSS {rss / 1e6:.0f} MB ({nbytes / GiB:.3g} GiB)"
        return fig, f"{zlib_s:.2f} s zlib.crc32 1-core", zlib_s / cpu, rss, wall

    def b_verify_store(self) -> None:
        r = self.rows["verify_store"]
        fig, ref, ratio, rss, wall = self._verify_store(self.store1k, self.spec1k.total_bytes)
        r.figure, r.reference, r.ratio = fig, ref, f"{ratio:.2f} x zlib (CPU)"
        mark(r, ratio >= 1.0)
        r.note = "CQ join in bounded memory (64 MiB windows); wall: other jobs share the 2 cores"
        self._rocketmq_load(wall)
        self._rebuild_cq(wall)
        self._rebuild_index(wall)
        self._incident_commands(wall)
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
            fig, ref, ratio_b, rss_b, _ = self._verify_store(big, spec.total_bytes)
        finally:
            if not existed:
                shutil.rmtree(big)
        rb.figure, rb.reference = fig, f"{ref}; {rss / 1e6:.0f} MB at {self.spec1k.total_bytes / GiB:.3g} GiB"
        rb.ratio = f"{rss_b / rss:.2f} x RSS, {ratio_b:.2f} x zlib (CPU)"
        mark(rb, rss_b <= 1.1 * rss)

    def _rebuild_cq(self, verify_wall: float) -> None:
        """``repair --rebuild-cq --to`` over the CQ store; its files must equal the store's own."""
        r = self.rows["rebuild_cq"]
        if "rebuild" in self.skip:
            r.result = "skipped"
            return
        out = self.out / "rebuild-cq"
        runs = []
        for _ in range(self.repeat):
            shutil.rmtree(out, ignore_errors=True)
            runs.append(run_child_cpu([*RMQDUMP, "repair", "--rebuild-cq", "--to", str(out), "-q", str(self.store1k)],
                                      timeout=3600))
        ours, theirs = out / "consumequeue", self.store1k / "consumequeue"
        files = sorted(p.relative_to(theirs) for p in theirs.rglob("*") if p.is_file())
        if files != sorted(p.relative_to(ours) for p in ours.rglob("*") if p.is_file()) or any(
                (ours / f).read_bytes() != (theirs / f).read_bytes() for f in files):
            raise RuntimeError("repair --rebuild-cq did not reproduce the store's consume queues")
        shutil.rmtree(out, ignore_errors=True)
        wall, rss, cpu = min(x[0] for x in runs), max(x[1] for x in runs), min(x[3] for x in runs)
        nbytes = self.spec1k.total_bytes
        r.figure = (f"{wall:.2f} s wall, {cpu:.2f} s CPU, {gbps(nbytes, wall):.2f} GB/s, peak RSS {rss / 1e6:.0f} MB "
                    f"({len(files)} CQ files, byte-identical)")
        r.reference = f"verify STORE {verify_wall:.2f} s wall"
        r.ratio = f"{wall / verify_wall:.2f} x verify"
        mark(r, wall <= 2 * verify_wall)

    def _incident_commands(self, verify_wall: float) -> None:
        """The other whole-store commands of an incident, on the CQ store, beside verify STORE in the same run."""
        from bench.gen import key_for

        key = key_for(self.spec1k.records_per_segment // 2)  # one record of the first file holds it
        store = str(self.store1k)
        for row, args, codes in (("cmd_stats", ["stats", "-f", "json", store], (0,)),
                                 ("cmd_pending", ["pending", "-f", "json", store], (0,)),
                                 ("cmd_info", ["info", "-f", "json", store], (0, 1)),
                                 ("cmd_cq", ["cq", "-f", "json", store], (0,)),
                                 ("cmd_lookup_scan", ["lookup", store, "--key", key, "-f", "jsonl", "-q"], (0,)),
                                 ("cmd_scan_key", ["scan", "--key", key, "-f", "jsonl", "-q", store], (0,))):
            r = self.rows[row]
            if row in self.skip:
                r.result = "skipped"
                continue
            wall, rss, cpu = self._cli_rows([*RMQDUMP, *args], ok_codes=codes)
            r.figure = f"{wall:.2f} s wall, {cpu:.2f} s CPU, peak RSS {rss / 1e6:.0f} MB"
            r.reference = f"verify STORE {verify_wall:.2f} s wall"
            r.ratio = f"{wall / verify_wall:.2f} x verify"
            r.result = "info"

    def _rebuild_index(self, verify_wall: float) -> None:
        """``repair --rebuild-index --to`` over the CQ store: one key a record, so entries = CQ units."""
        from rmqdump.store.indexfile import IndexFile

        r = self.rows["rebuild_index"]
        if "rebuild" in self.skip:
            r.result = "skipped"
            return
        out = self.out / "rebuild-index"
        runs = []
        for _ in range(self.repeat):
            shutil.rmtree(out, ignore_errors=True)
            runs.append(run_child_cpu([*RMQDUMP, "repair", "--rebuild-index", "--to", str(out), "-q",
                                       str(self.store1k)], timeout=3600))
        files = sorted((out / "index").iterdir())
        entries = 0
        for f in files:
            with IndexFile(f) as idx:
                entries += idx.header.index_count - 1
        records = 0  # one key a record, and one consume-queue unit a record
        for f in (self.store1k / "consumequeue").rglob("*"):
            if f.is_file():
                units = np.frombuffer(f.read_bytes(), np.uint8).reshape(-1, 20)
                records += int(units.any(axis=1).sum())
        shutil.rmtree(out, ignore_errors=True)
        if entries != records:
            raise RuntimeError(f"repair --rebuild-index put {entries} entries for {records} records")
        wall, rss, cpu = min(x[0] for x in runs), max(x[1] for x in runs), min(x[3] for x in runs)
        r.figure = (f"{wall:.2f} s wall, {cpu:.2f} s CPU, {records / wall / 1e6:.2f} M keys/s, peak RSS "
                    f"{rss / 1e6:.0f} MB ({len(files)} index file(s), {entries} entries)")
        r.reference = f"verify STORE {verify_wall:.2f} s wall"
        r.ratio = f"{wall / verify_wall:.2f} x verify"
        mark(r, wall <= 2 * verify_wall)

    def _rocketmq_load(self, verify_wall: float) -> None:
        """RocketMQ's own load() over a copy of the CQ store, and verify's wall beside it."""
        from bench.cqstore import CQ_FILE_ENTRIES, CQ_STORE_UNIT_SIZE
        from bench.references import rocketmq_load_seconds

        r, v = self.rows["rocketmq_ref"], self.rows["verify_vs_rocketmq"]
        if "rocketmq" in self.skip:
            r.result = v.result = "skipped"
            return
        res = rocketmq_load_seconds(self.store1k, self.out, self.spec1k.segment_size,
                                    CQ_FILE_ENTRIES * CQ_STORE_UNIT_SIZE,
                                    self.heavy_repeat, self.log)
        if res is None:
            r.result = v.result = "n/a (needs ../shared/oracle and a JDK)"
            return
        load_s, jvm_wall = res
        nbytes = self.spec1k.total_bytes
        r.figure = f"{load_s:.2f} s load() ({jvm_wall:.2f} s JVM wall), {gbps(nbytes, load_s):.2f} GB/s"
        r.ratio = f"{gbps(nbytes, load_s) / self.ref['zlib']:.2f} x zlib"
        r.result = "reference"
        v.figure = f"verify {verify_wall:.2f} s wall"
        v.reference = f"load() {load_s:.2f} s (in the JVM, start-up excluded)"
        v.ratio = f"{load_s / verify_wall:.2f} x faster"
        mark(v, load_s >= 2 * verify_wall)

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
            if suffix == "parquet":
                self._write_table_reference(out, rate)
            out.unlink(missing_ok=True)

    def _write_table_reference(self, parquet: Path, rate: float) -> None:
        from bench.references import write_table_rows_per_second

        r = self.rows["parquet_vs_arrow"]
        ref = write_table_rows_per_second(parquet, self.out / "write-table.parquet", self.repeat)
        if ref is None:
            r.result = "n/a (pyarrow missing)"
            return
        w_rate, n = ref
        against(r, f"{rate / 1e6:.2f} M rec/s (export, process start incl.)",
                f"pq.write_table {w_rate / 1e6:.2f} M rows/s ({n} rows read back from the export)",
                rate / w_rate, "write_table", 0.5)

    def b_scan_jsonl(self) -> None:
        r = self.rows["scan_jsonl"]
        if not cli_has("scan"):
            r.result = "n/a (module missing)"
            return
        nbytes = self.spec1k.segment_size if self.quick else 128 * MiB
        records = -(-nbytes // self.spec1k.record_size)
        records = min(records, self.spec1k.records_per_segment)
        cmd = [*RMQDUMP, "scan", "-f", "jsonl", "-q", "--max-bytes", str(nbytes), str(self.store1k)]
        out = self.out / "scan.jsonl"
        t = float("inf")
        for _ in range(self.repeat):
            with open(out, "wb") as f:
                t = min(t, run_child(cmd, stdout=f, timeout=1800)[0])
        r.figure = f"{records / t / 1e3:.0f} k rec/s ({records} records, {t:.2f} s)"
        r.reference = "absolute target"
        r.ratio = f"{records / t / 1e6:.2f} x target"
        mark(r, records / t >= 1e6)
        r.note = "default body mode (base64), process start incl."
        from bench.references import orjson_rows_per_second

        o = self.rows["jsonl_vs_orjson"]
        ref = orjson_rows_per_second(out.read_bytes(), self.repeat)
        out.unlink(missing_ok=True)
        if ref is None:
            o.result = "n/a (pip install orjson)"
            return
        rate, n = ref
        against(o, f"{records / t / 1e3:.0f} k rec/s (scan, process start incl.)",
                f"orjson.dumps {rate / 1e3:.0f} k rows/s ({n} rows parsed back from scan's output)",
                records / t / rate, "orjson", 0.5)

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
