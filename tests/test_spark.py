"""The Spark pipeline: data sources, jobs (parity with scan / lookup / verify) and a standalone cluster.

Every test here shares ONE SparkSession (``spark`` fixture, session scope, local[2]); the
standalone-cluster test runs its driver in a subprocess against a master and a worker it
starts on loopback and always stops.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from conftest import real_store
from rmqdump.cli import cli
from rmqdump.rows.arrow import (
    CQ_SCHEMA,
    INDEX_SCHEMA,
    RECORD_SCHEMA,
    index_splits,
    queue_splits,
    read_index,
    read_queue,
)
from rmqdump.rows.export import export as local_export
from rmqdump.rows.schema import FIELDS
from rmqdump.spark.queues import QUEUE_SCHEMA

pytestmark = pytest.mark.spark

STORES = ("clean", "crash_kill9")


@pytest.fixture(scope="session")
def spark():
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime for Spark")
    from rmqdump.spark import build_session

    t0 = time.perf_counter()
    session = build_session("local[2]", app_name="rmqdump-tests")
    print(f"\nSpark session started in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    yield session
    session.stop()


def scan_rows(path: Path) -> list[dict]:
    res = CliRunner().invoke(cli, ["scan", str(path), "-f", "jsonl", "-q"])
    assert res.exit_code in (0, 1), res.output
    return [json.loads(line) for line in res.stdout.splitlines()]


def as_scan(row: dict) -> dict:
    out = {k: row[k] for k in FIELDS}
    if isinstance(out["properties"], list):
        out["properties"] = dict(out["properties"])
    if isinstance(out["body"], bytes):
        out["body"] = base64.b64encode(out["body"]).decode("ascii")
    return out


def read_export(out: Path) -> list[dict]:
    files = sorted(out.rglob("*.parquet"))
    assert files, f"no parquet files under {out}"
    rows = pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()
    return sorted(rows, key=lambda r: (r["store"], r["offset"]))


def test_data_sources(spark):
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    paths = [str(real_store(n)) for n in STORES]
    df = spark.read.format("rocketmq").load(paths)
    assert df.schema == from_arrow_schema(RECORD_SCHEMA.append(pa.field("_corrupt_record", pa.string())))
    per_broker = df.withColumn("task", F.spark_partition_id()).groupBy("broker").agg(
        F.count(F.lit(1)).alias("n"), F.countDistinct("task").alias("tasks")).collect()
    # one partition (task) per commitlog segment: rows of each store come from its 2 segments holding data
    # (the third segment of crash_kill9 is pre-allocated and empty)
    counts = {r["broker"]: r["n"] for r in per_broker}
    assert counts == {n: len(scan_rows(real_store(n))) for n in STORES}
    assert {r["broker"]: r["tasks"] for r in per_broker} == {"clean": 2, "crash_kill9": 2}
    # options and a pushed-down topic filter
    crash = (spark.read.format("rocketmq").option("includeBody", "true").load(paths)
             .filter(F.col("topic") == "TopicCrash").agg(F.count(F.lit(1)).alias("n"), F.count("body").alias("b")))
    assert crash.collect()[0].asDict() == {"n": counts["crash_kill9"], "b": counts["crash_kill9"]}
    # consumequeue and index as tables, equal to the core readers
    cq = spark.read.format("rocketmq_cq").load(paths)
    assert cq.schema == from_arrow_schema(QUEUE_SCHEMA) and QUEUE_SCHEMA.names[:len(CQ_SCHEMA)] == CQ_SCHEMA.names
    idx = spark.read.format("rocketmq_index").load(paths[0])
    assert idx.schema == from_arrow_schema(INDEX_SCHEMA)
    assert idx.count() == sum(b.num_rows for s in index_splits(paths[:1]) for b in read_index(s))
    # a join: the valid CQ entries of two topics and the records of those topics (topic option) pair up 1:1
    topics = ("TopicTest", "TopicOrder")
    recs = spark.read.format("rocketmq").option("topic", ",".join(topics)).load(paths[0]).withColumn("r", F.lit(1))
    entries = (cq.filter((F.col("broker") == "clean") & F.col("valid") & F.col("topic").isin(*topics))
               .withColumnRenamed("commitlog_offset", "offset").withColumn("e", F.lit(1)))
    on = ["offset", "topic", "queue_id", "queue_offset", "size"]
    pairs = entries.select(*on, "e").join(recs.select(*on, "r"), on, "full_outer").agg(
        F.count(F.lit(1)).alias("rows"), F.count("e").alias("entries"), F.count("r").alias("records")).collect()[0]
    expected = sum(1 for r in scan_rows(real_store("clean")) if r["topic"] in topics)
    assert pairs.asDict() == {"rows": expected, "entries": expected, "records": expected}
    assert sum(b.num_rows for s in queue_splits(paths[:1]) if s.topic in topics for b in read_queue(s)) == expected


def test_export_parity_with_scan(spark, tmp_path):
    from rmqdump.spark import jobs

    paths = [str(real_store(n)) for n in STORES]
    warm = jobs.warm_workers(spark)
    assert 1 <= len(warm) <= 2
    tasks: list[dict] = []
    res = jobs.export(spark, paths, tmp_path / "flat", include_body=True, task_stats=tasks)
    rows = read_export(tmp_path / "flat")
    assert res.rows == len(rows)
    assert len(tasks) == res.segments >= 2 and sum(t["rows"] for t in tasks) == res.rows
    assert {t["threads"] for t in tasks} == {1}  # local[2], >= 2 segments: one busy thread per task
    assert {t["pid"] for t in tasks} <= set(warm)  # the warmed-up workers were reused
    for name, path in zip(STORES, paths, strict=True):
        mine = [as_scan(r) for r in rows if r["store"] == path]
        assert mine == scan_rows(Path(path)), name
    assert (tmp_path / "flat" / "_SUCCESS").exists()
    # partitioned: the same layout and rows as the single-process export
    jobs.export(spark, paths[:1], tmp_path / "spark_part", partition_by="topic,date")
    local_export(paths[0], tmp_path / "local_part", partition_by="topic,date")
    layout = {p.parent.relative_to(tmp_path / "spark_part") for p in (tmp_path / "spark_part").rglob("*.parquet")}
    assert layout == {p.parent.relative_to(tmp_path / "local_part")
                      for p in (tmp_path / "local_part").rglob("*.parquet")}
    assert Path("topic=%25RETRY%25cg-test") in {p.parents[-2] for p in layout}
    assert read_export(tmp_path / "spark_part") == read_export(tmp_path / "local_part")
    back = spark.read.parquet(str(tmp_path / "spark_part"))
    assert back.filter("topic = '%RETRY%cg-test'").count() == 2


def test_stats_and_lookup(spark):
    from rmqdump.analysis.lookup import lookup_key
    from rmqdump.spark import jobs

    paths = [str(real_store(n)) for n in (*STORES, "crash_torn")]
    stats = jobs.stats(spark, paths, by=("broker", "topic"))
    expect: Counter = Counter()
    nbytes: Counter = Counter()
    for p in paths:
        for r in scan_rows(Path(p)):
            expect[(Path(p).name, r["topic"])] += 1
            nbytes[(Path(p).name, r["topic"])] += r["size"]
    assert {(s["broker"], s["topic"]): s["records"] for s in stats} == dict(expect)
    assert {(s["broker"], s["topic"]): s["bytes"] for s in stats} == dict(nbytes)
    hourly = jobs.stats(spark, paths[:1])
    assert all(s["hour"].endswith(":00Z") and len(s["hour"]) == 17 for s in hourly)  # as `rmqdump stats`
    assert sum(s["records"] for s in hourly) == expect_total(expect, "clean")

    rep = jobs.lookup(spark, paths, "key-5", topic="TopicTest", include_body=True)
    single = [(p, m.offset) for p in paths for m in lookup_key(p, "TopicTest", "key-5").hits]
    assert [(r["store"], r["offset"]) for r in rep.rows] == single and single
    assert all("key-5" in r["keys"] and r["body"] for r in rep.rows)
    assert [s["store"] for s in rep.stores] == paths


def _damage_consume_queue(store: Path) -> None:
    """Entry 0: wrong size; entry 1: wrong tagsCode; entry 2: points at entry 3's record."""
    f = store / "consumequeue" / "TopicTest" / "0" / "00000000000000000000"
    b = bytearray(f.read_bytes())
    off, size, tags = struct.unpack_from(">qiq", b, 0)
    struct.pack_into(">qiq", b, 0, off, size + 1, tags)
    off, size, tags = struct.unpack_from(">qiq", b, 20)
    struct.pack_into(">qiq", b, 20, off, size, tags + 7)
    third, _, _ = struct.unpack_from(">qiq", b, 60)
    _, size, tags = struct.unpack_from(">qiq", b, 40)
    struct.pack_into(">qiq", b, 40, third, size, tags)
    f.write_bytes(bytes(b))


