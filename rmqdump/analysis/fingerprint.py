"""``fingerprint``: a digest per commitlog segment and per consume-queue file, to compare replicas without
copying data; :func:`compare_fingerprints` says where two fingerprints differ.

What a digest covers (so two replicas holding the same records match, whatever their file sizes or
pre-allocated tails):

- a **commitlog segment**: its bytes in use, ``[0, used)``: up to the end of the last record the TOTALSIZE
  walk (no CRC, as the broker's dispatcher) accepts; a segment closed by an end-of-file BLANK counts the
  BLANK's 8-byte header (TOTALSIZE and magic), not its filler. A segment whose walk stops on damage counts
  every byte up to its last non-zero byte (the damage and what follows it are compared too).
- a **consume-queue file**: its units up to the last unit that is not all zero (trailing zero units are
  unwritten space), so a queue's pre-allocated tail does not count.
- index files, the checkpoint and ``config/*.json``: summary fields (index headers, checkpoint fields) and
  a digest of each config file's bytes: those differ between hosts by design (each builds its own index,
  writes its own checkpoint), so they are compared as metadata, apart from the data.

Files are read with ``pread`` in bounded chunks (a whole range into one reused buffer of :data:`CHUNK` bytes; a
trimmed file only where it holds non-zero bytes, its holes not at all): bounded memory on any store.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rmqdump.codec.layout import BCQ_STORE_UNIT_SIZE, CQ_STORE_UNIT_SIZE, END_FILE_MIN_BLANK_LENGTH, MAX_RECORD_SIZE
from rmqdump.codec.record import END_OF_DATA, Blank
from rmqdump.disk.evidence import record_read
from rmqdump.disk.extents import nonzero_chunks, nonzero_end
from rmqdump.disk.fileio import open_regular
from rmqdump.errors import RmqdumpError, StoreError
from rmqdump.store.commitlog import CommitLog, Walk

FINGERPRINT_VERSION = 1
ALGORITHM = "blake2b-256"
CHUNK = 8 << 20
#: kinds of a difference: data (records and queue entries) or metadata (index, checkpoint, config)
DATA_PARTS = ("commitlog", "consumequeue", "batchconsumequeue")


class _Hasher:
    """One reused read buffer; digests of whole ranges or of a file up to its last non-zero byte."""

    def __init__(self, chunk: int = CHUNK) -> None:
        self.buf = bytearray(chunk)
        self.view = memoryview(self.buf)

    def _read(self, fd: int, pos: int, want: int, path: Path) -> memoryview:
        try:
            n = os.preadv(fd, [self.view[:want]], pos)
        except OSError as e:
            raise StoreError(f"read failed: {e.strerror}", path, pos) from None
        return self.view[:n]

    def exact(self, path: Path, length: int) -> str:
        """Digest of ``[0, length)`` of ``path`` (a shorter file is hashed as far as it goes)."""
        h = hashlib.blake2b(digest_size=32)
        fd = _open(path)
        try:
            pos = 0
            while pos < length:
                got = self._read(fd, pos, min(len(self.buf), length - pos), path)
                if not got:
                    break
                h.update(got)
                pos += len(got)
        finally:
            os.close(fd)
        return h.hexdigest()

    def trimmed(self, path: Path, limit: int, align: int = 1) -> tuple[str, int]:
        """(digest, length) of ``path`` up to its last non-zero byte within ``limit``, rounded up to a
        multiple of ``align`` (trailing zeros are unwritten space). Only the chunks holding non-zero bytes are
        read (:func:`~rmqdump.disk.extents.nonzero_chunks`: holes of a sparse file are not); the zeros between
        them are hashed as zeros."""
        h = hashlib.blake2b(digest_size=32)
        fd = _open(path)
        done = 0  # bytes hashed: [0, done)
        try:
            end = min(limit, os.fstat(fd).st_size)
            for pos, data in nonzero_chunks(fd, 0, end):
                done += _zeros(h, pos - done)
                keep = nonzero_end(data)
                h.update(memoryview(data)[:keep])
                done += keep
        except OSError as e:
            raise StoreError(f"read failed: {e.strerror}", path) from None
        finally:
            os.close(fd)
        done += _zeros(h, min(end - done, -done % align))
        return h.hexdigest(), done


_ZERO = bytes(1 << 20)


def _zeros(h, n: int) -> int:
    left = n
    while left:
        step = min(left, len(_ZERO))
        h.update(_ZERO[:step])
        left -= step
    return n


def _open(path: Path) -> int:
    fd = open_regular(path, follow=False)
    record_read(path)  # --evidence manifest
    return fd


def segment_extent(cl: CommitLog, index: int, *, use_mmap: bool = True,
                   max_record_size: int = MAX_RECORD_SIZE) -> dict:
    """How far segment ``index`` is in use: ``used`` (bytes, None when the walk stopped on damage), its
    ``records`` and ``end`` (``blank``, ``end``, ``end_of_data`` or the damage kind) and ``end_pos``."""
    from rmqdump.fast.engine import use_fast

    seg = cl.segments[index]
    if use_fast(seg.size):
        from rmqdump.fast.segment_jobs import summarize_segment

        s = summarize_segment(seg, check_crc=False, max_record_size=max_record_size)
        kind, pos, records, end_pos = s.stop, s.stop_pos, s.records, s.end_pos
    else:
        walk = Walk(cl, start=seg.start, end=seg.end, check_crc=False, read_body=False, use_mmap=use_mmap,
                    max_record_size=max_record_size)
        blank = None
        for rec in walk:
            if isinstance(rec, Blank):
                blank = rec
        records, end_pos = walk.records, walk.end_offset - seg.start
        if blank is not None:
            kind, pos = "blank", blank.file_pos
        else:
            stop = walk.stop
            pos = stop.offset - seg.start if stop is not None else end_pos
            kind = "end" if stop is None or pos >= seg.size else stop.kind
    if kind == "blank":
        used: int | None = pos + END_FILE_MIN_BLANK_LENGTH
    elif kind in ("end", "limit", END_OF_DATA):
        used = end_pos
    else:
        used = None
    return {"used": used, "records": records, "end": kind, "end_pos": pos}


def fingerprint_store(path: str | os.PathLike, *, use_mmap: bool = True, max_record_size: int = MAX_RECORD_SIZE,
                      progress=None, version: str | None = None, jobs: int | None = None) -> dict:
    """The fingerprint document of a store (root, ``commitlog/`` or one segment); see the module doc.
    ``version``: rmqdump's, recorded in the document; ``jobs``: segments hashed at once (default: the CPUs)."""
    from rmqdump.store.root import Store

    store = Store.open(path)
    cl = store.commitlog
    local = threading.local()

    def one(i: int) -> dict:
        hasher = getattr(local, "hasher", None) or _Hasher()
        local.hasher = hasher
        seg = cl.segments[i]
        ext = segment_extent(cl, i, use_mmap=use_mmap, max_record_size=max_record_size)
        if ext["used"] is None:
            digest, used = hasher.trimmed(seg.path, seg.size)
        else:
            used = ext["used"]
            digest = hasher.exact(seg.path, used)
        return {"file": seg.name, "start": seg.start, "size": _size(seg.path), "used": used,
                "records": ext["records"], "end": ext["end"], "end_pos": ext["end_pos"], "digest": digest}

    segments = []
    done = 0
    # hashlib and the compiled walk release the GIL: segments are hashed side by side (jobs x CHUNK bytes)
    with ThreadPoolExecutor(max_workers=max(1, min(jobs or _cpus(), len(cl.segments)))) as pool:
        for i, entry in enumerate(pool.map(one, range(len(cl.segments)))):
            segments.append(entry)
            done += cl.segments[i].size
            if progress is not None:
                progress(done)
    hasher = _Hasher()
    doc: dict = {
        "fingerprint_version": FINGERPRINT_VERSION, "tool": "rmqdump", "version": version,
        "algorithm": ALGORITHM, "store": str(store.root or cl.location),
        "commitlog": {"file_size": cl.file_size, "segments": segments,
                      "problems": [p.to_dict() for p in cl.problems]},
    }
    if store.root is not None:
        doc["consumequeue"] = _queues(store.root, hasher, batch=False)
        doc["batchconsumequeue"] = _queues(store.root, hasher, batch=True)
        doc["index"] = _index(store.root)
        doc["checkpoint"] = _checkpoint(store.root)
        doc["config"] = _config(store.root, hasher)
    return doc


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _queues(root: Path, hasher: _Hasher, batch: bool) -> dict:
    from rmqdump.store.consumequeue import discover_queues, list_mapped_files

    unit = BCQ_STORE_UNIT_SIZE if batch else CQ_STORE_UNIT_SIZE
    out: dict = {"unit_size": unit, "queues": [], "errors": []}
    try:
        refs = list(discover_queues(root, batch=batch))
    except RmqdumpError as e:
        out["errors"].append(str(e))
        return out
    for ref in refs:
        try:
            files, _stray = list_mapped_files(ref.path)
            rows = []
            for f in files:
                digest, used = hasher.trimmed(f.path, f.size, unit)
                rows.append({"file": f.path.name, "first_offset": f.start // unit, "entries": used // unit,
                             "digest": digest})
        except RmqdumpError as e:
            out["errors"].append(str(e))
            continue
        out["queues"].append({"topic": ref.topic, "queue_id": ref.queue_id, "files": rows})
    return out


