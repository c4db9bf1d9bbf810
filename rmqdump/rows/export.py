"""Single-machine export of commitlog records to Parquet or JSONL through pyarrow.

Columns are :data:`rmqdump.rows.arrow.RECORD_SCHEMA` (the JSONL schema plus lineage) in both
formats; JSONL renders ``body`` as base64 and ``store_time`` as ISO 8601. With
``partition_by`` the output is a Hive-style directory tree (``topic=<v>/date=<d>/part-*.parquet``)
that Spark, pyarrow and DuckDB read back as partition columns. The data files always keep
every record column, so the exact topic is in the data even when its directory name had to
be shortened.

Partition values come from untrusted data, so directory names are built by
:func:`partition_dir_name`: Spark's own path escaping (``/``, ``%``, ``=``, control
characters ... become ``%XX``) plus NUL and ``~``, and values whose name would pass 255
bytes are cut and suffixed with ``~`` + 16 hex digits of their SHA-256. A name can never
be empty, ``.``, ``..``, hold a ``/`` or a NUL, or exceed the file-name limit.

The Spark export job writes through the same :class:`DatasetWriter`, one file set per segment.
"""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS
from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.disk.guard import protected_root, refuse_inside
from rmqdump.errors import RmqdumpError, StoreError
from rmqdump.rows.arrow import (
    DEFAULT_BATCH_SIZE,
    RECORD_SCHEMA,
    SegmentReport,
    SegmentSplit,
    iter_splits,
    read_split,
    segment_splits,
)
from rmqdump.rows.exportjsonl import CompiledJsonl, compiled_jsonl_applies, jsonl_lines

__all__ = ["DatasetWriter", "ExportResult", "WrittenFile", "export", "export_throughput", "jsonl_lines",
           "parse_partition_by", "partition_dir_name", "partition_keys", "write_splits"]

FORMATS = ("parquet", "jsonl")
PARTITION_KEYS = ("broker", "topic", "queue_id", "date", "hour")
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"  # Spark/Hive's name for a null (or empty) value
NAME_MAX = 255
HASH_HEX = 16
ROW_GROUP_ROWS = 128 * 1024
#: A row group's Arrow bytes: one is buffered while the one before is encoded, so the export's memory is
#: about twice this (peak RSS of a 2 GiB export: 362 MB with 64 MiB).
ROW_GROUP_BYTES = 24 * 1024 * 1024
MAX_BUFFERED_BYTES = 64 * 1024 * 1024  # all partitions' pending row groups together
#: Parquet dictionary encoding only for the columns whose values repeat (names, hosts, lineage): on the
#: unique numbers (offsets, CRCs, ids) it costs most of the write time and makes the file bigger.
DICTIONARY_COLUMNS = ("file", "magic", "transaction", "compression", "born_host", "store_host", "topic",
                      "properties.key_value.key", "tags", "broker", "store", "segment")
#: No min/max statistics for the columns nobody prunes by (hosts, property maps, keys, sysflag names): on
#: strings and bodies they cost about a fifth of the Parquet encoding time.
NO_STATISTICS = ("magic", "transaction", "compression", "born_host", "store_host", "properties", "keys", "body")
_SUFFIXES = {".parquet": "parquet", ".pq": "parquet", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl"}

# Spark's ExternalCatalogUtils.charToEscape, plus NUL and '~' (kept for the hash suffix).
_ESCAPE = frozenset([*map(chr, range(0x00, 0x20)), '"', "#", "%", "'", "*", "/", ":", "=", "?", "\\", "\x7f",
                     "{", "[", "]", "^", "~"])


def escape_path_value(value: str) -> str:
    """Percent-encode a partition value like Spark's ``escapePathName`` (plus NUL, ``~`` and
    lone surrogates), so Spark/pyarrow decode it back to the value."""
    out = []
    for c in value:
        if c in _ESCAPE:
            out.append(f"%{ord(c):02X}")
        elif "\ud800" <= c <= "\udfff":  # a surrogate-escaped byte from a file name
            out.append("".join(f"%{b:02X}" for b in c.encode("utf-8", "surrogateescape")))
        else:
            out.append(c)
    return "".join(out)


def partition_dir_name(column: str, value) -> str:
    """The directory name ``column=<escaped value>`` for one partition value (see module doc)."""
    if column not in PARTITION_KEYS:
        raise ValueError(f"cannot partition by {column!r} (choose from {', '.join(PARTITION_KEYS)})")
    prefix = f"{column}="
    if value is None or value == "":
        return prefix + DEFAULT_PARTITION
    text = str(value)
    enc = escape_path_value(text)
    if len((prefix + enc).encode("utf-8")) > NAME_MAX:
        digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:HASH_HEX]
        budget = NAME_MAX - len(prefix) - 1 - HASH_HEX
        cut = []
        used = 0
        for piece in _escape_units(enc):
            n = len(piece.encode("utf-8"))
            if used + n > budget:
                break
            cut.append(piece)
            used += n
        enc = "".join(cut) + "~" + digest
    name = prefix + enc
    if "/" in name or "\0" in name or len(name.encode("utf-8")) > NAME_MAX:  # cannot happen: defence in depth
        raise RmqdumpError(f"unsafe partition directory name for {column}")
    return name


