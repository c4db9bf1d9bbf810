"""The scenario matrix: what RocketMQ writes (bases) and the damage applied to copies (variants).

Every store here is written by RocketMQ's own ``DefaultMessageStore`` (4.9.8 or 5.3.3); damage is a few
bytes changed afterwards, and RocketMQ's own ``load()`` says what it makes of the result. The names are
stable (they are the pytest ids); the content of a store is not (timestamps and UNIQ_KEYs are fresh),
so every check compares rmqdump with RocketMQ's manifest of the same bytes.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable

from .harness import Base, Built, Mutation, segment_name

# --- geometries ----------------------------------------------------------------------------------------

GEOMETRIES = {
    # many segment rolls and blanks, 3 entries per CQ file, index files that fill up (16 entries)
    "small": {"mappedFileSizeCommitLog": 4096, "mappedFileSizeConsumeQueue": 60, "maxHashSlotNum": 8,
              "maxIndexNum": 16},
    # everything in one segment, one CQ file per queue (16 entries), one index file
    "mid": {"mappedFileSizeCommitLog": 65536, "mappedFileSizeConsumeQueue": 320, "maxHashSlotNum": 64,
            "maxIndexNum": 256},
}

LONG127 = "T" * 127
LONG134 = "L" * 134


def _m(topic: str, **kw) -> dict:
    return {"topic": topic, **kw}


def mix_plain() -> list[dict]:
    out = []
    for i in range(12):
        out.append(_m("TopicA", queueId=i % 4, tags=f"Tag{'ABC'[i % 3]}", keys=[f"key-{i}", f"order-{i % 5}"],
                      properties={"seq": str(i)}, body=f"hello {i} " * (1 + i % 4)))
    out += [
        _m("主题-ü", tags="标签", keys="键-ключ-🔑 second-key", properties={"用户": "值 value ✓"}, body="unicode ✓"),
        _m("TopicA", queueId=1, body=""),
        _m("TopicA", queueId=2, keys="k1  k2   k3", body="runs of spaces"),
        _m("TopicBin", body_b64=base64.b64encode(bytes(range(256))).decode()),
        _m("TopicBig", body="B" * 1500),
        _m("%RETRY%cg-test", keys="retry-1", body="retry", properties={"RETRY_TOPIC": "TopicA"}, reconsumeTimes=2),
        _m("%DLQ%cg-test", keys="dlq-1", body="dead letter", reconsumeTimes=16),
        _m(LONG127, keys="long-127", body="127-char topic"),
        _m("TopicNoKeys", body="no keys, no tags"),
        _m("TopicFlag", flag=7, body="flagged"),
    ]
    return out


def mix_hosts() -> list[dict]:
    hosts = ["10.1.2.3:40000", "[2001:db8::7]:40001", "[::1]:5555", "192.168.0.9:10911"]
    return [_m("TopicHost", queueId=i % 2, keys=f"h-{i}", body=f"host {i}", bornHost=b, storeHost=s)
            for i, (b, s) in enumerate((b, s) for b in hosts for s in ["127.0.0.1:10911", "[2001:db8::1]:10911"])]


def mix_compress() -> list[dict]:
    body = "compress me " * 60
    return [_m("TopicZip", queueId=i % 2, keys=f"z-{c}-{i}", compression=c, body=f"{i} {body}")
            for i, c in enumerate(["zlib", "lz4", "zstd", "zlib", "lz4", "zstd"])]


def mix_tx_old() -> list[dict]:
    out = []
    for i, end in enumerate(["commit", "rollback", "commit", None]):
        out.append(_m("TopicOldTx", queueId=i % 2, transaction="prepared", uniqKey=f"OTX{i}", keys=f"otx-{i}",
                      body=f"prepared {i}"))
        out.append(_m("TopicOldTx", queueId=0, body=f"between {i}"))
        if end:
            out.append(_m("TopicOldTx", queueId=i % 2, transaction=end, uniqKey=f"OTX{i}", keys=f"otx-{i}",
                          body=f"prepared {i}"))
    return out


def mix_tx_broker() -> list[dict]:
    out = []
    for i in range(3):
        out.append(_m("TopicTx", queueId=i % 2, transaction="half", uniqKey=f"HTX{i}", keys=f"order-{i}",
                      body=f"half {i}"))
    out.append({"type": "wait_dispatch"})
    for i in (0, 2):
        out.append(_m("TopicTx", transaction="commit", uniqKey=f"HTX{i}", body=f"half {i}"))
    return out


def mix_delay() -> list[dict]:
    return [_m("TopicDelay", queueId=i % 2, delayLevel=lvl, keys=f"d-{lvl}", body=f"delay {lvl}")
            for i, lvl in enumerate([1, 3, 18, 2])]


def mix_batch(version: str) -> list[dict]:
    out = [_m("TopicBatch", queueId=0, batch=[{"body": f"b{i}", "keys": f"bk{i}", "tags": "bt"} for i in range(5)]),
           _m("TopicBatch", queueId=1, batch=[{"body": f"c{i}"} for i in range(3)])]
    if version == "533":
        out.append(_m("TopicBatch", queueId=1, batchUniqKey=False, batch=[{"body": "old-client", "keys": "oc"}]))
    return out


def mix_lmq() -> list[dict]:
    out = [_m("MqttTopic", queueId=0, body="before")]
    for i in range(4):
        rooms = ",".join(f"%LMQ%room{r}" for r in range(1 + i % 3))
        out.append(_m("MqttTopic", queueId=0, keys=f"mq-{i}", properties={"INNER_MULTI_DISPATCH": rooms},
                      body=f"mqtt {i}"))
    return out


def mix_bcq() -> list[dict]:
    return [
        _m("BCQ", queueId=0, batch=[{"body": f"i{i}", "keys": f"ik{i}"} for i in range(5)]),
        _m("BCQ", queueId=1, batch=[{"body": f"j{i}"} for i in range(3)]),
        _m("BCQ", queueId=0, body="plain in a batch topic"),
        _m("BCQ", queueId=0, batch=[{"body": f"k{i}"} for i in range(7)]),
    ]


def mix_v2() -> list[dict]:
    return [_m(LONG134, keys="v2-a", body="V2 record"), _m("L" * 200, queueId=1, keys="v2-b", body="another"),
            _m(LONG127, keys="v1-127", body="still V1")]


def mix_timer() -> list[dict]:
    """5.x timer messages (long delays: still in the timer store, rmq_sys_wheel_timer) among plain ones."""
    out = [_m("TopicPre", queueId=i % 2, keys=f"pre-{i}", body=f"before timer {i}") for i in range(4)]
    out += [_m("TimerT", timerDelaySec=3600 + i, keys=f"tk-{i}", body=f"in an hour {i}") for i in range(3)]
    out += [_m("TimerT", timerDelayMs=7_200_000, keys="tk-ms", body="in two hours")]
    return out + [_m("TopicPost", keys=f"post-{i}", body=f"after timer {i}") for i in range(3)]


def mix_everything(version: str) -> list[dict]:
    out = mix_plain() + mix_hosts() + mix_compress() + mix_tx_old() + mix_tx_broker() + mix_delay() + mix_batch(version)
    if version == "533":
        out += mix_bcq() + mix_v2()
    return out + [_m("TopicTail", queueId=i % 2, keys=f"tail-{i}", body=f"tail {i}") for i in range(6)]


MIXES: dict[str, Callable[[str], list[dict]]] = {
    "plain": lambda v: mix_plain(),
    "hosts": lambda v: mix_hosts(),
    "compress": lambda v: mix_compress(),
    "txold": lambda v: mix_tx_old(),
    "txbroker": lambda v: mix_tx_broker(),
    "delay": lambda v: mix_delay(),
    "batch": mix_batch,
    "everything": mix_everything,
}
VERSION_MIXES = {"498": {"lmq": lambda v: mix_lmq()}, "533": {"bcq": lambda v: mix_bcq(), "v2": lambda v: mix_v2()}}
#: mixes built in the mid geometry only (the timer wheel file is 38 MB whatever the settings)
EXTRA_MIXES = {"533": {"timer": lambda v: mix_timer()}}
TIMER_SETTINGS = {"timerWheelEnable": True, "timerPrecisionMs": 1000, "mappedFileSizeTimerLog": 3328}
#: RocketMQ's own retention deletes every commitlog file but the last (and the consume-queue and index files
#: below the new first offset) once its clean service runs: 60 s after start, then every 200 ms
RETENTION_SETTINGS = {"fileReservedTime": 0, "deleteWhen": ";".join(f"{h:02d}" for h in range(24)),
                      "cleanResourceInterval": 200}


def mix_retention(version: str) -> list[dict]:
    """The plain mix, a wait past the first clean-up, the plain mix again: the same keys in expired records (in
    the index, pointing into deleted files) and in kept ones."""
    return [*mix_plain(), {"type": "wait_dispatch"}, {"type": "sleep", "ms": 63000}, *mix_plain()]


#: built in the small geometry only (many files to delete), ending clean and crashed
RETENTION_MIXES = {"retention": mix_retention}


def settings(version: str, geometry: str, mix: str) -> dict:
    s = {"type": "settings", **GEOMETRIES[geometry]}
    if version == "533":
        s["mapperFileSizeBatchConsumeQueue"] = 46 * 16
        if mix in ("bcq", "everything"):
            s["topics"] = {"BCQ": {"queues": 2, "batchCQ": True}}
    if mix == "lmq":
        s.update(enableMultiDispatch=True, enableLmq=True)
    if mix == "timer":
        s.update(TIMER_SETTINGS)
    if mix in RETENTION_MIXES:
        s.update(RETENTION_SETTINGS)
    return s


def base(version: str, geometry: str, mix: str, ending: str = "clean", extra: dict | None = None) -> Base:
    messages = {**MIXES, **VERSION_MIXES[version], **EXTRA_MIXES.get(version, {}), **RETENTION_MIXES}[mix](version)
    st = {**settings(version, geometry, mix), **(extra or {})}
    flags = {"clean": (), "crash": ("--crash",), "crash-no-dispatch": ("--crash-no-dispatch",)}[ending]
    suffix = "" if not extra else "-" + "-".join(f"{k}" for k in extra)
    name = f"{version}-{geometry}-{mix}{suffix}-{ending}"
    return Base(name, version, tuple(json.dumps(x, ensure_ascii=False) for x in [st, *messages]), flags)


def all_bases() -> list[Base]:
    out = []
    for version in ("498", "533"):
        mixes = [*MIXES, *VERSION_MIXES[version]]
        for geometry in GEOMETRIES:
            for mix in mixes:
                out.append(base(version, geometry, mix))
            out.append(base(version, geometry, "everything", "crash"))
            out.append(base(version, geometry, "everything", "crash-no-dispatch"))
        if version == "533":
            out.append(base(version, "mid", "everything", extra={"enabledAppendPropCRC": True}))
        for mix in EXTRA_MIXES.get(version, {}):
            out.append(base(version, "mid", mix))
            out.append(base(version, "mid", mix, "crash"))
        for mix in RETENTION_MIXES:
            out.append(base(version, "small", mix))
            out.append(base(version, "small", mix, "crash"))
    return out


# --- damage --------------------------------------------------------------------------------------------

def _seg_size(b: Built) -> int:
    return int(b.settings["mappedFileSizeCommitLog"])


def _cl_path(b: Built, offset: int) -> str:
    return f"commitlog/{segment_name(offset, _seg_size(b))}"


def _body_pos(m: dict) -> int:
    """File position of the record's body (layout: ... body, topic len + topic, props len + props)."""
    tlen = 2 if m["magicCode"] == "0xDAA320AB" else 1
    return m["filePos"] + m["storeSize"] - 2 - m["propertiesLength"] - tlen - m["topicLength"] - m["bodyLength"]


