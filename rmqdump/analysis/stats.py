"""``rmqdump stats``: what is on this disk — counts and bytes by topic, queue, tag, host and hour.

One walk of the commitlog (resynchronising past damage, like ``scan --keep-going``) that
accumulates: totals; records/bytes per topic, per topic-queue, per topic-tag, per producer
host (born host without the ephemeral port) and per hour of store time (UTC); a histogram of
stored body sizes; the compressed share; the born-vs-store clock skew of producer writes;
system-topic kinds with their real destinations; and per segment the record and finding
counts. :func:`compute_stats` returns a JSON-ready document; :func:`stats_rows` flattens it
into uniform rows for CSV/JSONL.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import datetime, timezone

from rmqdump.broker.systopics import resolve
from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS
from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.codec.record import END_OF_DATA, Blank, Invalid, Message
from rmqdump.findings import ERROR, Finding
from rmqdump.store.commitlog import Skipped
from rmqdump.store.root import Store

#: Upper bounds (inclusive) of the body-size histogram buckets, in bytes of the stored body.
BODY_SIZE_EDGES = (0, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304)
#: Upper bounds (exclusive) of the clock-skew buckets (store time − born time), in ms.
SKEW_EDGES = (0, 1, 10, 100, 1000, 10_000, 60_000)
#: Columns of :func:`stats_rows`.
ROW_FIELDS = ("section", "topic", "queue_id", "key", "records", "bytes", "body_bytes", "value")


def _size_label(n: int) -> str:
    for unit, div in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


#: Bucket labels: ``0``, then ``<=N`` (above the previous bound, up to N bytes), then ``>N``.
BODY_SIZE_LABELS = ["0"] + [f"<={_size_label(e)}" for e in BODY_SIZE_EDGES[1:]] + \
    [f">{_size_label(BODY_SIZE_EDGES[-1])}"]


def _skew_label(i: int) -> str:
    def h(ms: int) -> str:
        return f"{ms // 1000}s" if ms >= 1000 else f"{ms}ms"

    if i == 0:
        return "<0 (born after store)"
    if i == 1:
        return "0ms"
    if i < len(SKEW_EDGES):
        return f"{h(SKEW_EDGES[i - 1])}-{h(SKEW_EDGES[i] - 1 if SKEW_EDGES[i] < 1000 else SKEW_EDGES[i])}"
    return f">={h(SKEW_EDGES[-1])}"


SKEW_LABELS = [_skew_label(i) for i in range(len(SKEW_EDGES) + 1)]


def _bucket(edges: tuple[int, ...], v: int, inclusive: bool) -> int:
    for i, e in enumerate(edges):
        if (v <= e) if inclusive else (v < e):
            return i
    return len(edges)


def hour_of(ms: int) -> str:
    """Store-time hour bucket in UTC (``2026-11-21T21:00Z``); ``invalid`` when out of range."""
    try:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:00Z")
    except (OverflowError, OSError, ValueError):
        return "invalid"


def _host_ip(host: str) -> str:
    return host.rsplit(":", 1)[0] if ":" in host else host


class _Acc:
    __slots__ = ("records", "bytes", "body_bytes")

    def __init__(self):
        self.records = self.bytes = self.body_bytes = 0

    def add(self, size: int, body: int, records: int = 1) -> None:
        self.records += records
        self.bytes += size
        self.body_bytes += body

    def to_dict(self) -> dict:
        return {"records": self.records, "bytes": self.bytes, "body_bytes": self.body_bytes}


class _Stats:
    """The accumulators of one statistics walk: records one by one (:meth:`record`, the reference) or as the
    compiled walk's groups (:meth:`batch`)."""

    def __init__(self, cl, delay_levels_ms: list[int]):
        self.delay_levels_ms = delay_levels_ms
        self.total = _Acc()
        self.topics: dict[str, _Acc] = defaultdict(_Acc)
        self.queues: dict[tuple[str, int], _Acc] = defaultdict(_Acc)
        self.tags: dict[tuple[str, str | None], _Acc] = defaultdict(_Acc)
        self.hosts: dict[str, _Acc] = defaultdict(_Acc)
        self.hours: dict[str, _Acc] = defaultdict(_Acc)
        self.kinds: dict[tuple[str, str | None], _Acc] = defaultdict(_Acc)
        self.body_hist = [0] * (len(BODY_SIZE_EDGES) + 1)
        self.compression: dict[str, _Acc] = defaultdict(_Acc)
        self.skew_hist = [0] * (len(SKEW_EDGES) + 1)
        self.skew = {"records": 0, "min_ms": None, "max_ms": None, "sum": 0, "excluded": 0}
        self.segs = {s.name: {"file": s.name, "start": s.start, "size": s.size, "records": 0, "bytes": 0,
                              "blanks": 0, "findings": 0} for s in cl.segments}
        self.first_ts = self.last_ts = None
        self.blanks = 0

    def _file(self, rec: Message, size: int, blen: int, n: int = 1) -> dict:
        """``rec``'s values (one record, or ``n`` alike with these sums): the accumulators they key; the resolved
        kind."""
        topic = rec.topic
        self.total.add(size, blen, n)
        self.topics[topic].add(size, blen, n)
        self.queues[(topic, rec.queue_id)].add(size, blen, n)
        self.tags[(topic, rec.tags)].add(size, blen, n)
        self.hosts[_host_ip(rec.born_host)].add(size, blen, n)
        self.hours[hour_of(rec.store_timestamp)].add(size, blen, n)
        self.compression[rec.compression].add(size, blen, n)
        seg = self.segs.get(rec.file)
        if seg is not None:
            seg["records"] += n
            seg["bytes"] += size
        r = resolve(rec, self.delay_levels_ms)
        if r["kind"] != "normal":
            self.kinds[(r["kind"], r["real_topic"])].add(size, blen, n)
        return r

    def _times(self, lo: int, hi: int) -> None:
        self.first_ts = lo if self.first_ts is None else min(self.first_ts, lo)
        self.last_ts = hi if self.last_ts is None else max(self.last_ts, hi)

    def record(self, rec: Message) -> None:
        size, blen = rec.size, max(rec.body_length, 0)
        r = self._file(rec, size, blen)
        self.body_hist[_bucket(BODY_SIZE_EDGES, blen, True)] += 1
        ts = rec.store_timestamp
        self._times(ts, ts)
        skew = self.skew
        if r["kind"] == "normal" and not r["via"]:
            d = ts - rec.born_timestamp
            skew["records"] += 1
            skew["sum"] += d
            skew["min_ms"] = d if skew["min_ms"] is None else min(skew["min_ms"], d)
            skew["max_ms"] = d if skew["max_ms"] is None else max(skew["max_ms"], d)
            self.skew_hist[_bucket(SKEW_EDGES, d, False)] += 1
        else:
            skew["excluded"] += 1

    def blank(self, file: str) -> None:
        self.blanks += 1
        seg = self.segs.get(file)
        if seg is not None:
            seg["blanks"] += 1

    def batch(self, sb) -> None:
        """A :class:`rmqdump.fast.statswalk.StatsBatch`: its records in walk order are filed after its groups (the
        sums do not depend on the order)."""
        import numpy as np

        for g in sb.groups:
            self._file(g.rep, g.bytes, g.body_bytes, g.records)
        if sb.store_times.size:
            self._times(int(sb.store_times.min()), int(sb.store_times.max()))
            edges = np.asarray(BODY_SIZE_EDGES)
            for i, c in enumerate(np.bincount(np.searchsorted(edges, sb.body_lengths, side="left"),
                                              minlength=len(self.body_hist)).tolist()):
                self.body_hist[i] += c
            d = sb.skews
            skew = self.skew
            skew["excluded"] += int(sb.store_times.size - d.size)
            if d.size:
                lo, hi = int(d.min()), int(d.max())
                skew["records"] += int(d.size)
                skew["sum"] += sum(d.tolist())  # Python ints: a batch's sum may pass 2**63
                skew["min_ms"] = lo if skew["min_ms"] is None else min(skew["min_ms"], lo)
                skew["max_ms"] = hi if skew["max_ms"] is None else max(skew["max_ms"], hi)
                for i, c in enumerate(np.bincount(np.searchsorted(np.asarray(SKEW_EDGES), d, side="right"),
                                                  minlength=len(self.skew_hist)).tolist()):
                    self.skew_hist[i] += c
        for rec in sb.records:
            self.record(rec)


