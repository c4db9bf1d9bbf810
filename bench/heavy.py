"""The bench's heavy rows: lookup on a full-size index, peak memory, Spark, bulk append.

A mixin of :class:`bench.run.Bench` (its stores, ``rows``, ``ref``, ``repeat`` and ``log``).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import numpy as np

from bench.gen import BASE_TS, QUEUES, TOPIC, key_for, link_prefix
from bench.table import RMQDUMP, GiB, MiB, cli_has, mark, module_exists, run_child


class HeavyRows:
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
        r.ratio = f"{after / 0.005:.2f} x target"
        mark(r, after <= 0.005)
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
        for key, flag, limit in (("version_wall", "--version", 0.06), ("help_wall", "--help", 0.3)):
            r = self.rows[key]
            t = min(run_child([*RMQDUMP, flag])[0] for _ in range(self.repeat + 4))
            r.figure = f"{t * 1e3:.0f} ms"
            r.reference = "absolute target"
            r.ratio = f"{t / limit:.2f} x limit"
            mark(r, t <= limit)

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
        mark(r1, per_core / single_1core >= 0.8)

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
        r2.note = (f"{self.e2e_bytes // self.spec1k.segment_size} segment(s), cut into ranges on local[2]; "
                   f"local[1]: {tasks(res[1])}")

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
