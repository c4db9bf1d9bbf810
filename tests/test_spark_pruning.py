"""Planning-time pruning of ``format("rocketmq")`` and BatchConsumeQueue rows of ``rocketmq_cq``.

One SparkSession for the module (local[2], ``spark`` fixture). Partitions are counted with
``df.rdd.getNumPartitions()``: one per commitlog segment the reader opens.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from rmqdump.write.message import MessageSpec
from rmqdump.write.writer import StoreWriter

pytestmark = pytest.mark.spark

REPO = Path(__file__).resolve().parent.parent
ORACLE = REPO / "fixtures" / "oracle"
#: RocketMQ-written stores whose consume queues do not account for every record (a deleted topic, a CQ
#: hole, lost CQ tails, transaction halves), LMQ, BatchCQ, DLedger, damage: pruning must not lose a row
ADVERSARIAL = ("498-crash-cq-lag", "498-cq-hole", "498-healthy-tx-v6", "498-healthy-lmq", "533-healthy-bcq",
               "533-normal-cq-lag", "498-dledger", "498-flip-body-mid", "498-multi-topic")


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime for Spark")
    from rmqdump.spark import build_session

    return build_session("local[2]", app_name="rmqdump-pruning-tests")


@pytest.fixture(scope="module")
def blocks(tmp_path_factory) -> Path:
    """A store of 4 KiB segments: topic A first, then B, then A and C interleaved (queues 0 and 1)."""
    root = tmp_path_factory.mktemp("pruning") / "brokerP" / "store"
    w = StoreWriter(root, commitlog_file_size=4096, cq_file_size=600, index_slots=16, index_entries=64)
    plan = [("A", i % 2) for i in range(40)] + [("B", 0)] * 40 + [("AC"[i % 2], i % 2) for i in range(40)]
    for i, (topic, qid) in enumerate(plan):
        w.append(MessageSpec(topic=topic, queue_id=qid, body=f"m{i:04d}".encode() * 20, keys=f"k{i}"))
    w.sync()
    w.close()
    return root


def _rows(df) -> list[tuple]:
    return sorted((r["store"], r["offset"], r["topic"], r["queue_id"], r["_corrupt_record"]) for r in df.collect())


def _where(rows: list[tuple], **want) -> list[tuple]:
    """The rows whose columns (store 0, offset 1, topic 2, queue_id 3) pass ``want`` (a value or a predicate)."""
    cols = {"store": 0, "offset": 1, "topic": 2, "queue_id": 3}
    return [r for r in rows if all((v(r[cols[k]]) if callable(v) else r[cols[k]] == v) for k, v in want.items())]


def test_pruning_by_offset_broker_topic(spark, blocks):
    from pyspark.sql import functions as F

    from rmqdump.rows.arrow import segment_splits

    other = ORACLE / "498-multi-topic" / "store"
    paths = [str(blocks), str(other)]
    segs = segment_splits(paths)
    mine = [s for s in segs if s.store == str(blocks)]
    assert len(mine) >= 8
    on = spark.read.format("rocketmq").load(paths)
    off = spark.read.format("rocketmq").option("prune", "false").load(paths)
    assert on.rdd.getNumPartitions() == off.rdd.getNumPartitions() == len(segs)
    full = _rows(off)
    cut, one = mine[3].start + 10, mine[5].start
    col = F.col
    queries = {  # name: (Spark condition, the same on collected rows)
        "offset <": (col("offset") < cut, {"offset": lambda o: o < cut}),
        "offset between": ((col("offset") >= mine[2].start) & (col("offset") <= cut),
                           {"offset": lambda o: mine[2].start <= o <= cut}),
        "offset =": (col("offset") == one, {"offset": one}),
        "broker": (col("broker") == "brokerP", {"store": str(blocks)}),
        "store in": (col("store").isin(str(other)), {"store": str(other)}),
        "topic B": (col("topic") == "B", {"topic": "B"}),
        "topic C queue 1": ((col("topic") == "C") & (col("queue_id") == 1), {"topic": "C", "queue_id": 1}),
        "topic in": (col("topic").isin("B", "C"), {"topic": lambda t: t in ("B", "C")}),
        "no such topic": (col("topic") == "nope", {"topic": "nope"}),
    }
    opened = {}
    for name, (cond, want) in queries.items():
        pruned = on.where(cond)
        assert _rows(pruned) == _where(full, **want), name
        opened[name] = pruned.rdd.getNumPartitions()
        assert opened[name] < len(segs), (name, opened[name])

    def overlapping(lo: int, hi: int) -> int:  # segments holding offsets in [lo, hi)
        return sum(1 for s in segs if s.start < hi and s.start + s.size > lo)

    assert opened["offset <"] == overlapping(0, cut) == 5  # 4 of blocks, 1 of the other store
    assert opened["offset between"] == overlapping(mine[2].start, cut + 1)
    assert opened["offset ="] == overlapping(one, one + 1)
    assert opened["broker"] == len(mine) and opened["store in"] == len(segs) - len(mine)
    # topic B lives in a few segments in the middle; the other store's consume queues hold no B either
    b_segs = {r["segment"] for r in on.where(col("topic") == "B").select("segment").distinct().collect()}
    assert opened["topic B"] == len(b_segs) < len(mine) / 2
    assert opened["no such topic"] == 1  # none to read (Spark's placeholder partition)
    # the explicit options prune (and filter) the same way
    opt = spark.read.format("rocketmq").option("topic", "B").option("toOffset", str(cut)).load(paths)
    assert _rows(opt) == _where(full, topic="B", offset=lambda o: o < cut)
    assert opt.rdd.getNumPartitions() <= 4


def test_pruning_never_loses_a_row(spark):
    """Stores whose queues do not account for every record: per topic, the pruned read equals the full one."""
    from pyspark.sql import functions as F

    from rmqdump.rows.arrow import segment_splits

    paths = [str(ORACLE / n / "store") for n in ADVERSARIAL]
    n_segs = len(segment_splits(paths))
    full = _rows(spark.read.format("rocketmq").option("prune", "false").load(paths))
    walked = _rows(spark.read.format("rocketmq").options(prune="false", keepGoing="true", mode="DROPMALFORMED")
                   .load(paths))
    on = spark.read.format("rocketmq").load(paths)
    topics = sorted({r[2] for r in full if r[2] is not None})
    assert {"TopicGone", "BCQ", "TopicTx", "MqttTopic"} <= set(topics)
    for t in topics:
        pruned = on.where(F.col("topic") == t)
        assert _rows(pruned) == _where(full, topic=t), t
        assert pruned.rdd.getNumPartitions() < n_segs, t  # other stores' segments at least
    for t in ("TopicGone", "BCQ", "TopicTx", "TopicA", "DTopic1"):
        opt = spark.read.format("rocketmq").options(topic=t, keepGoing="true", mode="DROPMALFORMED").load(paths)
        assert _rows(opt) == _where(walked, topic=t), t


def test_consume_queue_coverage():
    """The segments a store's queues account for: tiled back to back, unwritten space or a BLANK after."""
    from rmqdump.spark.pruning import coverage

    def complete(name: str) -> dict[int, bool]:
        return coverage(str(ORACLE / name / "store")).complete

    assert complete("498-multi-topic") == {0: True}
    assert complete("533-healthy-bcq") == {0: True}  # BatchConsumeQueue units count
    assert complete("498-healthy-lmq") == {0: True}  # LMQ units aside
    assert complete("498-cq-hole") == {0: False, 4096: False}  # a lost CQ file, a deleted queue
    assert complete("498-healthy-tx-v6") == {0: False}  # PREPARED records are not dispatched
    assert set(complete("498-dledger").values()) == {False}  # DLedger entries: never tiled
    lag = complete("498-crash-cq-lag")
    assert lag == {0: False, 4096: False, 8192: False, 12288: True}  # the last one is unwritten
    assert coverage(str(ORACLE / "498-crash-cq-lag" / "store"), keep_going=True).complete[12288] is False