def compute_stats(path: str | os.PathLike, *, check_crc: bool = True, use_mmap: bool = True,
                  max_record_size: int = MAX_RECORD_SIZE, delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS,
                  progress: Callable[[int], None] | None = None) -> dict:
    """Walk the whole commitlog of ``path`` once and return the statistics document (the compiled walk of
    :mod:`rmqdump.fast.statswalk` where it runs; the pure walk takes over at damage)."""
    store = Store.open(path)
    cl = store.commitlog
    st = _Stats(cl, delay_levels_ms)
    findings: list[Finding] = list(cl.problems)
    start = cl.min_offset
    if use_mmap and cl.segments:
        from rmqdump.fast import statswalk

        if statswalk.applies(cl, use_mmap):
            start = None
            end_offset = cl.min_offset
            for item in statswalk.stats_batches(cl, check_crc=check_crc, max_record_size=max_record_size):
                if isinstance(item, statswalk.HandOver):
                    start = item.offset
                    break
                if isinstance(item, statswalk.FileEnd):
                    if item.stop.kind == "blank":
                        st.blank(item.segment.name)
                        end_offset = item.segment.start + item.segment.size
                    continue
                st.batch(item)
                end_offset = item.end_offset
                if progress is not None:
                    progress(end_offset - cl.min_offset)
            if start is None:
                last = cl.segments[-1]
                stop = Invalid(last.end, last.name, last.size, END_OF_DATA, "end of the last commitlog segment")
                return _document(store, cl, st, findings, stop, end_offset)
    walk = cl.walk(start=start, check_crc=check_crc, read_body=False, keep_going=True, use_mmap=use_mmap,
                   max_record_size=max_record_size)
    for n, rec in enumerate(walk):
        if progress is not None and n & 1023 == 0:
            progress(walk.end_offset - cl.min_offset)
        if isinstance(rec, Message):
            st.record(rec)
        elif isinstance(rec, Blank):
            st.blank(rec.file)
        elif isinstance(rec, Skipped):
            findings.append(Finding(ERROR, rec.reason.kind, rec.file, rec.start,
                                    f"damaged bytes [{rec.start}, {rec.end}) skipped: {rec.reason.detail}"))
    return _document(store, cl, st, findings, walk.stop, walk.end_offset)


