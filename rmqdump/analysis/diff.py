"""``diff``: where two stores differ (master and slave, before and after): the first divergence in the
commitlog with both records decoded, or where one ends and the other goes on; per consume queue its max
offsets and first differing entry; index files (headers); checkpoint fields; ``config/`` files.

Raw bytes are compared in big chunks first (one reused buffer per side); records and entries are decoded
only at the divergence. Both stores are opened read-only; nothing is written.
"""

from __future__ import annotations

import os
from pathlib import Path

from rmqdump.codec.layout import CQ_STORE_UNIT_SIZE, CQ_UNIT, MAX_RECORD_SIZE
from rmqdump.codec.record import Blank, Message
from rmqdump.disk.evidence import record_read
from rmqdump.disk.extents import data_extents
from rmqdump.disk.fileio import open_regular
from rmqdump.errors import RmqdumpError, StoreError
from rmqdump.store.commitlog import CommitLog, Walk
from rmqdump.store.root import Store

CHUNK = 8 << 20
_FINE = 4096  # the first differing byte is searched in blocks of this size, then byte by byte
MAX_CONFIG_PATHS = 20


class _Reader:
    """pread into a reused buffer; one open file at a time."""

    def __init__(self) -> None:
        self.buf = bytearray(CHUNK)
        self.path: Path | None = None
        self.fd: int | None = None

    def read(self, path: Path, pos: int, want: int) -> bytes | bytearray:
        """Up to ``want`` bytes at ``pos``: the reused buffer itself when it is filled (compared with
        ``==``, a memcmp: a memoryview compares element by element, 30 times slower), else a copy."""
        if path != self.path:
            self.close()
            self.fd = open_regular(path, follow=False)
            self.path = path
            record_read(path)  # --evidence manifest
        try:
            n = os.preadv(self.fd, [memoryview(self.buf)[:want]], pos)
        except OSError as e:
            raise StoreError(f"read failed: {e.strerror}", path, pos) from None
        return self.buf if n == len(self.buf) else bytes(memoryview(self.buf)[:n])

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
        self.fd = self.path = None


def first_difference(x: bytes | bytearray, y: bytes | bytearray) -> int | None:
    """Index of the first byte where ``x`` and ``y`` differ (a shorter one differs where it ends)."""
    if len(x) == len(y) and x == y:
        return None
    n = min(len(x), len(y))
    lo = 0
    while lo < n:
        hi = min(n, lo + _FINE)
        if x[lo:hi] != y[lo:hi]:
            return next(i for i in range(lo, hi) if x[i] != y[i])
        lo = hi
    return n


def diff_stores(path_a: str | os.PathLike, path_b: str | os.PathLike, *, use_mmap: bool = True,
                max_record_size: int = MAX_RECORD_SIZE) -> dict:
    """The difference document of two stores (``identical`` True when none is found)."""
    a, b = Store.open(path_a), Store.open(path_b)
    doc: dict = {"a": str(a.root or a.commitlog.location), "b": str(b.root or b.commitlog.location),
                 "commitlog": diff_commitlogs(a.commitlog, b.commitlog, use_mmap=use_mmap,
                                              max_record_size=max_record_size)}
    if a.root is not None and b.root is not None:
        doc["consume_queues"] = diff_queues(a.root, b.root)
        doc["index"] = _diff_index(a.root, b.root)
        doc["checkpoint"] = _diff_checkpoint(a.root, b.root)
        doc["config"] = _diff_config(a.root, b.root)
    cl = doc["commitlog"]
    count = (bool(cl["first_divergence"]) + len(cl["notes"]) + len(doc.get("consume_queues", {}).get("queues", []))
             + len(doc.get("index", [])) + bool(doc.get("checkpoint")) + len(doc.get("config", [])))
    doc["differences"] = count
    doc["identical"] = count == 0
    return doc


# --- commitlog -------------------------------------------------------------------------------------


def diff_commitlogs(a: CommitLog, b: CommitLog, *, use_mmap: bool = True,
                    max_record_size: int = MAX_RECORD_SIZE) -> dict:
    """Compare the bytes both commitlogs hold up to the shorter one's end; decode at the first difference."""
    end_a, why_a = data_end(a, use_mmap, max_record_size)
    end_b, why_b = data_end(b, use_mmap, max_record_size)
    out: dict = {"a": {"min_offset": a.min_offset, "end": end_a, "end_reason": why_a},
                 "b": {"min_offset": b.min_offset, "end": end_b, "end_reason": why_b},
                 "first_divergence": None, "notes": []}
    if a.min_offset != b.min_offset:
        out["notes"].append(f"A starts at {a.min_offset}, B at {b.min_offset} (older segments deleted on one side); "
                            f"compared from {max(a.min_offset, b.min_offset)}")
    lo, hi = max(a.min_offset, b.min_offset), min(end_a, end_b)
    at = _first_divergent_offset(a, b, lo, hi)
    if at is not None:
        out["first_divergence"] = _divergence(a, b, at, use_mmap, max_record_size)
    elif end_a != end_b:
        longer, shorter = ("A", "B") if end_a > end_b else ("B", "A")
        out["notes"].append(f"{longer} continues past {shorter}'s end at {hi} (to {max(end_a, end_b)}; "
                            f"{abs(end_a - end_b)} bytes more); the bytes both hold are identical")
    return out


