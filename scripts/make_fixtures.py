"""Regenerate the bundled fixture store deterministically: ``python scripts/make_fixtures.py``.

``fixtures/store/`` is a small store as a 4.9 broker would hold it, written by rmqdump's own
encoder and dispatching writer (4 KiB commitlog segments, 600-byte ConsumeQueue files, a
500/2000 IndexFile). It covers: blanks and segment rolls, IPv4 and IPv6 born hosts, every
transaction type (COMMIT/ROLLBACK pointing at their half message), zlib (typed and legacy),
lz4 and zstd bodies, duplicate/empty/unicode properties, keys with runs of spaces, IPv4 and
IPv6 UNIQ_KEYs, the delay topic (tagsCode = delivery time), an empty body, a body holding
the magic bytes, user flags and reconsume counts, plus checkpoint, lock and fastjson
``config/`` files. ``fixtures/store-5x/`` holds what only a 5.x broker writes: an IPv6 store
host (56-char offsetMsgId), the V2 magic (a 130-unit topic) and the 5.2+ ``__CRC32#``
property on every record, with an empty ``abort.bak``. Everything is a function of this script.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rmqdump.codec.layout import (  # noqa: E402
    MESSAGE_MAGIC_CODE,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)
from rmqdump.store.checkpoint import Checkpoint, write_checkpoint  # noqa: E402
from rmqdump.write.writer import MessageSpec, StoreWriter, make_uniq_key  # noqa: E402

T0 = 1793491200000  # 2026-11-01T00:00:00Z
FILE_SIZE = 4 * 1024
V4 = bytes([10, 0, 0, 5])
V6 = bytes.fromhex("fd000000000000000000000000000002")


class Clock:
    def __init__(self):
        self.now = T0

    def __call__(self) -> int:
        self.now += 37
        return self.now


def messages(clock: Clock) -> list[MessageSpec]:
    out: list[MessageSpec] = []

    def uk(ip=V4, n=[0]) -> str:  # noqa: B006 - a deterministic counter
        n[0] += 1
        return make_uniq_key(ip, 12345, 0x1B6D3586, clock.now, n[0])

    for i in range(24):
        out.append(MessageSpec("TopicTest", f"Hello RocketMQ {i}".encode(), queue_id=i % 4, tags="Tag" + "ABC"[i % 3], keys=f"key-{i} order-{i % 5}", properties={"seq": str(i)},
                               uniq_key=uk()))
    out.append(MessageSpec("TopicTest", b"from an IPv6 producer", queue_id=1, tags="TagA",
                           keys="v6-key", born_host="[fd00::2]:40001", uniq_key=uk(V6)))
    text = ("rocket alpha beta commit " * 400).encode()
    for comp in ("zlib", "legacy-zlib", "lz4", "zstd"):
        out.append(MessageSpec("TopicBig", text, tags="big", keys=f"big-{comp}", uniq_key=uk(), compression=comp))
    out.append(MessageSpec("TopicBig", b"", tags="empty", keys="empty-body", uniq_key=uk()))
    out.append(MessageSpec("TopicBig", b"xx\xda\xa3\x20\xa7magic inside the body\xda\xa3\x20\xab", tags="magic",
                           keys="magic-body", uniq_key=uk()))
    # transactions: half message, commit pointing at it, op record, and third-party PREPARED / ROLLBACK
    out.append(MessageSpec("RMQ_SYS_TRANS_HALF_TOPIC", b"transactional commit-1", tags="tx", keys="commit-1",
                           properties={"REAL_TOPIC": "TopicTx", "REAL_QID": "0", "TRAN_MSG": "true",
                                       "PGROUP": "pg-tx"}, uniq_key=uk()))
    out.append(MessageSpec("TopicTx", b"transactional commit-1", tags="tx", keys="commit-1",
                           properties={"REAL_TOPIC": "TopicTx", "REAL_QID": "0", "TRAN_MSG": "true",
                                       "PGROUP": "pg-tx"}, transaction=TRANSACTION_COMMIT_TYPE, uniq_key=uk()))
    out.append(MessageSpec("RMQ_SYS_TRANS_OP_HALF_TOPIC", b"0", tags="d", auto_uniq_key=False))
    out.append(MessageSpec("TopicTx", b"legacy prepared", tags="tx", keys="prepared-1",
                           transaction=TRANSACTION_PREPARED_TYPE, uniq_key=uk()))
    out.append(MessageSpec("TopicTx", b"legacy rollback", tags="tx", keys="rollback-1",
                           transaction=TRANSACTION_ROLLBACK_TYPE, uniq_key=uk()))
    # delay topic: level 3 -> queue 2, tagsCode = store time + 10 s
    out.append(MessageSpec("SCHEDULE_TOPIC_XXXX", b"delayed by level 3", queue_id=2, tags="delay3",
                           keys="delay-key-3", properties={"DELAY": "3", "REAL_TOPIC": "TopicDelay",
                                                           "REAL_QID": "1"}, uniq_key=uk()))
    out.append(MessageSpec("SCHEDULE_TOPIC_XXXX", b"delayed by level 18", queue_id=17, tags="delay18",
                           keys="delay-key-18", properties={"DELAY": "18", "REAL_TOPIC": "TopicDelay",
                                                            "REAL_QID": "0"}, uniq_key=uk()))
    # property edge cases (raw strings exactly as stored)
    out.append(MessageSpec("TopicProps", b"duplicate WAIT, empty segments", properties_raw=(
        "KEYS\x01dup-1\x02UNIQ_KEY\x01" + uk() + "\x02WAIT\x01true\x02\x02TAGS\x01batchTag\x02\x02x\x02"
        "CLUSTER\x01DefaultCluster\x02WAIT\x01true").encode()))
    out.append(MessageSpec("TopicProps", "unicode 中文 ключ".encode(), tags="标签", keys="键-ключ-🔑 second-key",
                           properties={"用户": "值 value ✓"}, uniq_key=uk()))
    out.append(MessageSpec("TopicProps", b"runs of spaces", keys="k1  k2   k3", tags="spaces", uniq_key=uk()))
    out.append(MessageSpec("TopicProps", b"no tags, no keys", uniq_key=uk()))
    out.append(MessageSpec("TopicProps", b"flag and reconsume", tags="flag", keys="flag-key", flag=7,
                           reconsume_times=3, uniq_key=uk()))
    batch_ts = clock.now + 1000
    clock.now = batch_ts + 1000
    for j in range(10):  # a batch: same timestamps, consecutive offsets
        out.append(MessageSpec("TopicBatch", f"batch body {j}".encode(), queue_id=j % 2, tags="batchTag",
                               keys=f"batch-{j}", properties={"WAIT": "true"}, uniq_key=uk(),
                               born_timestamp=batch_ts - 3, store_timestamp=batch_ts))
    for i in range(24, 40):
        out.append(MessageSpec("TopicTest", f"Hello RocketMQ {i}".encode(), queue_id=i % 4, tags="Tag" + "ABC"[i % 3],
                               keys=f"key-{i} order-{i % 5}", properties={"seq": str(i)}, uniq_key=uk()))
    assert all(m.magic in (None, MESSAGE_MAGIC_CODE) for m in out)
    return out


CONFIG = {
    "topics.json": '{"dataVersion":{"counter":3,"timestamp":1793491200000},"topicConfigTable":{'
                   '"TopicTest":{"order":false,"perm":6,"readQueueNums":4,"topicFilterType":"SINGLE_TAG",'
                   '"topicName":"TopicTest","topicSysFlag":0,"writeQueueNums":4}}}',
    "consumerOffset.json": '{"offsetTable":{"TopicTest@cg-test":{0:5,1:3,2:0,3:10},'
                           '"%RETRY%cg-test@cg-test":{0:0}}}',
    "delayOffset.json": '{"offsetTable":{3:1,18:0}}',
    "subscriptionGroup.json": '{"subscriptionGroupTable":{"cg-test":{"groupName":"cg-test",'
                              '"consumeEnable":true,"retryQueueNums":1}}}',
}


def messages_5x(clock: Clock) -> list[MessageSpec]:
    """A 5.x broker listening on IPv6 with ``enabledAppendPropCRC``: V2 magic, 56-char msg ids."""
    out = []
    for i in range(6):
        out.append(MessageSpec("TopicV6", f"five-x body {i}".encode(), queue_id=i % 2, tags="v6", keys=f"v6-{i}",
                               born_host="[fd00::2]:40001", uniq_key=make_uniq_key(V6, 4242, 7, clock.now, i),
                               record_crc=True))
    long_topic = "%RETRY%" + "g" * 123  # 130 UTF-16 units -> V2 magic, 2-byte topic length
    out.append(MessageSpec(long_topic, b"v2 record", tags="retry", keys="v2-key", reconsume_times=2,
                           born_host="[fd00::2]:40001", uniq_key=make_uniq_key(V6, 4242, 7, clock.now, 99),
                           record_crc=True))
    return out


def _write(dest: Path, specs: list[MessageSpec], clock: Clock, **kw) -> tuple[int, int]:
    """Write ``specs``; COMMIT/ROLLBACK records point at the preceding half message."""
    half = 0
    with StoreWriter(dest, commitlog_file_size=FILE_SIZE, cq_file_size=600, index_slots=500, index_entries=2000,
                     clock=clock, index_name_clock=lambda: T0, **kw) as w:
        for spec in specs:
            if spec.transaction in (TRANSACTION_COMMIT_TYPE, TRANSACTION_ROLLBACK_TYPE) and not \
                    spec.prepared_transaction_offset:
                spec.prepared_transaction_offset = half
            done = w.append(spec)
            if spec.topic == "RMQ_SYS_TRANS_HALF_TOPIC":
                half = done.offset
        w.sync()
        return w.last_store_timestamp, w.last_cq_timestamp


def build_5x(dest: Path) -> Path:
    """``fixtures/store-5x``: records a 5.1+/5.2+ broker on [2001:db8::1]:10911 writes."""
    if dest.exists():
        shutil.rmtree(dest)
    clock = Clock()
    last_ts, last_cq = _write(dest, messages_5x(clock), clock, store_host="[2001:db8::1]:10911")
    write_checkpoint(dest / "checkpoint", Checkpoint(last_ts, last_cq, 0, 0, 0), fsync=False)
    (dest / "lock").write_bytes(b"lock")
    (dest / "abort.bak").write_bytes(b"")  # a clean 5.x shutdown leaves an empty abort.bak
    return dest


def build(dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    clock = Clock()
    last_ts, last_cq = _write(dest, messages(clock), clock)
    write_checkpoint(dest / "checkpoint", Checkpoint(last_ts, last_cq, 0, 0, 0), fsync=False)
    (dest / "lock").write_bytes(b"lock")
    (dest / "config").mkdir()
    for name, text in CONFIG.items():
        (dest / "config" / name).write_text(text)
        (dest / "config" / (name + ".bak")).write_text(text)
    return dest


if __name__ == "__main__":
    for out in (build(REPO / "fixtures" / "store"), build_5x(REPO / "fixtures" / "store-5x")):
        print(f"wrote {out}")
