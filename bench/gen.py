"""Benchmark store generator: commitlogs written with rmqdump's own encoder.

One template record is encoded with :func:`rmqdump.codec.encoder.encode_fields`; chunks of records
are then produced by tiling it into one reused buffer and patching the per-record fields
(QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, STORETIMESTAMP, a record counter in the body, the KEYS
digits, BODYCRC). Every segment is filled the broker's way (a record goes in only if 8 bytes
stay free behind it) and closed with an end-of-file BLANK. Stores are kept in ``bench/data/``
and reused while their parameters match (a ``bench.json`` stamp in each store).
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from rmqdump.codec.encoder import encode_blank, encode_fields, properties_bytes
from rmqdump.disk.segment import offset_to_file_name

GEN_VERSION = 2
TOPIC = b"BenchTopic"
KEY_DIGITS = 10
QUEUES = 8
BASE_TS = 1_700_000_000_000
CHUNK_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class StoreSpec:
    """A synthetic store: ``segments`` files of ``segment_size`` bytes of ``record_size`` records."""

    name: str
    record_size: int
    segment_size: int
    segments: int
    version: int = GEN_VERSION

    @property
    def total_bytes(self) -> int:
        return self.segment_size * self.segments

    @property
    def records_per_segment(self) -> int:
        return (self.segment_size - 8) // self.record_size


def key_for(index: int) -> str:
    """The KEYS value of record ``index`` (lookup benchmarks query these)."""
    return f"k{index:0{KEY_DIGITS}d}"


def template(record_size: int) -> tuple[bytes, int, int, int]:
    """One record of exactly ``record_size`` bytes: (bytes, body start, body length, key digits pos)."""
    props = properties_bytes({"KEYS": key_for(0)} if record_size < 256 else {"KEYS": key_for(0), "TAGS": "bench"})
    fixed = len(encode_fields(topic=TOPIC, body=b"", properties=props))
    body_len = record_size - fixed
    if body_len < 8:
        raise ValueError(f"record size {record_size} is too small for the bench template ({fixed + 8} minimum)")
    rec = encode_fields(topic=TOPIC, body=bytes(body_len), properties=props, born_port=50000,
                        born_timestamp=BASE_TS, store_timestamp=BASE_TS)
    assert len(rec) == record_size
    body_start = 88
    key_pos = rec.index(key_for(0).encode()) + 1  # first digit
    return rec, body_start, body_len, key_pos


def _be(values: np.ndarray, dtype: str) -> np.ndarray:
    """Big-endian bytes of ``values`` as an (n, width) uint8 array."""
    return values.astype(dtype).view(np.uint8).reshape(len(values), -1)


def write_segment(path: Path, spec: StoreSpec, seg_index: int, first_record: int) -> int:
    """Write one full segment; return the number of records in it."""
    rec, body_start, body_len, key_pos = template(spec.record_size)
    r = spec.record_size
    per_seg = spec.records_per_segment
    rows_per_chunk = max(1, CHUNK_BYTES // r)
    chunk = np.tile(np.frombuffer(rec, dtype=np.uint8), rows_per_chunk).reshape(rows_per_chunk, r)
    seg_start = seg_index * spec.segment_size
    pow10 = 10 ** np.arange(KEY_DIGITS - 1, -1, -1, dtype=np.int64)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        done = 0
        while done < per_seg:
            n = min(rows_per_chunk, per_seg - done)
            c = chunk[:n]
            idx = np.arange(first_record + done, first_record + done + n, dtype=np.int64)
            c[:, 12:16] = _be(idx % QUEUES, ">i4")
            c[:, 20:28] = _be(idx // QUEUES, ">i8")
            c[:, 28:36] = _be(seg_start + np.arange(done, done + n, dtype=np.int64) * r, ">i8")
            c[:, 56:64] = _be(BASE_TS + idx // 1000, ">i8")
            c[:, body_start:body_start + 8] = _be(idx, ">i8")
            c[:, key_pos:key_pos + KEY_DIGITS] = ((idx[:, None] // pow10) % 10 + 48).astype(np.uint8)
            crcs = np.fromiter((zlib.crc32(row[body_start:body_start + body_len]) & 0x7FFFFFFF for row in c),
                               dtype=np.int64, count=n)
            c[:, 8:12] = _be(crcs, ">i4")
            f.write(c.data)
            done += n
        used = per_seg * r
        f.write(encode_blank(spec.segment_size - used))
        f.truncate(spec.segment_size)
    os.replace(tmp, path)
    return per_seg


def ensure_store(root: Path, spec: StoreSpec, log=print) -> Path:
    """Create (or reuse) the store ``root/spec.name``; return its directory."""
    d = root / spec.name
    stamp = d / "bench.json"
    if stamp.exists():
        try:
            if json.loads(stamp.read_text()) == asdict(spec):
                return d
        except ValueError:
            pass
    cl = d / "commitlog"
    cl.mkdir(parents=True, exist_ok=True)
    if stamp.exists():
        stamp.unlink()
    for p in cl.iterdir():
        p.unlink()
    log(f"generating {spec.name}: {spec.segments} x {spec.segment_size} bytes of {spec.record_size}-byte records")
    first = 0
    for s in range(spec.segments):
        first += write_segment(cl / offset_to_file_name(s * spec.segment_size), spec, s, first)
    stamp.write_text(json.dumps(asdict(spec)))
    return d


def link_prefix(root: Path, src: Path, name: str, segments: int) -> Path:
    """A store ``root/name`` whose commitlog holds symlinks to ``src``'s first ``segments`` files."""
    d = root / name / "commitlog"
    d.mkdir(parents=True, exist_ok=True)
    want = sorted((src / "commitlog").iterdir())[:segments]
    want = [p for p in want if p.name.isdigit()]
    for p in d.iterdir():
        p.unlink()
    for p in want:
        (d / p.name).symlink_to(p.resolve())
    return d.parent


def store_records(spec: StoreSpec) -> int:
    return spec.records_per_segment * spec.segments