def data_end(cl: CommitLog, use_mmap: bool = True, max_record_size: int = MAX_RECORD_SIZE) -> tuple[int, str]:
    """(end of valid data, why it ends there): the TOTALSIZE walk (no CRC) of the last segment holding data,
    on the compiled path for big segments (:func:`~rmqdump.analysis.fingerprint.segment_extent`)."""
    from rmqdump.analysis.fingerprint import segment_extent

    for i in range(len(cl.segments) - 1, -1, -1):
        seg = cl.segments[i]
        if seg.size == 0:
            continue
        with seg.open(use_mmap) as r:
            head = r.read(0, 8)
        if any(head) or i == 0:
            ext = segment_extent(cl, i, use_mmap=use_mmap, max_record_size=max_record_size)
            if ext["end"] == "blank":
                return seg.end, "blank: the last segment holding data is full"
            pos = ext["end_pos"] if ext["used"] is None else ext["used"]
            return seg.start + min(pos, seg.size), f"{ext['end']} at {seg.start + ext['end_pos']}"
    return cl.min_offset, "no data"


def _first_divergent_offset(a: CommitLog, b: CommitLog, lo: int, hi: int) -> int | None:
    ra, rb = _Reader(), _Reader()
    try:
        pos = lo
        while pos < hi:
            sa, sb = a.segment_for(pos), b.segment_for(pos)
            if sa is None or sb is None:
                return pos
            want = min(hi, sa.start + sa.size, sb.start + sb.size, pos + CHUNK) - pos
            x = ra.read(sa.path, pos - sa.start, want)
            y = rb.read(sb.path, pos - sb.start, want)
            i = first_difference(x, y)
            if i is not None:
                return pos + i
            if len(x) < want:  # both files end early (shorter than the geometry): nothing more to compare
                return pos + len(x) if pos + len(x) < hi else None
            pos += want
        return None
    finally:
        ra.close()
        rb.close()


def _record_start(cl: CommitLog, offset: int, use_mmap: bool, max_record_size: int) -> tuple[int, str | None]:
    """Start of the record holding ``offset`` in ``cl`` (walked from its segment's start), or where that
    walk stopped before it (with why)."""
    from rmqdump.fast.engine import use_fast

    seg = cl.segment_for(offset)
    if seg is None:
        return offset, "outside every segment"
    if use_fast(seg.size):
        return _record_start_fast(seg, offset, max_record_size)
    walk = Walk(cl, start=seg.start, end=offset + 1, check_crc=False, read_body=False, use_mmap=use_mmap,
                max_record_size=max_record_size)
    for rec in walk:
        if isinstance(rec, (Message, Blank)) and rec.offset <= offset < rec.offset + max(rec.size, 1):
            return rec.offset, None
    stop = walk.stop
    if stop is not None and stop.offset <= offset:
        return stop.offset, f"{stop.kind}: {stop.detail}"
    return offset, None


def _record_start_fast(seg, offset: int, max_record_size: int) -> tuple[int, str | None]:
    """:func:`_record_start` on the compiled walk's column batches (file_pos and size of each record)."""
    from rmqdump.fast.segment_walk import walk_segment_fast

    pos = offset - seg.start
    with walk_segment_fast(seg, 0, check_crc=False, end_offset=offset + 1, max_record_size=max_record_size) as w:
        for batch in w:
            starts = batch["file_pos"]
            i = int(starts.searchsorted(pos, side="right")) - 1
            if i >= 0 and pos < int(starts[i]) + int(batch["size"][i]):
                return seg.start + int(starts[i]), None
        stop = w.stop
    if stop.pos <= pos and stop.kind == "blank":
        return seg.start + stop.pos, None
    if stop.pos <= pos and stop.invalid is not None:
        return seg.start + stop.pos, f"{stop.invalid.kind}: {stop.invalid.detail}"
    return offset, None