def _index(root: Path) -> list[dict]:
    from rmqdump.analysis.info import _index_files

    keep = ("file", "begin_phy_offset", "end_phy_offset", "entries", "error")
    return [{k: v for k, v in f.items() if k in keep} for f in _index_files(root)]


def _checkpoint(root: Path) -> dict | None:
    from rmqdump.analysis.info import _checkpoint as info_checkpoint

    cp = info_checkpoint(root)
    return None if cp is None else {k: v for k, v in cp.items() if not k.endswith("_time")}


def _config(root: Path, hasher: _Hasher) -> dict:
    d = root / "config"
    out: dict = {}
    try:
        names = sorted(e.name for e in os.scandir(d) if e.is_file(follow_symlinks=False) and ".json" in e.name)
    except OSError:
        return out
    for name in names:
        try:
            size = (d / name).stat().st_size
            out[name] = hasher.exact(d / name, size)
        except (RmqdumpError, OSError) as e:
            out[name] = f"error: {e}"
    return out


def _diff(part: str, name: str, detail: str, a=None, b=None) -> dict:
    return {"part": part, "data": part in DATA_PARTS, "name": name, "detail": detail, "a": a, "b": b}


def compare_fingerprints(a: dict, b: dict) -> list[dict]:
    """Where fingerprints ``a`` and ``b`` differ: data parts first (commitlog segments, queue files), then
    index files, checkpoint and config. Empty when they match."""
    for doc, side in ((a, "A"), (b, "B")):
        if not isinstance(doc, dict) or doc.get("fingerprint_version") != FINGERPRINT_VERSION:
            raise StoreError(f"fingerprint {side} is not an rmqdump fingerprint (version {FINGERPRINT_VERSION})")
        if doc.get("algorithm") != ALGORITHM:
            raise StoreError(f"fingerprint {side} uses {doc.get('algorithm')!r}, not {ALGORITHM}")
    out: list[dict] = []
    sa = {s["file"]: s for s in a["commitlog"]["segments"]}
    sb = {s["file"]: s for s in b["commitlog"]["segments"]}
    for name in sorted(sa.keys() | sb.keys()):
        x, y = sa.get(name), sb.get(name)
        if x is None or y is None:
            out.append(_diff("commitlog", name, f"segment only in {'B' if x is None else 'A'}"))
        elif x["digest"] != y["digest"]:
            detail = ("same length, different bytes" if x["used"] == y["used"] else
                      f"bytes in use {x['used']} vs {y['used']}")
            out.append(_diff("commitlog", name, f"{detail} (records {x['records']} vs {y['records']}; end "
                                                f"{x['end']} vs {y['end']})", x["used"], y["used"]))
    for part in ("consumequeue", "batchconsumequeue"):
        out += _compare_queues(part, a.get(part) or {}, b.get(part) or {})
    ia = {f["file"]: f for f in a.get("index") or []}
    ib = {f["file"]: f for f in b.get("index") or []}
    for name in sorted(ia.keys() | ib.keys()):
        x, y = ia.get(name), ib.get(name)
        if x != y:
            out.append(_diff("index", name, f"index file only in {'B' if x is None else 'A'}"
                             if x is None or y is None else "header differs", x, y))
    if a.get("checkpoint") != b.get("checkpoint"):
        ca, cb = a.get("checkpoint") or {}, b.get("checkpoint") or {}
        keys = sorted(k for k in ca.keys() | cb.keys() if ca.get(k) != cb.get(k))
        out.append(_diff("checkpoint", "checkpoint", "fields differ: " + ", ".join(keys), ca, cb))
    fa, fb = a.get("config") or {}, b.get("config") or {}
    for name in sorted(fa.keys() | fb.keys()):
        if fa.get(name) != fb.get(name):
            out.append(_diff("config", name, f"only in {'B' if name not in fa else 'A'}"
                             if name not in fa or name not in fb else "contents differ"))
    return out