def _document(store: Store, cl, st: _Stats, findings: list[Finding], stop, end_offset: int) -> dict:
    """The statistics document of a finished walk (``stop``: why it ended, ``end_offset``: after the last record)."""
    if stop is not None and stop.kind != END_OF_DATA:
        findings.append(Finding(ERROR, stop.kind, stop.file or None, stop.offset, stop.detail))
    segs = st.segs
    for f in findings:
        name = os.path.basename(f.file) if f.file else None
        if name in segs:
            segs[name]["findings"] += 1
    total, compression, skew, skew_hist = st.total, st.compression, st.skew, st.skew_hist
    comp_records = total.records - compression.get("none", _Acc()).records
    comp_body = total.body_bytes - compression.get("none", _Acc()).body_bytes
    doc = {
        "store": str(store.root or cl.location),
        "totals": {
            **total.to_dict(), "blanks": st.blanks, "topics": len(st.topics), "queues": len(st.queues),
            "first_store_time": st.first_ts, "last_store_time": st.last_ts,
            "min_offset": cl.min_offset, "end_offset": end_offset,
            "end_reason": f"{stop.kind}: {stop.detail}" if stop else "", "findings": len(findings),
        },
        "topics": [{"topic": t, **a.to_dict()} for t, a in sorted(st.topics.items())],
        "queues": [{"topic": t, "queue_id": q, **a.to_dict()} for (t, q), a in sorted(st.queues.items())],
        "tags": [{"topic": t, "tag": g, **a.to_dict()}
                 for (t, g), a in sorted(st.tags.items(), key=lambda kv: (kv[0][0], kv[0][1] is not None,
                                                                          kv[0][1] or ""))],
        "producer_hosts": [{"host": h, **a.to_dict()} for h, a in sorted(st.hosts.items())],
        "hours": [{"hour": h, **a.to_dict()} for h, a in sorted(st.hours.items())],
        "system_kinds": [{"kind": k, "real_topic": t, **a.to_dict()}
                         for (k, t), a in sorted(st.kinds.items(), key=lambda kv: (kv[0][0], kv[0][1] or ""))],
        "body_sizes": [{"bucket": lbl, "records": c} for lbl, c in zip(BODY_SIZE_LABELS, st.body_hist, strict=True)],
        "compression": {
            "compressed_records": comp_records,
            "compressed_share": round(comp_records / total.records, 4) if total.records else 0.0,
            "compressed_body_bytes": comp_body,
            "compressed_body_share": round(comp_body / total.body_bytes, 4) if total.body_bytes else 0.0,
            "by_type": [{"compression": c, **a.to_dict()} for c, a in sorted(compression.items())],
        },
        "clock_skew": {
            "records": skew["records"], "excluded": skew["excluded"],
            "min_ms": skew["min_ms"], "max_ms": skew["max_ms"],
            "mean_ms": round(skew["sum"] / skew["records"], 1) if skew["records"] else None,
            "born_after_store": skew_hist[0],
            "histogram": [{"bucket": lbl, "records": c} for lbl, c in zip(SKEW_LABELS, skew_hist, strict=True)],
        },
        "segments": list(segs.values()),
        "findings": [f.to_dict() for f in findings],
    }
    return doc