def _divergence(a: CommitLog, b: CommitLog, at: int, use_mmap: bool, max_record_size: int) -> dict:
    start, why = _record_start(a, at, use_mmap, max_record_size)
    out = {"offset": at, "record_offset": start, "byte_in_record": at - start,
           "a": record_dict(a.decode_at(start, use_mmap=use_mmap, read_body=False, max_record_size=max_record_size)),
           "b": record_dict(b.decode_at(start, use_mmap=use_mmap, read_body=False, max_record_size=max_record_size))}
    if why:
        out["note"] = f"A's walk stops at {start} before the difference ({why})"
    return out


def record_dict(rec) -> dict:
    """A decoded record (or BLANK, or invalid verdict) as a small JSON-ready dict."""
    if isinstance(rec, Message):
        return {"kind": "message", "offset": rec.offset, "size": rec.size, "topic": rec.topic,
                "queue_id": rec.queue_id, "queue_offset": rec.queue_offset, "store_timestamp": rec.store_timestamp,
                "born_timestamp": rec.born_timestamp, "body_length": rec.body_length, "body_crc": rec.body_crc,
                "crc_ok": rec.crc_ok, "keys": rec.keys, "uniq_key": rec.uniq_key, "msg_id": rec.msg_id}
    if isinstance(rec, Blank):
        return {"kind": "blank", "offset": rec.offset, "size": rec.size}
    return {"kind": "invalid", "offset": rec.offset, "reason": rec.kind, "detail": rec.detail}


# --- consume queues --------------------------------------------------------------------------------


def diff_queues(root_a: Path, root_b: Path) -> dict:
    """Per queue (``consumequeue/TOPIC/QID``): only on one side, or max offsets and the first differing entry."""
    from rmqdump.store.consumequeue import discover_queues

    out: dict = {"queues": [], "errors": []}
    try:
        qa = {(r.topic, r.queue_id): r for r in discover_queues(root_a)}
        qb = {(r.topic, r.queue_id): r for r in discover_queues(root_b)}
    except RmqdumpError as e:
        out["errors"].append(str(e))
        return out
    readers = (_Reader(), _Reader())  # one buffer each for every queue (8 MiB, newly touched: not per queue)
    for key in sorted(qa.keys() | qb.keys()):
        name = {"topic": key[0], "queue_id": key[1]}
        if key not in qa or key not in qb:
            out["queues"].append({**name, "detail": f"queue only in {'A' if key in qa else 'B'}"})
            continue
        try:
            d = _diff_queue(qa[key].path, qb[key].path, readers)
        except RmqdumpError as e:
            out["errors"].append(str(e))
            continue
        if d is not None:
            out["queues"].append({**name, **d})
    return out


def _queue_range(path: Path) -> dict:
    from rmqdump.store.consumequeue import ConsumeQueue

    q = ConsumeQueue(path, strict=False)
    first = q.files[0].start // CQ_STORE_UNIT_SIZE if q.files else 0
    return {"first_offset": first, "max_offset": q.max_offset, "files": [f.path.name for f in q.files]}


def _diff_queue(pa: Path, pb: Path, readers: tuple[_Reader, _Reader] | None = None) -> dict | None:
    from rmqdump.store.consumequeue import list_mapped_files

    fa, _ = list_mapped_files(pa)
    fb, _ = list_mapped_files(pb)
    ma, mb = {f.start: f for f in fa}, {f.start: f for f in fb}
    first = None
    ra, rb = readers or (_Reader(), _Reader())
    try:
        for start in sorted(ma.keys() & mb.keys()):
            x, y = ma[start], mb[start]
            for lo, hi in _spans(x, y):
                pos = lo
                while pos < hi and first is None:
                    want = min(CHUNK - CHUNK % CQ_STORE_UNIT_SIZE, hi - pos)
                    u, v = ra.read(x.path, pos, want), rb.read(y.path, pos, want)
                    i = first_difference(u, v)
                    if i is not None:
                        i -= i % CQ_STORE_UNIT_SIZE
                        first = {"queue_offset": (start + pos + i) // CQ_STORE_UNIT_SIZE,
                                 "a": _unit(u, i), "b": _unit(v, i)}
                    pos += want
            if first is not None:
                break
    finally:
        ra.close()
        rb.close()
    only = sorted(ma.keys() ^ mb.keys())
    if first is None and not only:
        return None
    out: dict = {"a": _queue_range(pa), "b": _queue_range(pb), "first_difference": first}
    parts = []
    if out["a"]["max_offset"] != out["b"]["max_offset"]:
        parts.append(f"max offset {out['a']['max_offset']} vs {out['b']['max_offset']}")
    if first is not None:
        parts.append(f"first differing entry at queue offset {first['queue_offset']}")
    if only:
        parts.append("files only on one side: " + ", ".join(
            f"{(ma.get(s) or mb.get(s)).path.name} ({'A' if s in ma else 'B'})" for s in only[:10]))
    out["detail"] = "; ".join(parts)
    return out