def _compare_queues(part: str, a: dict, b: dict) -> list[dict]:
    out = []
    qa = {(q["topic"], q["queue_id"]): q for q in a.get("queues", [])}
    qb = {(q["topic"], q["queue_id"]): q for q in b.get("queues", [])}
    for key in sorted(qa.keys() | qb.keys(), key=lambda k: (k[0], k[1])):
        name = f"{key[0]}/{key[1]}"
        x, y = qa.get(key), qb.get(key)
        if x is None or y is None:
            out.append(_diff(part, name, f"queue only in {'B' if x is None else 'A'}"))
            continue
        fa = {f["file"]: f for f in x["files"]}
        fb = {f["file"]: f for f in y["files"]}
        for fname in sorted(fa.keys() | fb.keys()):
            u, v = fa.get(fname), fb.get(fname)
            if u is None or v is None:
                w = u or v
                out.append(_diff(part, name, f"file {fname} (queue offsets from {w['first_offset']}, "
                                             f"{w['entries']} entries) only in {'B' if u is None else 'A'}"))
            elif u["digest"] != v["digest"]:
                first = u["first_offset"]
                out.append(_diff(part, name, f"file {fname} (queue offsets {first}..): entries "
                                             + (f"{u['entries']} vs {v['entries']}" if u["entries"] != v["entries"]
                                                else f"{u['entries']}, different contents"),
                                 u["entries"], v["entries"]))
    return out
