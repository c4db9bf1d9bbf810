"""Spark jobs over many stores: export, verify, stats, lookup. Each takes a SparkSession.

The unit of parallel work is a commitlog segment (:class:`rmqdump.rows.arrow.SegmentSplit`):
export and the record checks of verify run one task per segment; lookup runs one task per
store (the index answers most of it); stats and the ConsumeQueue join are DataFrame queries
over the ``rocketmq`` / ``rocketmq_cq`` data sources.

Errors raised by the library on executors (:class:`~rmqdump.errors.RmqdumpError`) come back
as RmqdumpError on the driver, not as Java stack traces.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.errors import RmqdumpError, StoreError
from rmqdump.rows import arrow as rarrow
from rmqdump.rows.export import (
    DatasetWriter,
    ExportResult,
    parse_partition_by,
    prepare_output,
    write_splits,
)
from rmqdump.spark import ranges
from rmqdump.spark.plumbing import (  # noqa: F401
    Progress,
    _parallelize,
    expand_paths,
    local_path,
    spark_errors,
    store_names,
    track,
)

STATS_KEYS = ("broker", "topic", "queue_id", "hour")
STATS_KEY_CHOICES = ("broker", "store", "topic", "queue_id", "date", "hour")


def _as_list(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """Store paths made absolute (executors may run elsewhere), ``file:`` URIs as paths, other URIs refused,
    globs expanded (sorted, duplicates dropped)."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    out = expand_paths(paths)
    if not out:
        raise RmqdumpError("no store given")
    return out


def records(spark, paths: str | os.PathLike | Sequence[str | os.PathLike], **options):
    """``spark.read.format("rocketmq")`` with options given as keywords (``includeBody=True`` ...; ``brokers``
    as a dict: store path -> broker name)."""
    reader = spark.read.format("rocketmq")
    for k, v in options.items():
        if isinstance(v, Mapping):
            v = json.dumps({os.fspath(p): n for p, n in v.items()}) if v else None
        if v is not None:
            reader = reader.option(k, str(v).lower() if isinstance(v, bool) else str(v))
    return reader.load(_as_list(paths))


# --- export -------------------------------------------------------------------------------------


def task_threads(spare: int = 1) -> int:
    """Threads a task may keep busy: its Spark CPU allotment (``spark.task.cpus``, 1 by default),
    or ``spare`` when the job has fewer tasks than the cluster has cores (see :func:`export`)."""
    try:
        from pyspark import TaskContext

        tc = TaskContext.get()
        cpus = tc.cpus() if tc is not None else 1
    except Exception:  # not inside a Spark task
        cpus = 1
    return max(1, cpus, spare)


def _export_task(out: str, fmt: str, partition_by: tuple[str, ...], compression: str, read_options: dict,
                 spare: int, splits: Iterator[rarrow.SegmentSplit]) -> Iterator[tuple]:
    """Executor side: write each split's rows under ``out``; yield (ok, index, rows, reports, files, timing)
    or (error, index, message).

    Parquet row groups are encoded on a second thread only when the task may use two cores: with
    one core per task (``local[N]`` with at least N segments) a second busy thread per task only
    oversubscribes the cores the other tasks were given. (:func:`rmqdump.rows.arrow.read_split`'s
    walk-ahead thread is its own choice, made from the worker's CPU affinity.)
    """
    ext = "parquet" if fmt == "parquet" else "jsonl"
    background = task_threads(spare) >= 2
    for split in splits:
        w0, c0 = time.perf_counter(), time.process_time()
        prefix = f"part-{split.index:05d}"
        if partition_by:
            writer = DatasetWriter(out, fmt, partition_by, prefix=prefix, compression=compression,
                                   background=background)
        else:
            writer = DatasetWriter(Path(out) / f"{prefix}-{split.name}.{ext}", fmt, compression=compression,
                                   write_empty=False, background=background)
        result = ExportResult()
        try:
            write_splits([split], writer, result, **read_options)
            files = writer.close()
        except RmqdumpError as e:
            writer.abort()
            yield ("error", split.index, f"{split.path}: {e}")
            continue
        end = split.size if split.range_end is None else split.range_end - split.start
        timing = {"index": split.index, "segment": split.path, "range": [split.range_start, end], "rows": result.rows,
                  "bytes": end - split.range_start,
                  "seconds": time.perf_counter() - w0, "cpu_seconds": time.process_time() - c0,
                  "threads": 2 if background else 1, "pid": os.getpid()}
        yield ("ok", split.index, result.rows, result.reports, files, timing)