def _spans(x, y) -> list[tuple[int, int]]:
    """Unit-aligned byte ranges where two same-named queue files may differ: where either may hold data
    (holes of both are zeros in both) and, when their sizes differ, from the shorter one's end."""
    unit = CQ_STORE_UNIT_SIZE
    spans = [] if x.size == y.size else [(min(x.size, y.size), max(x.size, y.size))]
    for f in (x, y):
        try:
            fd = open_regular(f.path, follow=False)
        except StoreError:
            return [(0, max(x.size, y.size))]
        try:
            spans += data_extents(fd, 0, f.size)
        finally:
            os.close(fd)
    out: list[tuple[int, int]] = []
    for lo, hi in sorted((lo - lo % unit, hi) for lo, hi in spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _unit(buf: bytes | bytearray, i: int) -> dict | None:
    if i + CQ_STORE_UNIT_SIZE > len(buf):
        return None
    off, size, tags = CQ_UNIT.unpack_from(buf, i)
    return {"commit_log_offset": off, "size": size, "tags_code": tags}


# --- index, checkpoint, config ---------------------------------------------------------------------


def _diff_index(root_a: Path, root_b: Path) -> list[dict]:
    from rmqdump.analysis.info import _index_files

    ia = {f["file"]: f for f in _index_files(root_a)}
    ib = {f["file"]: f for f in _index_files(root_b)}
    out = []
    for name in sorted(ia.keys() | ib.keys()):
        x, y = ia.get(name), ib.get(name)
        if x is None or y is None:
            out.append({"file": name, "detail": f"only in {'A' if y is None else 'B'}", "a": x, "b": y})
        elif x != y:
            keys = sorted(k for k in x.keys() | y.keys() if x.get(k) != y.get(k))
            out.append({"file": name, "detail": "header differs: " + ", ".join(
                f"{k} {x.get(k)} vs {y.get(k)}" for k in keys), "a": x, "b": y})
    return out


def _diff_checkpoint(root_a: Path, root_b: Path) -> dict:
    """Checkpoint fields that differ: ``{field: [a, b]}`` (empty when equal)."""
    from rmqdump.analysis.info import _checkpoint

    ca, cb = _checkpoint(root_a) or {}, _checkpoint(root_b) or {}
    return {k: [ca.get(k), cb.get(k)] for k in sorted(ca.keys() | cb.keys()) if ca.get(k) != cb.get(k)}


def _config_files(root: Path) -> dict[str, Path]:
    d = root / "config"
    try:
        return {e.name: Path(e.path) for e in os.scandir(d) if e.is_file(follow_symlinks=False)}
    except OSError:
        return {}


def _diff_config(root_a: Path, root_b: Path) -> list[dict]:
    """``config/`` files only on one side or with other bytes; for JSON, the differing key paths (never values)."""
    from rmqdump.store.config import parse_fastjson, read_config_bytes

    fa, fb = _config_files(root_a), _config_files(root_b)
    out = []
    for name in sorted(fa.keys() | fb.keys()):
        if name not in fa or name not in fb:
            out.append({"file": name, "detail": f"only in {'A' if name in fa else 'B'}"})
            continue
        try:
            x, y = read_config_bytes(fa[name]), read_config_bytes(fb[name])
        except RmqdumpError as e:
            out.append({"file": name, "detail": f"not compared: {e}"})
            continue
        if x == y:
            continue
        entry: dict = {"file": name, "detail": f"contents differ ({len(x or b'')} vs {len(y or b'')} bytes)"}
        try:
            paths = _json_paths(parse_fastjson(x or b"null", fa[name]), parse_fastjson(y or b"null", fb[name]))
            entry["paths"] = paths[:MAX_CONFIG_PATHS]
            entry["paths_total"] = len(paths)
        except RmqdumpError:
            pass
        out.append(entry)
    return out


def _json_paths(x, y, prefix: str = "") -> list[str]:
    """Key paths where two parsed JSON documents differ (``a.b.c``; a whole subtree once)."""
    if isinstance(x, dict) and isinstance(y, dict):
        out = []
        for k in sorted(x.keys() | y.keys(), key=str):
            p = f"{prefix}.{k}" if prefix else str(k)
            if k not in x or k not in y:
                out.append(p)
            elif x[k] != y[k]:
                out += _json_paths(x[k], y[k], p)
        return out
    return [] if x == y else [prefix or "(document)"]