def _escape_units(enc: str) -> Iterable[str]:
    """Split an escaped string into units that must not be cut (``%XX`` or one character)."""
    i = 0
    while i < len(enc):
        if enc[i] == "%":
            yield enc[i:i + 3]
            i += 3
        else:
            yield enc[i]
            i += 1


def parse_partition_by(spec: str | Sequence[str] | None) -> tuple[str, ...]:
    """``"topic,date"`` -> ``("topic", "date")``, validated."""
    if not spec:
        return ()
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    cols = tuple(c.strip() for c in items if c.strip())
    for c in cols:
        if c not in PARTITION_KEYS:
            raise RmqdumpError(f"cannot partition by {c!r} (choose from {', '.join(PARTITION_KEYS)})")
    if len(set(cols)) != len(cols):
        raise RmqdumpError(f"partition column repeated in {','.join(cols)}")
    return cols


def _day(ms_list: list) -> list:
    cache: dict[int, str] = {}
    out = []
    for us in ms_list:
        if us is None:
            out.append(None)
            continue
        d = us // 86_400_000_000
        s = cache.get(d)
        if s is None:
            s = cache[d] = time.strftime("%Y-%m-%d", time.gmtime(d * 86400))
        out.append(s)
    return out


def partition_keys(batch: pa.RecordBatch, columns: Sequence[str]) -> list[tuple]:
    """Per row, the relative directory of its partition (a tuple of directory names)."""
    values = []
    for col in columns:
        if col in ("date", "hour"):
            ts = batch.column("store_time").cast(pa.int64()).to_pylist()
            values.append(_day(ts) if col == "date" else [None if t is None else t // 3_600_000_000 % 24 for t in ts])
        else:
            values.append(batch.column(col).to_pylist())
    cache: dict[tuple, tuple] = {}
    out = []
    for row in zip(*values, strict=True):
        d = cache.get(row)
        if d is None:
            d = cache[row] = tuple(partition_dir_name(c, v) for c, v in zip(columns, row, strict=True))
        out.append(d)
    return out


@dataclass
class WrittenFile:
    path: str
    rows: int
    bytes: int


def _leaf_paths(schema: pa.Schema) -> list[str]:
    """The Parquet column paths of ``schema`` (``properties.key_value.key``, ``keys.list.element`` ...)."""
    out = []
    for f in schema:
        if pa.types.is_map(f.type):
            out += [f"{f.name}.key_value.key", f"{f.name}.key_value.value"]
        elif pa.types.is_list(f.type):
            out.append(f"{f.name}.list.element")
        else:
            out.append(f.name)
    return out


def _write_row_group(writer, table: pa.Table, rows: int) -> None:
    writer.write_table(table, row_group_size=rows)


@contextmanager
def _returning_pool() -> Iterator[None]:
    """Arrow's default mimalloc pool keeps the pages each row group's columns and encoding freed (~30 MB of
    peak RSS on a 1 KiB-record export); the C allocator returns them. Set for the export, then restored."""
    old = pa.default_memory_pool()
    if old.backend_name != "mimalloc":
        yield
        return
    pa.set_memory_pool(pa.system_memory_pool())
    try:
        yield
    finally:
        pa.set_memory_pool(old)


class _Sink:
    """One output file, written to a hidden temporary name and renamed on close.

    Parquet row groups are encoded on ``background`` (one thread, pyarrow releases the GIL)
    while the caller decodes the next batches; at most one row group per file is in flight.
    """

    def __init__(self, path: Path, fmt: str, schema: pa.Schema, compression: str, background=None):
        self.path = path
        self.tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.inprogress")
        self.fmt = fmt
        self.rows = 0
        self.pending: list[pa.RecordBatch] = []
        self.pending_rows = 0
        self.pending_bytes = 0
        self.background = background
        self.inflight = None
        if fmt == "parquet":
            import pyarrow.parquet as pq

            names = set(schema.names)
            dictionary = [c for c in DICTIONARY_COLUMNS if c.split(".")[0] in names]
            statistics = [c for c in _leaf_paths(schema) if c.split(".")[0] not in NO_STATISTICS]
            self.writer = pq.ParquetWriter(str(self.tmp), schema, compression=compression, use_dictionary=dictionary,
                                           write_statistics=statistics)
        else:
            self.fh = open(self.tmp, "wb")  # noqa: SIM115 (closed in close())

    def add(self, batch: pa.RecordBatch) -> None:
        if self.fmt == "jsonl":
            self.fh.write("".join(line + "\n" for line in jsonl_lines(batch)).encode("utf-8"))
            self.rows += batch.num_rows
            return
        self.pending.append(batch)
        self.pending_rows += batch.num_rows
        self.pending_bytes += batch.nbytes
        if self.pending_rows >= ROW_GROUP_ROWS or self.pending_bytes >= ROW_GROUP_BYTES:
            self.flush()

    def _wait(self) -> None:
        if self.inflight is not None:
            fut, self.inflight = self.inflight, None
            fut.result()  # re-raises a write error here

    def flush(self) -> None:
        if self.fmt == "parquet" and self.pending:
            table = pa.Table.from_batches(self.pending)
            rows = max(self.pending_rows, 1)
            self._wait()
            if self.background is None:
                _write_row_group(self.writer, table, rows)
            else:
                self.inflight = self.background.submit(_write_row_group, self.writer, table, rows)
            self.rows += self.pending_rows
            self.pending, self.pending_rows, self.pending_bytes = [], 0, 0

    def close(self) -> WrittenFile:
        if self.fmt == "parquet":
            self.flush()
            self._wait()
            self.writer.close()
        else:
            self.fh.close()
        os.replace(self.tmp, self.path)
        return WrittenFile(str(self.path), self.rows, self.path.stat().st_size)

    def abort(self) -> None:
        try:
            try:
                self._wait()
            except Exception:  # already failing: the first error is the one reported
                pass
            if self.fmt == "parquet":
                self.writer.close()
            else:
                self.fh.close()
        finally:
            self.tmp.unlink(missing_ok=True)


class DatasetWriter:
    """Writes record batches to one file, or to a partitioned directory tree under ``root``.

    Without ``partition_by``, ``root`` is the output file. With it, rows go to
    ``root/<col>=<v>/.../<prefix>-<n>.<ext>``; at most ``max_open`` files are open at once
    (the least recently used one is closed and a later row of its partition starts a new file).
    """

    def __init__(self, root: str | os.PathLike, fmt: str = "parquet", partition_by: Sequence[str] = (),
                 prefix: str = "part-00000", schema: pa.Schema = RECORD_SCHEMA, compression: str = "zstd",
                 max_open: int = 64, write_empty: bool = True, background: bool = True):
        if fmt not in FORMATS:
            raise RmqdumpError(f"unknown export format {fmt!r} (choose from {', '.join(FORMATS)})")
        self.root = Path(root)
        self.fmt = fmt
        self.partition_by = parse_partition_by(partition_by)
        self.prefix = prefix
        self.schema = schema
        self.compression = compression
        self.max_open = max(1, max_open)
        self.open: OrderedDict[tuple, _Sink] = OrderedDict()
        self.seq: dict[tuple, int] = {}
        self.files: list[WrittenFile] = []
        self.rows = 0
        self.write_empty = write_empty
        self.background = None
        if background and fmt == "parquet":
            from concurrent.futures import ThreadPoolExecutor

            self.background = ThreadPoolExecutor(1, thread_name_prefix="rmqdump-parquet")

    def _sink(self, key: tuple) -> _Sink:
        sink = self.open.get(key)
        if sink is not None:
            self.open.move_to_end(key)
            return sink
        if len(self.open) >= self.max_open:
            _, old = self.open.popitem(last=False)
            self.files.append(old.close())
        if not self.partition_by:
            path = self.root
        else:
            d = self.root.joinpath(*key)
            d.mkdir(parents=True, exist_ok=True)
            n = self.seq.get(key, 0)
            self.seq[key] = n + 1
            path = d / f"{self.prefix}-{n:03d}.{'parquet' if self.fmt == 'parquet' else 'jsonl'}"
        sink = self.open[key] = _Sink(path, self.fmt, self.schema, self.compression, self.background)
        return sink

    def jsonl_file(self) -> _Sink:
        """The one file of an unpartitioned JSONL export, for a writer of ready lines (``fh``, binary); it
        reports its lines with :meth:`add_rows`."""
        if self.fmt != "jsonl" or self.partition_by:
            raise ValueError("not an unpartitioned JSONL export")
        return self._sink(())

    def add_rows(self, rows: int) -> None:
        """Count ``rows`` lines written to :meth:`jsonl_file` directly."""
        self.rows += rows
        self._sink(()).rows += rows

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        self.rows += batch.num_rows
        if not self.partition_by:
            self._sink(()).add(batch)
            return
        groups: dict[tuple, list[int]] = {}
        for i, key in enumerate(partition_keys(batch, self.partition_by)):
            groups.setdefault(key, []).append(i)
        if len(groups) == 1:
            self._sink(next(iter(groups))).add(batch)
        else:
            for key, idx in groups.items():
                self._sink(key).add(batch.take(pa.array(idx, type=pa.int32())))
        if sum(s.pending_bytes for s in self.open.values()) > MAX_BUFFERED_BYTES:
            for s in self.open.values():
                s.flush()

    def close(self) -> list[WrittenFile]:
        """Finish every file (an empty unpartitioned export writes a valid empty file if ``write_empty``)."""
        if not self.partition_by and not self.open and self.write_empty and not self.files:
            self._sink(())
        try:
            while self.open:
                _, sink = self.open.popitem(last=False)
                self.files.append(sink.close())
        finally:
            self._stop_background()
        return self.files

    def abort(self) -> None:
        """Drop the files still being written (finished ones stay)."""
        try:
            while self.open:
                _, sink = self.open.popitem(last=False)
                sink.abort()
        finally:
            self._stop_background()

    def _stop_background(self) -> None:
        if self.background is not None:
            self.background.shutdown(wait=True)
            self.background = None


@dataclass
class ExportResult:
    rows: int = 0
    segments: int = 0
    input_bytes: int = 0
    files: list[WrittenFile] = field(default_factory=list)
    reports: list[SegmentReport] = field(default_factory=list)

    @property
    def output_bytes(self) -> int:
        return sum(f.bytes for f in self.files)

    def to_dict(self) -> dict:
        return {"rows": self.rows, "segments": self.segments, "input_bytes": self.input_bytes,
                "output_bytes": self.output_bytes, "files": [f.__dict__ for f in self.files],
                "segment_reports": [r.__dict__ for r in self.reports]}


def infer_format(to: str | os.PathLike, fmt: str | None) -> str:
    """``fmt`` if given, else from the suffix of ``to`` (.parquet/.pq, .jsonl/.ndjson/.json)."""
    if fmt:
        if fmt not in FORMATS:
            raise RmqdumpError(f"unknown export format {fmt!r} (choose from {', '.join(FORMATS)})")
        return fmt
    suffix = Path(to).suffix.lower()
    if suffix not in _SUFFIXES:
        raise RmqdumpError(f"cannot tell the format from {str(to)!r}: name it .parquet or .jsonl, or give the format")
    return _SUFFIXES[suffix]


def store_roots(paths: str | os.PathLike | Sequence[str | os.PathLike]) -> list[str]:
    """The directories an export of ``paths`` must never write into: each input's store root (or the
    input itself, or a lone segment's directory, when no store root is found)."""
    from rmqdump.store.root import Store

    out = []
    for p in ([paths] if isinstance(paths, (str, os.PathLike)) else paths):
        try:
            root = Store.open(p).root
        except RmqdumpError:
            root = None
        out.append(str(root) if root is not None else protected_root(p))
    return out


def check_output(to: str | os.PathLike, partitioned: bool, overwrite: bool = False,
                 stores: Sequence[str | os.PathLike] = ()) -> Path:
    """Refuse an output location :func:`prepare_output` would refuse, without creating anything."""
    out = refuse_inside(to, store_roots(stores) if stores else (), "the export output")
    if partitioned:
        if out.exists() and not out.is_dir():
            raise StoreError("output exists and is not a directory", out)
        if out.is_dir() and any(out.iterdir()):
            raise StoreError("output directory is not empty", out)
        return out
    return prepare_output(to, partitioned, overwrite, stores)


def prepare_output(to: str | os.PathLike, partitioned: bool, overwrite: bool = False,
                   stores: Sequence[str | os.PathLike] = ()) -> Path:
    """Check the output location: a file (replaced only with ``overwrite``) or an empty/new directory,
    never inside one of the ``stores`` read (:func:`rmqdump.disk.guard.refuse_inside`)."""
    out = refuse_inside(to, store_roots(stores) if stores else (), "the export output")
    if partitioned:
        check_output(out, True)
        out.mkdir(parents=True, exist_ok=True)
    else:
        if out.is_dir():
            raise StoreError("output is a directory; give a file name (or --partition-by for a directory)", out)
        if out.exists() and not overwrite:
            raise StoreError("output file exists (use --overwrite to replace it)", out)
        if out.exists() and not out.is_file():  # /dev/null, a FIFO: the finished file would be renamed over it
            raise StoreError("output exists and is not a regular file (a device or FIFO is never replaced)", out)
        if not out.parent.is_dir():
            raise StoreError("output directory does not exist", out.parent)
    return out


def write_splits(splits: Iterable[SegmentSplit], writer: DatasetWriter, result: ExportResult,
                 progress: Callable[[int], None] | None = None, **read_options) -> ExportResult:
    """Read splits one after the other into ``writer`` (which the caller closes). An unpartitioned JSONL
    export writes the splits the compiled renderer takes (:func:`rmqdump.rows.exportjsonl.compiled_jsonl_applies`)
    with it, the others through record batches and :func:`jsonl_lines` (the reference)."""
    done = 0
    compiled: CompiledJsonl | None = None
    direct = writer.fmt == "jsonl" and not writer.partition_by
    pick = {k: read_options[k] for k in ("flt", "crc", "keep_going", "use_mmap", "fast") if k in read_options}
    try:
        for split in splits:
            if direct and compiled_jsonl_applies(split, **pick):
                if compiled is None:
                    compiled = CompiledJsonl(writer.jsonl_file().fh.write,
                                             include_body=read_options.get("include_body", False),
                                             decompress=read_options.get("decompress", False),
                                             delay_levels_ms=read_options.get("delay_levels_ms", DEFAULT_DELAY_LEVELS_MS))
                tick = None if progress is None else (lambda end, done=done: progress(done + end))
                rows = compiled.write_split(split, flt=pick.get("flt"), crc=pick.get("crc", "check"),
                                            max_record_size=read_options.get("max_record_size", MAX_RECORD_SIZE),
                                            on_segment=result.reports.append, progress=tick)
                writer.add_rows(rows)
            else:
                for batch in read_split(split, on_segment=result.reports.append, **read_options):
                    writer.write(batch)
                    if progress is not None:
                        last = batch.num_rows - 1
                        progress(done + batch.column("offset")[last].as_py() + batch.column("size")[last].as_py()
                                 - split.start)
            done += split.size
            result.segments += 1
            result.input_bytes += split.size
            if progress is not None:
                progress(done)
    finally:
        if compiled is not None:
            compiled.close()
    result.rows = writer.rows
    return result


def export(paths: str | os.PathLike | Sequence[str | os.PathLike], to: str | os.PathLike, *, fmt: str | None = None,
           partition_by: str | Sequence[str] = (), overwrite: bool = False, compression: str = "zstd",
           batch_size: int = DEFAULT_BATCH_SIZE, broker: str | None = None,
           progress: Callable[[int, int], None] | None = None, **read_options) -> ExportResult:
    """Export the records of one or more stores to ``to`` (a file, or a directory with ``partition_by``).

    ``read_options`` are those of :func:`rmqdump.rows.arrow.read_split` (``include_body``,
    ``decompress``, ``flt``, ``crc``, ``keep_going``, ``use_mmap``, ``max_record_size``).
    ``progress(done_bytes, total_bytes)`` is called as segments are read.
    """
    cols = parse_partition_by(partition_by)
    fmt = infer_format(to, fmt) if not cols else (fmt or "parquet")
    if isinstance(paths, (str, os.PathLike)):
        splits = iter_splits(paths, broker)
    else:
        splits = segment_splits(paths)
    out = prepare_output(to, bool(cols), overwrite, [paths] if isinstance(paths, (str, os.PathLike)) else paths)
    total = sum(s.size for s in splits)
    result = ExportResult()
    tick = (lambda done: progress(done, total)) if progress is not None else None
    with _returning_pool():
        writer = DatasetWriter(out, fmt, cols, compression=compression)
        try:
            write_splits(splits, writer, result, tick, batch_size=batch_size, **read_options)
            result.files = writer.close()
        except BaseException:
            writer.abort()
            raise
    if cols:
        (out / "_SUCCESS").touch()
    return result


def export_throughput(paths: str | os.PathLike | Sequence[str | os.PathLike], to: str | os.PathLike,
                      **options) -> dict:
    """Run :func:`export` and time it (for bench/): rows, bytes, seconds, rows/s, MB/s."""
    t0 = time.perf_counter()
    res = export(paths, to, **options)
    dt = time.perf_counter() - t0
    return {"engine": "single-process", "rows": res.rows, "input_bytes": res.input_bytes,
            "output_bytes": res.output_bytes, "seconds": dt, "rows_per_s": res.rows / dt if dt else 0.0,
            "mb_per_s": res.input_bytes / dt / 1e6 if dt else 0.0}