def _prepare_kernels(spark, splits: Sequence[rarrow.SegmentSplit]) -> None:
    """Local masters: build missing compiled kernel libraries once, here, before the tasks start.

    The libraries are cached per machine; without this every Python worker of a ``local[N]``
    session that finds them missing compiles the same library at the same time (N x 10-30 s
    of CPU on the cores the tasks need). Best effort: a worker still builds or falls back itself.
    """
    if not spark.sparkContext.master.startswith("local") or os.environ.get("RMQDUMP_FAST_LIBRARY", "1") == "0":
        return
    try:
        from rmqdump.fast import render as fastrender
        from rmqdump.fast import walk as fastwalk

        if not any(fastwalk.use_fast(s.size) for s in splits):
            return
        if not fastwalk.library_ready():
            with fastwalk.build_lock():
                if not fastwalk.library_ready():
                    fastwalk.build_library(fastwalk.library_path())
        if not fastrender.library_ready():
            fastrender.backend()
    except Exception:  # no numba, no compiler, read-only cache: the workers decide for themselves
        pass


def export(spark, paths: str | os.PathLike | Sequence[str | os.PathLike], out: str | os.PathLike, *,
           partition_by: str | Sequence[str] = (), fmt: str = "parquet", compression: str = "zstd",
           batch_size: int = rarrow.DEFAULT_BATCH_SIZE, progress: Progress | None = None,
           task_stats: list[dict] | None = None, brokers: Mapping[str, str] | None = None,
           **read_options) -> ExportResult:
    """Export every segment of every store to ``out`` (a new or empty directory), one task per segment;
    with fewer segments than the session has cores, one per range of a segment (:mod:`rmqdump.spark.ranges`:
    joined with proof, the rows of one walk per segment).

    Output: ``part-<split>-<segment>.parquet`` files, or with ``partition_by`` the same Hive
    layout as :func:`rmqdump.rows.export.export` (safe directory names), ``_SUCCESS`` at the end.
    ``read_options``: those of :func:`rmqdump.rows.arrow.read_split` (``include_body``,
    ``decompress``, ``flt``, ``crc``, ``keep_going``, ``use_mmap``, ``max_record_size``).
    Executors must see the stores and ``out`` at the same paths (local disk, NFS, ...).
    ``task_stats``: a list that receives one dict per task (segment, range, rows, bytes, seconds,
    cpu_seconds of the Python worker, threads, pid), in split order. ``brokers``: broker names of
    stores (path -> name) instead of those from their paths (:func:`rmqdump.spark.plumbing.store_names`).

    Each task keeps one core busy (``spark.task.cpus`` more if set); when there are still fewer
    tasks than the session has cores, each task also encodes Parquet on a second thread.
    """
    cols = parse_partition_by(partition_by)
    stores = _as_list(paths)
    out = local_path(out, "export directory")
    from rmqdump.spark.datasource import check_segment_file

    for s in stores:
        check_segment_file(s)  # a file given as a store must be a segment: one-line error, as scan
    splits = rarrow.segment_splits(stores, store_names(stores, brokers))
    target = prepare_output(out, partitioned=True, stores=stores)
    result = ExportResult()
    if splits:
        parallelism = spark.sparkContext.defaultParallelism
        options = {"batch_size": batch_size, **read_options}

        def run(runs: list[rarrow.SegmentSplit]) -> list[tuple]:
            spare = min(2, parallelism // len(runs))
            task = functools.partial(_export_task, str(target.resolve()), fmt, cols, compression, options, spare)
            return _parallelize(spark, runs).mapPartitions(task).collect()

        _prepare_kernels(spark, splits)
        with track(spark, f"rmqdump export of {len(stores)} store(s)", progress):
            segments, outcomes = ranges.run_joined(splits, parallelism, read_options, run, target)
        for kept in segments:
            result.rows += sum(o[2] for o in kept)
            result.reports.append(ranges.merge_reports([rep for o in kept for rep in o[3]]))
            result.files.extend(f for o in kept for f in o[4])
        if task_stats is not None:
            task_stats.extend(o[5] for o in outcomes if o[0] == "ok")
    result.segments = len(splits)
    result.input_bytes = sum(s.size for s in splits)
    _remove_leftovers(target)
    (target / "_SUCCESS").touch()
    return result


def _warm_task(items: Iterator) -> Iterator[int]:
    """Executor side: import the export path and load built kernel libraries (never build them)."""
    import pyarrow.parquet  # noqa: F401

    for _ in items:  # a worker whose input is not read to the end is not reused
        pass

    try:
        from rmqdump.fast import render as fastrender
        from rmqdump.fast import walk as fastwalk

        if fastwalk.fast_available() and fastwalk.library_ready():
            fastwalk.backend()
            if fastrender.library_ready():
                fastrender.backend()
    except Exception:  # the first export task loads (or builds) them itself
        pass
    yield os.getpid()


def warm_workers(spark) -> list[int]:
    """Start a Python worker on every task slot now (one tiny task each) and import the export
    path there, so that the next job does not pay for it (with ``spark.python.worker.reuse``).

    For benchmarks and long-lived sessions: a one-job CLI run gains nothing from it. Returns the
    process ids of the workers that answered (on a local master: the ones the next job reuses).
    """
    n = max(1, spark.sparkContext.defaultParallelism)
    with spark_errors():
        pids = _parallelize(spark, list(range(n)), n).mapPartitions(_warm_task).collect()
    return sorted(set(pids))


def _remove_leftovers(root: Path) -> None:
    """Delete hidden in-progress files of failed task attempts."""
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            if name.startswith(".") and name.endswith(".inprogress"):
                try:
                    os.unlink(os.path.join(dirpath, name))
                except OSError:
                    pass


def export_throughput(spark, paths: str | os.PathLike | Sequence[str | os.PathLike], out: str | os.PathLike,
                      **options) -> dict:
    """Run :func:`export` on this session and time it (for bench/): rows, bytes, seconds, rows/s, MB/s,
    and ``tasks`` (per-segment timings from the workers, see ``task_stats``)."""
    tasks: list[dict] = []
    t0 = time.perf_counter()
    res = export(spark, paths, out, task_stats=tasks, **options)
    dt = time.perf_counter() - t0
    return {"engine": f"spark {spark.sparkContext.master}", "rows": res.rows, "input_bytes": res.input_bytes,
            "output_bytes": res.output_bytes, "seconds": dt, "rows_per_s": res.rows / dt if dt else 0.0,
            "mb_per_s": res.input_bytes / dt / 1e6 if dt else 0.0, "tasks": tasks}


def export_throughput_in_subprocess(master: str, paths: str | os.PathLike | Sequence[str | os.PathLike],
                                    out: str | os.PathLike, *, body: bool = False, partition_by: str | None = None,
                                    conf: dict[str, str] | None = None, timeout: float = 3600) -> dict:
    """Run ``rmqdump spark export`` on ``master`` in a fresh Python process (a session's master is fixed
    once started) and return its JSON summary: rows, seconds (the job), session_seconds, rows_per_s ...

    For bench/: ``local[1]`` and ``local[2]`` side by side in one benchmark run.
    """
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "rmqdump.spark", "export", *_as_list(paths), "--out", os.fspath(out), "--master",
           master, "--json", "-q"]
    if body:
        cmd.append("--body")
    if partition_by:
        cmd += ["--partition-by", partition_by]
    for k, v in (conf or {}).items():
        cmd += ["--conf", f"{k}={v}"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if run.returncode not in (0, 1) or not run.stdout.strip():
        raise RmqdumpError(f"spark export on {master} failed (exit {run.returncode}): {run.stderr.strip()[-2000:]}")
    summary = json.loads(run.stdout.strip().splitlines()[-1])
    summary["engine"] = f"spark {master}"
    summary["mb_per_s"] = summary["input_bytes"] / summary["seconds"] / 1e6 if summary["seconds"] else 0.0
    return summary


# --- verify -------------------------------------------------------------------------------------


def verify(spark, paths: str | os.PathLike | Sequence[str | os.PathLike], *, keep_going: bool = False,
           check_crc: bool = True, use_mmap: bool = True, max_record_size: int | None = None, version: str = "auto",
           store_checks: bool = True, delay_levels_ms: list[int] | None = None, list_limit: int = 10000,
           max_findings_per_kind: int = 1000, progress: Progress | None = None,
           brokers: Mapping[str, str] | None = None) -> list:
    """``rmqdump verify`` of every store: a :class:`rmqdump.spark.verify.StoreVerdict` per store, in order.

    Record checks run one task per segment, ConsumeQueue <-> commitlog as a DataFrame join,
    the store checks one task per store; the documents equal ``verify_store(...).to_dict()``
    (see :mod:`rmqdump.spark.verify`); each verdict's ``broker`` is the store's broker name (``brokers``:
    path -> name, else from the path).
    """
    from rmqdump.spark.verify import VerifyOptions
    from rmqdump.spark.verify import verify as run

    opts = VerifyOptions(keep_going=keep_going, check_crc=check_crc, use_mmap=use_mmap,
                         max_record_size=max_record_size or MAX_RECORD_SIZE, version=version,
                         store_checks=store_checks, delay_levels_ms=delay_levels_ms, list_limit=list_limit,
                         max_findings_per_kind=max_findings_per_kind)
    stores = _as_list(paths)
    names = store_names(stores, brokers)
    verdicts = run(spark, stores, opts, progress)
    for p, v in zip(stores, verdicts, strict=True):
        v.broker = names[p]
    return verdicts


# --- stats --------------------------------------------------------------------------------------


def _grouped(df, keys: tuple[str, ...], extra: tuple = ()):
    from pyspark.sql import functions as F

    for k in keys:
        if k not in STATS_KEY_CHOICES:
            raise RmqdumpError(f"cannot group stats by {k!r} (choose from {', '.join(STATS_KEY_CHOICES)})")
    if "hour" in keys:  # as `rmqdump stats`: 2026-11-21T21:00Z
        df = df.withColumn("hour", F.date_format(F.date_trunc("hour", "store_time"), "yyyy-MM-dd'T'HH:00'Z'"))
    if "date" in keys:
        df = df.withColumn("date", F.date_format("store_time", "yyyy-MM-dd"))
    return df.groupBy(*keys, *extra).agg(
        F.count(F.lit(1)).alias("records"),
        F.sum("size").alias("bytes"),
        F.sum(F.greatest(F.col("body_length"), F.lit(0))).alias("body_bytes"),
        F.min("offset").alias("first_offset"),
        F.max(F.col("offset") + F.col("size")).alias("end_offset"),
        F.min("store_timestamp").alias("first_store_timestamp"),
        F.max("store_timestamp").alias("last_store_timestamp"),
    )


def stats_frame(spark, paths: str | os.PathLike | Sequence[str | os.PathLike],
                by: Sequence[str] = STATS_KEYS, **options):
    """A DataFrame of record counts and bytes grouped by ``by`` (broker, store, topic, queue_id, date, hour).

    Damage rows (``_corrupt_record``) are not counted: :func:`stats` reports them.
    """
    from pyspark.sql import functions as F

    from rmqdump.spark.datasource import CORRUPT_COLUMN

    keys = tuple(by)
    df = records(spark, paths, **options).where(F.col(CORRUPT_COLUMN).isNull())
    agg = _grouped(df, keys)
    return agg.orderBy(*[F.col(k).asc_nulls_first() for k in keys]) if keys else agg


def stats(spark, paths: str | os.PathLike | Sequence[str | os.PathLike], by: Sequence[str] = STATS_KEYS,
          progress: Progress | None = None, damage: list[dict] | None = None, **options) -> list[dict]:
    """Counts and bytes per ``by`` group (default broker/topic/queue/hour, hours in UTC) as dicts, in one pass.

    Like ``rmqdump stats``, each segment is walked past damage (``keepGoing``, unless given); ``damage``
    (a list) receives one dict per damaged range or damaged end (broker, store, segment, offset, detail).
    """
    from pyspark.sql import functions as F

    from rmqdump.spark.datasource import CORRUPT_COLUMN

    keys = tuple(by)
    options = {"keepGoing": True, **options, "mode": "PERMISSIVE"}
    df = records(spark, paths, **options)
    tag = F.when(F.col(CORRUPT_COLUMN).isNotNull(),
                 F.to_json(F.struct("broker", "store", "segment", "offset", F.col(CORRUPT_COLUMN).alias("detail"))))
    with track(spark, "rmqdump stats", progress):
        rows = _grouped(df.withColumn("_damage", tag), keys, ("_damage",)).collect()
    out, found = [], []
    for r in rows:
        d = r.asDict()
        tagged = d.pop("_damage")
        if tagged is None:
            out.append(d)
        else:
            found.append(json.loads(tagged))
    if damage is not None:
        damage.extend(sorted(found, key=lambda f: (f["store"], f["offset"])))
    return sorted(out, key=lambda d: tuple((d[k] is not None, 0 if d[k] is None else d[k]) for k in keys))


# --- lookup -------------------------------------------------------------------------------------


@dataclass
class LookupReport:
    """Hits of all stores (record schema rows, each store's hits newest first) and per-store notes."""

    rows: list[dict] = field(default_factory=list)
    stores: list[dict] = field(default_factory=list)


def _lookup_task(key: str, topic: str | None, begin: int | None, end: int | None, max_num: int | None,
                 force_scan: bool, include_body: bool, decompress: bool, use_mmap: bool,
                 stores: Iterator[tuple[int, str, str]]) -> Iterator[tuple]:
    """Executor side: :func:`rmqdump.analysis.lookup.lookup_key` on each store; rows as Arrow-schema dicts."""
    from rmqdump.analysis.lookup import lookup_key
    from rmqdump.store.root import Store

    for idx, path, broker in stores:
        try:
            st = Store.open(path)
            res = lookup_key(st, topic, key, begin, end, max_num, force_scan=force_scan, use_mmap=use_mmap)
            cl = st.commitlog

            def seg_of(m, cl=cl) -> str:
                seg = cl.segment_for(m.offset)
                return str(seg.path) if seg is not None else m.file

            batch = rarrow.messages_batch(res.hits, broker=broker, store=path, segment_of=seg_of,
                                          include_body=include_body, decompress=decompress)
            info = {"store": path, "broker": broker, "hits": len(res.hits), "source": res.source,
                    "collisions": len(res.collisions), "truncated": res.truncated, "reasons": res.reasons,
                    "warnings": res.warnings, "unreadable": [list(u) for u in res.unreadable]}
            yield ("ok", idx, batch.to_pylist(), info)
        except RmqdumpError as e:
            yield ("error", idx, f"{path}: {e}", None)


def lookup(spark, paths: str | os.PathLike | Sequence[str | os.PathLike], key: str, *, topic: str | None = None,
           begin: int | None = None, end: int | None = None, max_num: int | None = None, force_scan: bool = False,
           include_body: bool = False, decompress: bool = False, use_mmap: bool = True,
           progress: Progress | None = None, brokers: Mapping[str, str] | None = None) -> LookupReport:
    """Messages whose KEYS element or UNIQ_KEY is ``key`` (in ``topic``) across many stores, one task per store.

    Each store is searched like ``rmqdump lookup --key`` (index first, the uncovered commitlog
    walked, every hit confirmed); ``force_scan`` walks every commitlog instead. ``brokers``: path -> name.
    """
    if not key:
        raise RmqdumpError("empty key")
    stores = _as_list(paths)
    names = store_names(stores, brokers)
    for p in stores:
        if not os.path.exists(p):
            raise StoreError("no such file or directory", p)
    task = functools.partial(_lookup_task, key, topic, begin, end, max_num, force_scan, include_body, decompress,
                             use_mmap)
    with track(spark, f"rmqdump lookup in {len(stores)} store(s)", progress):
        items = [(i, p, names[p]) for i, p in enumerate(stores)]
        outcomes = _parallelize(spark, items).mapPartitions(task).collect()
    report = LookupReport()
    for o in sorted(outcomes, key=lambda o: o[1]):
        if o[0] == "error":
            raise RmqdumpError(f"lookup failed: {o[2]}")
        report.rows.extend(o[2])
        report.stores.append(o[3])
    return report