def test_cq_source_reads_batch_consume_queues(spark):
    from pyspark.sql import functions as F

    from rmqdump.store.consumequeue.batch import open_batch_queues

    store = ORACLE / "533-healthy-bcq" / "store"
    cq = spark.read.format("rocketmq_cq").load(str(store))
    got = sorted((r["topic"], r["queue_id"], r["queue_offset"], r["commitlog_offset"], r["size"], r["batch_size"])
                 for r in cq.where(F.col("queue_kind") == "batchconsumequeue").collect())
    want = sorted((t, q, u.msg_base_offset, u.commit_log_offset, u.size, u.batch_size)
                  for (t, q), bcq in open_batch_queues(store).items() for u in bcq.iter_units())
    assert got == want and len(want) >= 2 and any(w[-1] > 1 for w in want)
    plain = cq.where(F.col("queue_kind") == "consumequeue")
    assert plain.where(F.col("batch_size") != 1).count() == 0 and plain.count() > 0
    # every record of the store is pointed at by a unit of one kind or the other
    recs = spark.read.format("rocketmq").load(str(store)).select("offset").distinct().count()
    assert cq.where("valid").select("commitlog_offset").distinct().count() == recs


def test_readme_multi_host_recipe(spark, tmp_path):
    """README, stores on each broker's local disk: `rmqdump export` per host into host=NAME folders of a
    shared directory, then one Spark read of it (the host a partition column)."""
    from click.testing import CliRunner
    from pyspark.sql import functions as F

    from rmqdump.cli import cli

    fixture = REPO / "fixtures" / "store"
    shared = tmp_path / "shared" / "export"
    for host in ("host-a", "host-b"):  # the same store path on each host: /data/rocketmq/store
        store = shutil.copytree(fixture, tmp_path / host / "data" / "rocketmq" / "store")
        res = CliRunner().invoke(cli, ["export", str(store), "--to", str(shared / f"host={host}"),
                                       "--partition-by", "topic,date"])
        assert res.exit_code == 0, res.output
    df = spark.read.parquet(str(shared))
    direct = spark.read.format("rocketmq").load(str(fixture))
    want = sorted((r["topic"], r["offset"]) for r in direct.collect())
    for host in ("host-a", "host-b"):
        assert sorted((r["topic"], r["offset"]) for r in df.where(F.col("host") == host).collect()) == want
    assert {r["broker"] for r in df.select("broker").distinct().collect()} == {"rocketmq"}