def test_verify_parity(spark, store_copy):
    from rmqdump.analysis.verify import verify_store
    from rmqdump.spark import jobs

    cq_damaged = store_copy("clean")
    _damage_consume_queue(cq_damaged)
    names = ("corrupt_crc", "crash_torn", "crash_kill9", "clean")
    paths = [str(real_store(n)) for n in names] + [str(cq_damaged)]
    verdicts = jobs.verify(spark, paths)
    for path, v in zip(paths, verdicts, strict=True):
        local = verify_store(path)
        assert v.document == local.to_dict(), path
        assert v.exit_code == local.exit_code
        assert v.reverified_segments == 0  # the stage-1 results were used, not recomputed
    kinds = [{f["kind"] for f in v.document["findings"]} for v in verdicts]
    assert "body_crc" in kinds[0] and "torn_record" in kinds[1]
    assert {"cq_size_mismatch", "cq_tags_mismatch", "cq_entry_duplicate", "cq_entry_missing"} <= kinds[4]
    assert [v.exit_code for v in verdicts] == [1, 1, 0, 0, 1]


def test_lookup_cli(spark):
    paths = [str(real_store(n)) for n in ("clean", "crash_torn")]
    res = CliRunner().invoke(cli, ["spark", "lookup", *paths, "--key", "key-7", "--topic", "TopicTest", "-f", "jsonl",
                                   "-q"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["broker"] for r in rows] == ["clean", "crash_torn"]
    assert all(r["topic"] == "TopicTest" and "key-7" in r["keys"] and r["body"] for r in rows)
    miss = CliRunner().invoke(cli, ["spark", "lookup", *paths, "--key", "no-such-key", "-q"])
    assert miss.exit_code == 1 and miss.stdout == ""


def expect_total(counter: Counter, broker: str) -> int:
    return sum(v for (b, _), v in counter.items() if b == broker)


# --- a real standalone cluster on loopback -------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(predicate, timeout: float, what: str, procs=()) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        for p in procs:
            if p.poll() is not None:
                raise AssertionError(f"{what}: process exited with {p.returncode}")
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_standalone_cluster_export(tmp_path):
    pyspark = pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime for Spark")
    spark_home = Path(pyspark.__file__).parent
    spark_class = spark_home / "bin" / "spark-class"
    env = dict(os.environ, SPARK_HOME=str(spark_home), SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1",
               SPARK_LOG_DIR=str(tmp_path / "logs"), SPARK_WORKER_DIR=str(tmp_path / "work"))
    port, ui, wui = _free_port(), _free_port(), _free_port()
    url = f"spark://127.0.0.1:{port}"
    procs: list[subprocess.Popen] = []
    master_log = open(tmp_path / "master.log", "wb")  # noqa: SIM115 (closed below)
    worker_log = open(tmp_path / "worker.log", "wb")  # noqa: SIM115
    try:
        procs.append(subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(port),
             "--webui-port", str(ui)], env=env, stdout=master_log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL))
        _wait_for(lambda: _port_open(port), 90, "the Spark master", procs)
        procs.append(subprocess.Popen(
            [str(spark_class), "org.apache.spark.deploy.worker.Worker", url, "--host", "127.0.0.1",
             "--webui-port", str(wui), "--cores", "2", "--memory", "1g", "--work-dir", str(tmp_path / "work")],
            env=env, stdout=worker_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        # the driver starts while the worker registers (it waits for an executor anyway)
        paths = [str(real_store(n)) for n in STORES]
        out = tmp_path / "out"
        t0 = time.perf_counter()
        driver = subprocess.Popen(
            [sys.executable, "-m", "rmqdump.spark", "export", *paths, "--out", str(out), "--master", url,
             "--body", "--json", "-q", "--conf", "spark.driver.host=127.0.0.1",
             "--conf", "spark.driver.bindAddress=127.0.0.1", "--conf", "spark.executor.memory=512m"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
            env=dict(os.environ, SPARK_LOCAL_IP="127.0.0.1"))
        procs.append(driver)
        try:
            stdout, stderr = driver.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            driver.kill()
            stdout, stderr = driver.communicate()
            raise AssertionError(f"the export on the cluster timed out: {stderr[-3000:]}") from None
        assert driver.returncode == 0, stderr[-3000:]
        summary = json.loads(stdout)
        print(f"\nstandalone export: {summary} ({time.perf_counter() - t0:.1f} s with the driver start)",
              file=sys.stderr)
        assert summary["master"] == url
        rows = read_export(out)
        for path in paths:
            assert [as_scan(r) for r in rows if r["store"] == path] == scan_rows(Path(path))
        assert summary["rows"] == len(rows)
        assert b"Registering worker" in (tmp_path / "master.log").read_bytes()
        assert b"Asked to launch executor" in (tmp_path / "worker.log").read_bytes()  # the work ran on the worker
    finally:
        for p in reversed(procs):
            _stop(p)
        master_log.close()
        worker_log.close()


def test_spark_runs_from_a_venv_used_by_path(tmp_path):
    """`.venv/bin/rmqdump spark ...` without an activated venv: Spark's Python data source planner
    starts `python3` from PATH whatever spark.pyspark.python says, so rmqdump pins PYSPARK_PYTHON to
    its own interpreter. A `python3` on PATH that cannot run anything must not matter."""
    pytest.importorskip("pyspark")
    java = shutil.which("java")
    if java is None:
        pytest.skip("no Java runtime for Spark")
    env = _env_with_a_broken_python(tmp_path, java)
    store = Path(__file__).resolve().parent.parent / "fixtures" / "store"
    r = subprocess.run([sys.executable, "-m", "rmqdump.cli", "spark", "stats", str(store), "-f", "jsonl", "-q"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert sum(row["records"] for row in rows) > 0


# --- issue 20: a data source as Spark users expect it -------------------------------------------

REPO = Path(__file__).resolve().parent.parent
FIXTURE = REPO / "fixtures" / "store"
FLIPPED = REPO / "fixtures" / "oracle" / "498-flip-body-mid" / "store"  # bad_magic at 1862, body_crc at 2298


def _single_stats(path: Path) -> tuple[int, dict, int]:
    """`rmqdump stats` of one store: total records, records per (topic, queue), exit code."""
    res = CliRunner().invoke(cli, ["stats", str(path), "-f", "json", "-q"])
    doc = json.loads(res.stdout)
    return doc["totals"]["records"], {(q["topic"], q["queue_id"]): q["records"] for q in doc["queues"]}, res.exit_code


def _damage_middle_segment(tmp_path: Path) -> Path:
    """fixtures/store with the MAGICCODE of the 3rd record of its second segment zeroed."""
    store = tmp_path / "damaged" / "store"
    shutil.copytree(FIXTURE, store)
    seg = store / "commitlog" / "00000000000000004096"
    b = bytearray(seg.read_bytes())
    pos = 0
    for _ in range(2):
        pos += struct.unpack_from(">i", b, pos)[0]
    struct.pack_into(">i", b, pos + 4, 0x12345678)
    seg.write_bytes(bytes(b))
    return store


def test_readme_example_in_a_plain_session(tmp_path):
    """The README's PySpark example, as written, in a plain SparkSession (filter pushdown off, Spark's
    default), started from a venv used by its path: `python3` on PATH cannot even run."""
    pytest.importorskip("pyspark")
    java = shutil.which("java")
    if java is None:
        pytest.skip("no Java runtime for Spark")
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("# README example: a plain SparkSession")
    code = text[start:text.index("```", start)]
    assert 'master("local[1]")' in code and "register_data_sources(spark)" in code
    env = _env_with_a_broken_python(tmp_path, java)
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    table = [[c.strip() for c in line.split("|")[1:-1]] for line in r.stdout.splitlines() if line.startswith("|")]
    counts = Counter(str(row["queue_id"]) for row in scan_rows(FIXTURE) if row["topic"] == "TopicTest")
    assert [t for t in table if t[0] == "fixtures"] == [["fixtures", q, str(n)] for q, n in sorted(counts.items(), key=lambda kv: int(kv[0]))]
    assert "bad_magic: damaged bytes [1862, 2080) skipped" in r.stdout
    assert "body_crc: damaged bytes [2298, 2580) skipped" in r.stdout


def test_options_validated_and_pushdown_optional(spark):
    from pyspark.sql import functions as F

    path = str(FIXTURE)
    with pytest.raises(Exception, match=r"unknown option 'includebodies'; known options: includeBody, decompress"):
        spark.read.format("rocketmq").option("includeBodies", "true").load(path).count()
    with pytest.raises(Exception, match=r"unknown option 'topics'; known options: raw"):
        spark.read.format("rocketmq_cq").option("topics", "x").load(path).count()
    with pytest.raises(Exception, match=r"option mode: expected one of PERMISSIVE, DROPMALFORMED, FAILFAST"):
        spark.read.format("rocketmq").option("mode", "lenient").load(path).count()
    expected = sum(1 for r in scan_rows(FIXTURE) if r["topic"] == "TopicTest")
    assert spark.conf.get("spark.sql.python.filterPushdown.enabled") == "true"
    try:
        for pushdown in ("true", "false"):
            spark.conf.set("spark.sql.python.filterPushdown.enabled", pushdown)
            df = spark.read.format("rocketmq").load(path)
            assert df.where(F.col("topic") == "TopicTest").count() == expected, pushdown
            assert df.where(F.col("topic").isin("TopicTest", "nope")).count() == expected, pushdown
    finally:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", "true")


def test_pyspark_without_filter_classes(tmp_path):
    """pyspark 4.0 has Python data sources but no EqualTo/In/Filter: the module imports, no pushdown."""
    pytest.importorskip("pyspark")
    code = ("import pyspark.sql.datasource as d\n"
            "del d.EqualTo, d.In, d.Filter\n"
            "import rmqdump.spark.datasource as m\n"
            "assert not m.PUSHDOWN_API\n"
            "r = m.RocketMQDataSource({'path': 'fixtures/store'}).reader(None)\n"
            "assert type(r).pushFilters is d.DataSourceReader.pushFilters\n"
            "print(len(r.partitions()))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "4", r.stderr[-2000:]


def test_damage_is_never_silent(spark, tmp_path):
    from pyspark.sql import functions as F

    from rmqdump.spark import jobs

    damaged = _damage_middle_segment(tmp_path)
    total, per_queue, rc = _single_stats(damaged)
    assert rc == 1
    df = spark.read.format("rocketmq").load(str(damaged))
    bad = df.where(F.col("_corrupt_record").isNotNull()).collect()
    assert len(bad) == 1 and bad[0]["segment"].endswith("00000000000000004096")
    assert bad[0]["_corrupt_record"].startswith("bad_magic:") and bad[0]["topic"] is None
    assert "the rest of the segment is not read" in bad[0]["_corrupt_record"]
    # DROPMALFORMED walks past the damage and drops it: the records `rmqdump stats` counts
    drop = spark.read.format("rocketmq").option("mode", "DROPMALFORMED").load(str(damaged))
    assert drop.count() == total and drop.where(F.col("_corrupt_record").isNotNull()).count() == 0
    with pytest.raises(Exception, match=r"bad_magic.*mode FAILFAST"):
        spark.read.format("rocketmq").option("mode", "FAILFAST").load(str(damaged)).count()
    # spark stats: same counts as `rmqdump stats`, damage reported
    found: list[dict] = []
    rows = jobs.stats(spark, [damaged, FLIPPED], by=("broker", "topic", "queue_id"), damage=found)
    assert {(r["topic"], r["queue_id"]): r["records"] for r in rows if r["broker"] == "damaged"} == per_queue
    assert sum(r["records"] for r in rows if r["broker"] == "498-flip-body-mid") == _single_stats(FLIPPED)[0]
    assert sorted((Path(d["store"]).parent.name, d["offset"], d["detail"].split(":")[0]) for d in found) == [
        ("498-flip-body-mid", 1862, "bad_magic"), ("498-flip-body-mid", 2298, "body_crc"),
        ("damaged", bad[0]["offset"], "bad_magic")]
    res = CliRunner().invoke(cli, ["spark", "stats", str(damaged), "--by", "topic", "-f", "jsonl"])
    assert res.exit_code == 1
    assert sum(json.loads(line)["records"] for line in res.stdout.splitlines()) == total
    assert f"at offset {bad[0]['offset']}: bad_magic" in res.stderr
    # a file that is not a commitlog segment: an error, as `scan` gives, not 0 rows
    res = CliRunner().invoke(cli, ["spark", "stats", str(REPO / "pyproject.toml"), "-q"])
    assert res.exit_code == 2 and res.stdout == ""
    assert res.stderr.count("\n") == 1 and "no valid record: bad_magic" in res.stderr
    res = CliRunner().invoke(cli, ["spark", "export", str(REPO / "pyproject.toml"), "--out", str(tmp_path / "o"), "-q"])
    assert res.exit_code == 2 and "no valid record: bad_magic" in res.stderr and res.stderr.count("\n") == 1


def test_paths_uris_and_broker_names(spark, tmp_path, monkeypatch):
    from rmqdump.rows.arrow import broker_names
    from rmqdump.spark import jobs

    monkeypatch.chdir(tmp_path)
    for uri in ("s3a://bucket/x", "hdfs://nn:8020/x"):
        res = CliRunner().invoke(cli, ["spark", "export", str(FIXTURE), "--out", uri, "-q"])
        assert res.exit_code == 2 and res.stderr.count("\n") == 1, res.output
        assert "is not supported for the export directory" in res.stderr
        assert not os.path.exists(uri.split("/")[0])
    with pytest.raises(Exception, match="is not supported for the export directory"):
        jobs.export(spark, [FIXTURE], "s3a://bucket/x")
    assert not os.path.exists("s3a:")
    a, b = (Path(shutil.copytree(FIXTURE, tmp_path / "x" / h / "root" / "store")) for h in ("host1", "host2"))
    assert broker_names([a, b]) == {str(a): "host1/root", str(b): "host2/root"}
    assert broker_names([a]) == {str(a): "root"}
    rel_a, rel_b = os.path.relpath(a), f"file://{b}"
    rows = jobs.stats(spark, [rel_a, rel_b], by=("broker", "store"))
    n = len(scan_rows(FIXTURE))
    assert {(r["broker"], r["store"]): r["records"] for r in rows} == {("host1/root", str(a)): n,
                                                                       ("host2/root", str(b)): n}
    cq = spark.read.format("rocketmq_cq").load([str(a), str(b)]).select("broker").distinct().collect()
    assert sorted(r["broker"] for r in cq) == ["host1/root", "host2/root"]
    out = jobs.export(spark, [rel_a], "out")
    assert {r["store"] for r in read_export(tmp_path / "out")} == {str(a)} and out.rows == n


def test_export_of_one_segment_runs_ranges_on_every_core(spark, tmp_path, monkeypatch):
    """Fewer segments than cores: the segment is cut into ranges, one task each; a split point inside a
    record (fake headers in bodies) is caught by the join and the rest walked again: the rows are scan's."""
    from test_segment_split import image, segment

    from rmqdump.fast import segment_split as ss
    from rmqdump.spark import jobs

    monkeypatch.setattr(ss, "SPLIT_MIN_BYTES", 1)  # the driver plans the ranges
    for name, fake in (("true", False), ("fake", True)):
        data, _ = image(64 * 1024, fake=fake, seed=3)
        segment(tmp_path / name, data)
        tasks: list[dict] = []
        res = jobs.export(spark, [tmp_path / name], tmp_path / f"out-{name}", task_stats=tasks, include_body=True)
        rows = read_export(tmp_path / f"out-{name}")
        assert [as_scan(r) for r in rows] == scan_rows(tmp_path / name) and res.rows == len(rows) > 0
        assert res.segments == 1 and len(res.reports) == 1 and res.reports[0].stop_kind == "end_of_data"
        ranges = [t["range"] for t in tasks]
        assert ranges[0][0] == 0 and len(ranges) == (2 if not fake else 3), ranges  # fake: a walk of the rest
        assert len(list((tmp_path / f"out-{name}").glob("*.parquet"))) == len(res.files) == 2


def test_broker_names_given_per_store(spark, tmp_path):
    """Names per store (the `brokers` option, --store-name NAME=PATH) in the data sources, stats, export,
    verify and lookup; one name for two stores, or a path that is not a store given, is a one-line error."""
    from pyspark.sql import functions as F

    a, b = (Path(shutil.copytree(FIXTURE, tmp_path / "x" / h / "root" / "store")) for h in ("host1", "host2"))
    names = json.dumps({str(a): "broker-a", f"file://{b}": "broker-b"})
    df = spark.read.format("rocketmq").option("brokers", names).load([str(a), str(b)])
    assert {r["broker"]: r["store"] for r in df.select("broker", "store").distinct().collect()} == {
        "broker-a": str(a), "broker-b": str(b)}
    assert df.where(F.col("broker") == "broker-b").rdd.getNumPartitions() == 4  # pruned by the given name
    cq = spark.read.format("rocketmq_cq").option("brokers", json.dumps({str(a): "broker-a"})).load([str(a), str(b)])
    assert sorted(r["broker"] for r in cq.select("broker").distinct().collect()) == ["broker-a", "host2/root"]
    given = ["--store-name", f"broker-a={a}", "--store-name", f"broker-b={os.path.relpath(b)}"]
    res = CliRunner().invoke(cli, ["spark", "stats", str(a), str(b), *given, "--by", "broker", "-f", "jsonl", "-q"])
    assert res.exit_code == 0, res.output
    n = len(scan_rows(FIXTURE))
    assert [(r["broker"], r["records"]) for r in map(json.loads, res.stdout.splitlines())] == [
        ("broker-a", n), ("broker-b", n)]
    res = CliRunner().invoke(cli, ["spark", "export", str(a), str(b), *given, "--out", str(tmp_path / "out"),
                                   "--partition-by", "broker", "-q"])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "out").iterdir() if p.is_dir()) == ["broker=broker-a", "broker=broker-b"]
    assert {r["broker"] for r in read_export(tmp_path / "out")} == {"broker-a", "broker-b"}
    res = CliRunner().invoke(cli, ["spark", "verify", str(a), str(b), *given, "-f", "jsonl", "-q"])
    assert res.exit_code == 0, res.output
    assert [(d["broker"], d["store"]) for d in map(json.loads, res.stdout.splitlines())] == [
        ("broker-a", str(a)), ("broker-b", str(b))]
    res = CliRunner().invoke(cli, ["spark", "lookup", str(a), str(b), *given, "--key", "key-1", "-f", "jsonl", "-q"])
    assert {json.loads(line)["broker"] for line in res.stdout.splitlines()} == {"broker-a", "broker-b"}
    # one name for two stores (given twice, or given and the other's default), a path that is not a store
    for bad, why in ((["--store-name", f"same={a}", "--store-name", f"same={b}"], "names two stores"),
                     (["--store-name", f"host2/root={a}"], "names two stores"),
                     (["--store-name", f"c={tmp_path}"], "not one of the stores")):
        res = CliRunner().invoke(cli, ["spark", "stats", str(a), str(b), *bad, "-q"])
        assert res.exit_code == 2 and res.stdout == "" and res.stderr.count("\n") == 1, res.output
        assert res.stderr.startswith("rmqdump: error: --store-name: ") and why in res.stderr
    res = CliRunner().invoke(cli, ["spark", "stats", str(a), "--store-name", str(a), "-q"])
    assert res.exit_code == 2 and "expected NAME=PATH" in res.stderr
    with pytest.raises(Exception, match="broker name 'same' names two stores"):
        spark.read.format("rocketmq").option("brokers", json.dumps({str(a): "same", str(b): "same"})).load(
            [str(a), str(b)]).count()
    with pytest.raises(Exception, match="option brokers: expected a JSON object"):
        spark.read.format("rocketmq_index").option("brokers", "broker-a").load(str(a)).count()


def test_pushdown_reader_only_for_the_pushdown_planner():
    """Spark plans with pushdown in pyspark/sql/worker/data_source_pushdown_filters.py (it calls pushFilters)
    and without in plan_data_source_read.py (it refuses a reader implementing pushFilters)."""
    pyspark = pytest.importorskip("pyspark")
    from pyspark.sql.datasource import DataSourceReader

    from rmqdump.spark import datasource as ds

    workers = Path(pyspark.__file__).parent / "sql" / "worker"
    assert "reader.pushFilters(" in (workers / "data_source_pushdown_filters.py").read_text()
    assert "DATA_SOURCE_PUSHDOWN_DISABLED" in (workers / "plan_data_source_read.py").read_text()
    source = ds.RocketMQDataSource({"path": str(FIXTURE)})
    kinds = {}
    for planner in ("data_source_pushdown_filters.py", "plan_data_source_read.py", "elsewhere.py"):
        ns = {"source": source}
        exec(compile("reader = source.reader(None)", str(workers / planner), "exec"), ns)
        kinds[planner] = type(ns["reader"]).pushFilters is not DataSourceReader.pushFilters
    assert kinds == {"data_source_pushdown_filters.py": True, "plan_data_source_read.py": False, "elsewhere.py": False}


def _env_with_a_broken_python(tmp_path: Path, java: str) -> dict[str, str]:
    """The environment of a venv used by its path: no venv variables, and a ``python3``/``python`` first on
    PATH that cannot run anything (so only an interpreter rmqdump pins can run Spark's Python side)."""
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("python3", "python"):
        (fake / name).write_text("#!/bin/sh\necho 'not the rmqdump interpreter' >&2\nexit 3\n")
        (fake / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV")}
    env["PATH"] = os.pathsep.join((str(fake), str(Path(java).resolve().parent), "/usr/bin", "/bin"))
    return env