def has_errors(doc: dict) -> bool:
    """Whether the statistics walk met damage (exit status 1)."""
    return any(f["severity"] == ERROR for f in doc["findings"])


def stats_rows(doc: dict) -> Iterator[dict]:
    """The document as uniform rows (:data:`ROW_FIELDS`) for CSV and JSONL."""

    def row(section, topic=None, queue_id=None, key=None, records=None, bytes_=None, body_bytes=None, value=None):
        return {"section": section, "topic": topic, "queue_id": queue_id, "key": key, "records": records,
                "bytes": bytes_, "body_bytes": body_bytes, "value": value}

    t = doc["totals"]
    yield row("total", records=t["records"], bytes_=t["bytes"], body_bytes=t["body_bytes"])
    for k in ("blanks", "topics", "queues", "first_store_time", "last_store_time", "min_offset", "end_offset",
              "end_reason", "findings"):
        yield row("total", key=k, value=t[k])
    for e in doc["topics"]:
        yield row("topic", e["topic"], None, None, e["records"], e["bytes"], e["body_bytes"])
    for e in doc["queues"]:
        yield row("queue", e["topic"], e["queue_id"], None, e["records"], e["bytes"], e["body_bytes"])
    for e in doc["tags"]:
        yield row("tag", e["topic"], None, e["tag"], e["records"], e["bytes"], e["body_bytes"])
    for e in doc["producer_hosts"]:
        yield row("producer_host", key=e["host"], records=e["records"], bytes_=e["bytes"], body_bytes=e["body_bytes"])
    for e in doc["hours"]:
        yield row("hour", key=e["hour"], records=e["records"], bytes_=e["bytes"], body_bytes=e["body_bytes"])
    for e in doc["system_kinds"]:
        yield row("system_kind", e["real_topic"], None, e["kind"], e["records"], e["bytes"], e["body_bytes"])
    for e in doc["body_sizes"]:
        yield row("body_size", key=e["bucket"], records=e["records"])
    c = doc["compression"]
    for e in c["by_type"]:
        yield row("compression", key=e["compression"], records=e["records"], bytes_=e["bytes"],
                  body_bytes=e["body_bytes"])
    for k in ("compressed_share", "compressed_body_share"):
        yield row("compression", key=k, value=c[k])
    s = doc["clock_skew"]
    for k in ("records", "excluded", "min_ms", "max_ms", "mean_ms", "born_after_store"):
        yield row("clock_skew", key=k, value=s[k])
    for e in s["histogram"]:
        yield row("clock_skew_histogram", key=e["bucket"], records=e["records"])
    for e in doc["segments"]:
        yield row("segment", key=e["file"], records=e["records"], bytes_=e["bytes"], value=e["findings"])
    for f in doc["findings"]:
        yield row("finding", key=f["kind"], value=f"{f['severity']}: {f['file'] or ''}"
                  f"{'@' + str(f['offset']) if f['offset'] is not None else ''}: {f['detail']}")