def _last_segment_msgs(b: Built) -> list[dict]:
    msgs = b.of("message")
    if not msgs:
        return []
    last = msgs[-1]["file"]
    return [m for m in msgs if m["file"] == last]


def dmg_torn_tail(b: Built) -> list[Mutation] | None:
    msgs = b.of("message")
    if not msgs:
        return None
    m = msgs[-1]
    return [{"op": "zero", "path": _cl_path(b, m["commitLogOffset"]), "offset": m["filePos"] + 40,
             "length": m["storeSize"] - 40}, {"op": "touch", "path": "abort"}]


def dmg_flip_body_mid(b: Built) -> list[Mutation] | None:
    cands = [m for m in _last_segment_msgs(b) if m["bodyLength"] > 0]
    if len(cands) < 3:
        return None
    m = cands[len(cands) // 2]
    return [{"op": "flip", "path": _cl_path(b, m["commitLogOffset"]), "offset": _body_pos(m), "bit": 0}]


def dmg_flip_body_first_file(b: Built) -> list[Mutation] | None:
    msgs = b.of("message")
    files = sorted({m["file"] for m in msgs})
    if len(files) < 5:
        return None
    cands = [m for m in msgs if m["file"] == files[0] and m["bodyLength"] > 0]
    m = cands[len(cands) // 2]
    return [{"op": "flip", "path": _cl_path(b, m["commitLogOffset"]), "offset": _body_pos(m), "bit": 3}]


def dmg_truncate_segment(b: Built) -> list[Mutation] | None:
    msgs = b.of("message")
    if not msgs:
        return None
    m = msgs[-1]
    return [{"op": "truncate", "path": _cl_path(b, m["commitLogOffset"]), "size": m["filePos"] + m["storeSize"] // 2}]


def dmg_totalsize_mid(b: Built) -> list[Mutation] | None:
    cands = _last_segment_msgs(b)
    if len(cands) < 3:
        return None
    m = cands[len(cands) // 2]
    return [{"op": "flip", "path": _cl_path(b, m["commitLogOffset"]), "offset": m["filePos"] + 1, "bit": 4}]


def dmg_magic_mid(b: Built) -> list[Mutation] | None:
    cands = _last_segment_msgs(b)
    if len(cands) < 3:
        return None
    m = cands[len(cands) // 3]
    return [{"op": "write", "path": _cl_path(b, m["commitLogOffset"]), "offset": m["filePos"] + 4,
             "hex": "deadbeef"}]


def dmg_props_tail(b: Built) -> list[Mutation] | None:
    msgs = [m for m in b.of("message") if m["propertiesLength"] >= 40]
    if not msgs:
        return None
    m = msgs[-1]
    return [{"op": "zero", "path": _cl_path(b, m["commitLogOffset"]),
             "offset": m["filePos"] + m["storeSize"] - m["propertiesLength"] // 2, "length": m["propertiesLength"] // 2},
            {"op": "touch", "path": "abort"}]


def dmg_blank_at_end(b: Built) -> list[Mutation] | None:
    """An end-of-file BLANK written after the last record and no next file: a broker killed between writing
    the BLANK (the next message did not fit) and creating the next segment. RocketMQ ends there."""
    msgs = b.of("message")
    if not msgs:
        return None
    m = max(msgs, key=lambda m: m["commitLogOffset"])
    end = m["commitLogOffset"] + m["storeSize"]
    size = _seg_size(b)
    left = size - end % size
    if left < 8 or end % size == 0:
        return None
    later = sorted(p.name for p in (b.store / "commitlog").iterdir() if int(p.name) > end)
    return [{"op": "write", "path": _cl_path(b, end), "offset": end % size,
             "hex": left.to_bytes(4, "big").hex() + "cbd43194"},
            *({"op": "delete", "path": f"commitlog/{name}"} for name in later)]


def dmg_abort(b: Built) -> list[Mutation] | None:
    return [{"op": "touch", "path": "abort"}]


def dmg_zero_checkpoint(b: Built) -> list[Mutation] | None:
    return [{"op": "zero", "path": "checkpoint", "offset": 0, "length": 24}, {"op": "touch", "path": "abort"}]


def dmg_delete_cq_file(b: Built) -> list[Mutation] | None:
    entries = [m for m in b.of("cq_entry") if not m["topic"].startswith(("SCHEDULE", "RMQ_SYS", "%LMQ%"))]
    if not entries:
        return None
    per = int(b.settings["mappedFileSizeConsumeQueue"]) // 20
    e = max(entries, key=lambda m: (m["queueOffset"], m["topic"]))
    first = e["queueOffset"] // per * per * 20
    return [{"op": "delete", "path": f"consumequeue/{e['topic']}/{e['queueId']}/{first:020d}"}]


def dmg_delete_topic_cq(b: Built) -> list[Mutation] | None:
    topics = sorted({m["topic"] for m in b.of("cq_entry") if m["topic"].startswith("Topic")})
    return [{"op": "delete", "path": f"consumequeue/{topics[0]}"}] if topics else None


def dmg_delete_last_index(b: Built) -> list[Mutation] | None:
    files = sorted(p.name for p in (b.store / "index").iterdir()) if (b.store / "index").is_dir() else []
    return [{"op": "delete", "path": f"index/{files[-1]}"}, {"op": "touch", "path": "abort"}] if files else None


def dmg_zero_cq_tail(b: Built) -> list[Mutation] | None:
    """The last CQ unit of the busiest queue zeroed, as after a crash before its flush."""
    entries = [m for m in b.of("cq_entry") if m["topic"].startswith("Topic")]
    if not entries:
        return None
    per = int(b.settings["mappedFileSizeConsumeQueue"]) // 20
    e = max(entries, key=lambda m: (m["queueOffset"], m["topic"]))
    first = e["queueOffset"] // per * per
    return [{"op": "zero", "path": f"consumequeue/{e['topic']}/{e['queueId']}/{first * 20:020d}",
             "offset": (e["queueOffset"] - first) * 20, "length": 20}, {"op": "touch", "path": "abort"}]


def dmg_zero_cq_queue(b: Built) -> list[Mutation] | None:
    """A queue of an ordinary topic whose first file exists all zero and receives no record (seen in a crashed
    RocketMQ store: the file created, its first unit never written). ``truncateDirtyLogicFiles`` keeps that
    unit when the consume queues reach the commitlog's end."""
    entries = [m for m in b.of("cq_entry") if m["topic"].startswith("Topic")]
    if not entries:
        return None
    topic = min(m["topic"] for m in entries)
    qid = max(m["queueId"] for m in b.of("message") if m["topic"] == topic) + 1
    path = f"consumequeue/{topic}/{qid}/{0:020d}"
    return [{"op": "touch", "path": path},
            {"op": "truncate", "path": path, "size": int(b.settings["mappedFileSizeConsumeQueue"])}]


DAMAGES: dict[str, Callable[[Built], list[Mutation] | None]] = {
    "torn-tail": dmg_torn_tail,
    "flip-body-mid": dmg_flip_body_mid,
    "flip-body-first-file": dmg_flip_body_first_file,
    "truncate-segment": dmg_truncate_segment,
    "totalsize-mid": dmg_totalsize_mid,
    "magic-mid": dmg_magic_mid,
    "props-tail": dmg_props_tail,
    "blank-at-end": dmg_blank_at_end,
    "abort": dmg_abort,
    "zero-checkpoint": dmg_zero_checkpoint,
    "delete-cq-file": dmg_delete_cq_file,
    "delete-topic-cq": dmg_delete_topic_cq,
    "delete-last-index": dmg_delete_last_index,
    "zero-cq-tail": dmg_zero_cq_tail,
    "zero-cq-queue": dmg_zero_cq_queue,
}

#: damage applied to every clean base; the full list to the "everything" bases
COMMON_DAMAGES = ("torn-tail", "flip-body-mid", "abort", "delete-cq-file")


#: damage that cannot apply to a base's shape: a first file only the small geometry rolls past, and
#: consume queues of ordinary topics (the delay and BatchCQ mixes have none)
NOT_APPLICABLE = {"flip-body-first-file": ("-mid-",), "delete-cq-file": ("-delay-", "-bcq-"),
                  "delete-topic-cq": ("-delay-", "-bcq-")}


def variants_for(b: Base) -> list[str]:
    if "-everything-" in b.name and "propcrc" not in b.name.lower():
        names = list(DAMAGES)
    elif b.flags:
        return []
    else:
        names = list(COMMON_DAMAGES)
    return [d for d in names if not any(part in b.name for part in NOT_APPLICABLE.get(d, ()))]