def test_verify_keeps_per_record_data_off_the_driver(spark, blocks, tmp_path, monkeypatch):
    """`spark verify` of a store whose every record needs a closer look (no consume queues at all): the
    driver receives per-segment and per-store results only, and the report is `rmqdump verify`'s."""
    from pyspark import RDD

    from rmqdump.analysis.verify import verify_store
    from rmqdump.spark import jobs

    store = Path(shutil.copytree(blocks, tmp_path / "nocq" / "store"))
    shutil.rmtree(store / "consumequeue")
    records = len(spark.read.format("rocketmq").load(str(store)).collect())
    collected: list[int] = []
    for cls in (RDD, type(spark.range(1))):  # (the classic DataFrame class overrides collect)
        real = cls.collect

        def spy(self, *a, _real=real, **kw):
            out = _real(self, *a, **kw)
            collected.append(len(out))
            return out

        monkeypatch.setattr(cls, "collect", spy)
    verdicts = jobs.verify(spark, [str(store), str(blocks)])
    monkeypatch.undo()
    assert records == 120
    assert sum(collected) <= 3 * 10 + 2 * 2, collected  # segments, per-store counts, verdicts
    for path, v in zip((store, blocks), verdicts, strict=True):
        local = verify_store(str(path))
        assert v.document == local.to_dict() and v.exit_code == local.exit_code
    assert "cq_not_dispatched" in {f["kind"] for f in verdicts[0].document["findings"]}


def test_globs_and_file_uris_as_stores(spark, tmp_path):
    """Store globs are expanded on the driver (sorted, deduplicated), file:// URIs read as paths: in the
    data source, the jobs and the CLI; a glob matching nothing is a one-line error."""
    from click.testing import CliRunner
    from pyspark.sql import functions as F

    from rmqdump.cli import cli
    from rmqdump.spark import jobs

    fixture = REPO / "fixtures" / "store"
    for host in ("h2", "h1", "h3"):
        shutil.copytree(fixture, tmp_path / host / "store")
    pattern = str(tmp_path / "h*" / "store")
    n = spark.read.format("rocketmq").load(str(fixture)).count()
    df = spark.read.format("rocketmq").load([pattern, f"file://{tmp_path}/h1/store"])
    got = {r["store"]: r["count"] for r in df.groupBy("store").count().collect()}
    assert got == {str(tmp_path / h / "store"): n for h in ("h1", "h2", "h3")}
    assert [r["broker"] for r in df.select("broker").distinct().orderBy("broker").collect()] == ["h1", "h2", "h3"]
    rows = jobs.stats(spark, [pattern], by=("broker",))
    assert [(r["broker"], r["records"]) for r in rows] == [("h1", n), ("h2", n), ("h3", n)]
    res = CliRunner().invoke(cli, ["spark", "stats", pattern, f"file://{tmp_path}/h2/store", "--by", "broker",
                                   "-f", "jsonl", "-q"])
    assert res.exit_code == 0, res.output
    assert [json.loads(line)["broker"] for line in res.stdout.splitlines()] == ["h1", "h2", "h3"]
    res = CliRunner().invoke(cli, ["spark", "stats", str(tmp_path / "nope*" / "store"), "-q"])
    assert res.exit_code == 2 and "no store matches this pattern" in res.output
    assert spark.read.format("rocketmq").load(pattern).where(F.col("broker") == "h2").rdd.getNumPartitions() == \
        spark.read.format("rocketmq").load(str(fixture)).rdd.getNumPartitions()
