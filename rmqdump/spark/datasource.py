"""PySpark (>= 4.0) Python data sources over the core decoder.

Register them once per session (any ``SparkSession``; :func:`rmqdump.spark.build_session` does it)::

    from rmqdump.spark import register_data_sources; register_data_sources(spark)

``spark.read.format("rocketmq").load(path_or_paths)``: commitlog records, one partition
per segment, read as Arrow record batches (:data:`SOURCE_SCHEMA`: the record schema
:data:`rmqdump.rows.arrow.RECORD_SCHEMA` plus ``_corrupt_record``). Options (:data:`RECORD_OPTIONS`,
anything else is an error): ``includeBody`` (false), ``decompress`` (false), ``topic`` (comma-separated),
``key``, ``queueId``, ``crc`` (check | flag | off), ``keepGoing`` (false), ``useMmap`` (true),
``maxRecordSize``, ``batchSize``, ``broker`` (name for a single store), ``brokers`` (a JSON object
``{"store path": "broker name"}``: names per store, the others keep names from their paths), ``mode``
(PERMISSIVE | DROPMALFORMED | FAILFAST, as Spark's file sources: damage is a row whose
``_corrupt_record`` says where and why, is dropped, or fails the query).
``fromOffset`` / ``toOffset`` (records at offsets in [from, to)), ``prune`` (true: skip segments no row
can come from, :mod:`rmqdump.spark.pruning`). With ``spark.sql.python.filterPushdown.enabled``
(pyspark >= 4.1), filters on ``broker``, ``store``, ``segment``, ``offset``, ``topic`` and ``queue_id`` also
skip segments at planning, and ``topic`` / ``queue_id`` equality or IN are applied while decoding; Spark
re-applies every filter either way.

``rocketmq_cq``: ConsumeQueue entries and BatchConsumeQueue units (:data:`rmqdump.spark.queues.QUEUE_SCHEMA`),
one partition per queue; option ``raw`` (every unit instead of the broker's recovered view).
``rocketmq_index``: index-file entries (:data:`rmqdump.rows.arrow.INDEX_SCHEMA`), one partition per file.
Both also take ``broker`` / ``brokers``.

Paths are store roots (or commitlog directories / segment files for ``rocketmq``); executors
must see them at the same paths.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import replace

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.errors import FormatError, RmqdumpError
from rmqdump.rows import arrow as rarrow
from rmqdump.rows.filters import RecordFilter
from rmqdump.spark.plumbing import expand_paths, store_names
from rmqdump.spark.pruning import Pruning
from rmqdump.spark.queues import QUEUE_SCHEMA, queue_splits, read_queue

try:  # filter pushdown for Python data sources arrived in pyspark 4.1
    from pyspark.sql.datasource import EqualTo, Filter, GreaterThan, GreaterThanOrEqual, In, LessThan, LessThanOrEqual
except ImportError:  # pyspark 4.0: no pushdown, Spark applies every filter
    EqualTo = In = Filter = GreaterThan = GreaterThanOrEqual = LessThan = LessThanOrEqual = None  # type: ignore
_BOUNDS = {"<": LessThan, "<=": LessThanOrEqual, ">": GreaterThan, ">=": GreaterThanOrEqual}

PUSHDOWN_API = EqualTo is not None

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")

#: ``format("rocketmq")`` options (``path``/``paths`` come from ``load()``).
RECORD_OPTIONS = ("includeBody", "decompress", "topic", "key", "queueId", "crc", "keepGoing", "useMmap",
                  "maxRecordSize", "batchSize", "broker", "brokers", "mode", "fromOffset", "toOffset", "prune")
CQ_OPTIONS = ("raw", "broker", "brokers")
INDEX_OPTIONS = ("broker", "brokers")
MODES = ("PERMISSIVE", "DROPMALFORMED", "FAILFAST")
CORRUPT_COLUMN = "_corrupt_record"
#: The ``rocketmq`` rows: the record schema and ``_corrupt_record`` (null on records; on a damage row the
#: damage, with broker, store, segment and offset set and every other column null).
SOURCE_SCHEMA = rarrow.RECORD_SCHEMA.append(pa.field(CORRUPT_COLUMN, pa.string()))
_CLEAN_STOPS = ("end_of_data", "blank")


def _opts(options: Mapping[str, str]) -> dict[str, str]:
    """Spark hands options over case-insensitively (lower-cased keys): look them up that way."""
    return {str(k).lower(): v for k, v in options.items()}


def check_options(options: Mapping[str, str], source: str, known: tuple[str, ...]) -> None:
    """Refuse options ``source`` does not know (a misspelt ``includeBodies`` must not read without bodies)."""
    allowed = {k.lower() for k in (*known, "path", "paths")}
    unknown = sorted(str(k) for k in options if str(k).lower() not in allowed)
    if unknown:
        raise RmqdumpError(f"format({source!r}): unknown option {', '.join(map(repr, unknown))}; "
                           f"known options: {', '.join(known) if known else 'none'} (and the load() path)")


def _bool(options: Mapping[str, str], name: str, default: bool) -> bool:
    v = options.get(name.lower())
    if v is None:
        return default
    s = str(v).strip().lower()
    if s in _TRUE:
        return True
    if s in _FALSE:
        return False
    raise RmqdumpError(f"option {name}: expected true or false, got {v!r}")


def _int(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    v = options.get(name.lower())
    if v is None or str(v).strip() == "":
        return default
    try:
        return int(str(v).strip())
    except ValueError:
        raise RmqdumpError(f"option {name}: expected an integer, got {v!r}") from None


def _list(options: Mapping[str, str], name: str) -> tuple[str, ...]:
    v = options.get(name.lower())
    if not v:
        return ()
    return tuple(s for s in (p.strip() for p in str(v).split(",")) if s)


def load_paths(options: Mapping[str, str]) -> list[str]:
    """The store paths given to ``load()``: ``path`` (one) and/or ``paths`` (a JSON list), made absolute
    (``file://`` URIs as local paths, globs expanded: sorted, deduplicated); other URI schemes are refused."""
    options = _opts(options)
    out: list[str] = []
    if options.get("paths"):
        raw = options["paths"]
        try:
            value = json.loads(raw)
        except ValueError:
            value = [raw]
        out.extend([value] if isinstance(value, str) else [str(p) for p in value])
    if options.get("path"):
        out.append(str(options["path"]))
    if not out:
        raise RmqdumpError("no store path: use .load(path) or .load([path, ...])")
    return expand_paths(out)


def broker_map(options: Mapping[str, str], paths: list[str]) -> dict[str, str]:
    """Broker name of each store: from its path, or from the ``broker`` (one store) / ``brokers`` (a JSON
    object, store path -> name) options; names must be unique (:func:`rmqdump.spark.plumbing.store_names`)."""
    options = _opts(options)
    given: dict[str, str] = {}
    raw = options.get("brokers")
    if raw not in (None, ""):
        try:
            value = json.loads(raw)
        except ValueError:
            value = None
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise RmqdumpError(f'option brokers: expected a JSON object {{"store path": "broker name", ...}}, '
                               f"got {str(raw)[:80]!r}")
        given.update(value)
    broker = options.get("broker")
    if broker:
        if len(paths) != 1:
            raise RmqdumpError("option broker names a single store; name several with the brokers option "
                               '(a JSON object {"store path": "broker name", ...})')
        if given:
            raise RmqdumpError("give either option broker or option brokers, not both")
        given[paths[0]] = broker
    return store_names(paths, given)


def spark_schema(schema) -> StructType:
    """A pyarrow schema as a Spark StructType."""
    return from_arrow_schema(schema)


class _Split(InputPartition):
    """An InputPartition carrying one of rmqdump.rows.arrow's split dataclasses."""

    def __init__(self, split):
        super().__init__(split)
        self.split = split


def _planning_with_pushdown() -> bool:
    """Whether Spark's planner will call ``pushFilters`` on the reader being created: the pushdown planner
    (``data_source_pushdown_filters``) does; the plain one (``plan_data_source_read``, pushdown disabled)
    refuses a reader that implements it, so it gets one that does not."""
    if not PUSHDOWN_API:
        return False
    f = sys._getframe(1)
    while f is not None:
        if os.path.basename(f.f_code.co_filename) == "data_source_pushdown_filters.py":
            return True
        f = f.f_back
    return False


class RocketMQDataSource(DataSource):
    """``format("rocketmq")``: commitlog records of one or many stores."""

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        check_options(options, "rocketmq", RECORD_OPTIONS)

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> StructType:
        return spark_schema(SOURCE_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        cls = RocketMQPushdownReader if _planning_with_pushdown() else RocketMQReader
        return cls(_opts(self.options))


def check_segment_file(path: str) -> None:
    """A single file given as a store must start with a record (or be unwritten), as ``scan`` requires."""
    if not os.path.isfile(path):
        return
    from rmqdump.codec.record import END_OF_DATA, Invalid
    from rmqdump.store.root import Store

    walk = Store.open(path).commitlog.walk(check_crc=False, read_body=False)
    first = next(iter(walk), None)
    stop = walk.stop
    if first is None and isinstance(stop, Invalid) and stop.kind != END_OF_DATA and walk.records == 0:
        raise FormatError(f"no valid record: {stop.kind}: {stop.detail}", path, stop.file_pos)


class RocketMQReader(DataSourceReader):
    """Reads the splits; filters are left to Spark (see :class:`RocketMQPushdownReader`)."""

    def __init__(self, options: dict[str, str]):
        self.options = options
        self.paths = load_paths(options)
        self.brokers = broker_map(options, self.paths)
        self.topics = _list(options, "topic")
        self.keys = _list(options, "key")
        self.queue_id = _int(options, "queueId", None)
        self.include_body = _bool(options, "includeBody", False)
        self.decompress = _bool(options, "decompress", False)
        self.keep_going = _bool(options, "keepGoing", False)
        self.use_mmap = _bool(options, "useMmap", True)
        self.crc = str(options.get("crc", "check")).lower()
        if self.crc not in rarrow.CRC_MODES:
            raise RmqdumpError(f"option crc: expected one of {', '.join(rarrow.CRC_MODES)}, got {self.crc!r}")
        self.mode = str(options.get("mode", "PERMISSIVE")).upper()
        if self.mode not in MODES:
            raise RmqdumpError(f"option mode: expected one of {', '.join(MODES)}, got {options.get('mode')!r}")
        self.max_record_size = _int(options, "maxRecordSize", MAX_RECORD_SIZE)
        self.batch_size = _int(options, "batchSize", rarrow.DEFAULT_BATCH_SIZE)
        self.pushed_topics: tuple[str, ...] | None = None
        self.pushed_queue: int | None = None
        self.from_offset = _int(options, "fromOffset", None)
        self.to_offset = _int(options, "toOffset", None)
        self.pruning = Pruning(by_queues=_bool(options, "prune", True),
                               keep_going=self.keep_going or self.mode == "DROPMALFORMED")
        if self.topics:
            self.pruning.equal("topic", list(self.topics))
        if self.queue_id is not None:
            self.pruning.equal("queue_id", [self.queue_id])
        if self.from_offset is not None:
            self.pruning.bound(">=", self.from_offset)
        if self.to_offset is not None:
            self.pruning.bound("<", self.to_offset)

    def all_splits(self) -> list[rarrow.SegmentSplit]:
        """Every segment of every store, before pruning."""
        for p in self.paths:
            check_segment_file(p)
        return rarrow.segment_splits(self.paths, self.brokers)

    def partitions(self) -> list[InputPartition]:
        splits = self.all_splits()
        if _bool(self.options, "prune", True):
            splits = self.pruning.apply(splits)
        return [_Split(s) for s in splits]

    def _filter(self) -> RecordFilter | None:
        topics = self.topics
        if self.pushed_topics is not None:
            topics = tuple(t for t in topics if t in self.pushed_topics) if topics else self.pushed_topics
            if not topics:
                topics = ("\0no topic matches",)  # contradicting filters: nothing can match
        queue = self.queue_id
        if self.pushed_queue is not None:
            queue = self.pushed_queue if queue in (None, self.pushed_queue) else -(1 << 40)
        flt = RecordFilter(topics=tuple(topics), queue_id=queue, keys=self.keys)
        return None if flt.empty else flt

    def read(self, partition: InputPartition) -> Iterator:
        split = partition.split if isinstance(partition, _Split) else None
        if split is None:  # Spark's placeholder partition when there are no segments
            return iter(())
        return self._read(split)

    def _read(self, split: rarrow.SegmentSplit) -> Iterator[pa.RecordBatch]:
        reports: list[rarrow.SegmentReport] = []
        keep_going = self.keep_going or self.mode == "DROPMALFORMED"
        for batch in rarrow.read_split(split, batch_size=self.batch_size, include_body=self.include_body,
                                       decompress=self.decompress, flt=self._filter(), crc=self.crc,
                                       keep_going=keep_going, use_mmap=self.use_mmap,
                                       max_record_size=self.max_record_size, on_segment=reports.append):
            batch = self._in_range(batch)
            if batch.num_rows:
                yield pa.RecordBatch.from_arrays([*batch.columns, pa.nulls(batch.num_rows, pa.string())],
                                                 schema=SOURCE_SCHEMA)
        damage = damage_of(reports[0], keep_going) if reports else []
        damage = [(off, text) for off, text in damage if self._offset_wanted(off)]
        if not damage or self.mode == "DROPMALFORMED":
            return
        if self.mode == "FAILFAST":
            off, text = damage[0]
            raise FormatError(f"{text} (mode FAILFAST)", split.path, off - split.start)
        yield pa.RecordBatch.from_pylist(
            [{"broker": split.broker, "store": split.store, "segment": split.path, "offset": off,
              CORRUPT_COLUMN: text} for off, text in damage], schema=SOURCE_SCHEMA)


    def _offset_wanted(self, off: int) -> bool:
        return (self.from_offset is None or off >= self.from_offset) and (self.to_offset is None or off < self.to_offset)

    def _in_range(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The rows of ``batch`` within the ``fromOffset`` / ``toOffset`` options."""
        if self.from_offset is None and self.to_offset is None:
            return batch
        import pyarrow.compute as pc

        off = batch.column("offset")
        mask = None
        if self.from_offset is not None:
            mask = pc.greater_equal(off, self.from_offset)
        if self.to_offset is not None:
            upper = pc.less(off, self.to_offset)
            mask = upper if mask is None else pc.and_(mask, upper)
        return batch.filter(mask)


def damage_of(report: rarrow.SegmentReport, keep_going: bool) -> list[tuple[int, str]]:
    """(offset, text) of each damaged range a segment walk skipped and of damage that ended it."""
    out = [(start, f"{kind}: damaged bytes [{start}, {end}) skipped: {detail}")
           for start, end, kind, detail in report.skipped_ranges]
    if report.stop_kind not in _CLEAN_STOPS:
        rest = "" if keep_going else "; the rest of the segment is not read (keepGoing=true walks past damage)"
        out.append((report.stop_offset, f"{report.stop_kind}: {report.stop_detail}{rest}"))
    return out


class RocketMQPushdownReader(RocketMQReader):
    """:class:`RocketMQReader` that also prunes by pushed-down filters (Spark still re-checks them)."""

    def pushFilters(self, filters: list[Filter]):  # noqa: N802 (Spark's name)
        """Skip segments by broker / store / segment / offset / topic / queue_id (:mod:`rmqdump.spark.pruning`)
        and decode only ``topic`` / ``queue_id`` equality or IN; Spark still re-checks every filter."""
        for f in filters:
            col = f.attribute[0] if len(f.attribute) == 1 else None
            if col is not None and isinstance(f, EqualTo):
                self.pruning.equal(col, [f.value])
            elif col is not None and isinstance(f, In):
                self.pruning.equal(col, list(f.value))
            elif col == "offset":
                for op, cls in _BOUNDS.items():
                    if isinstance(f, cls):
                        self.pruning.bound(op, f.value)
            # (a value holding U+FFFD may stand for undecodable topic bytes: leave it to Spark)
            if col == "topic" and isinstance(f, EqualTo) and isinstance(f.value, str) and "\ufffd" not in f.value:
                self.pushed_topics = self._narrow(self.pushed_topics, (f.value,))
            elif col == "topic" and isinstance(f, In) and all(isinstance(v, str) and "\ufffd" not in v
                                                              for v in f.value):
                self.pushed_topics = self._narrow(self.pushed_topics, tuple(f.value))
            elif col == "queue_id" and isinstance(f, EqualTo) and isinstance(f.value, int):
                self.pushed_queue = f.value if self.pushed_queue in (None, f.value) else -(1 << 40)
            yield f

    @staticmethod
    def _narrow(current: tuple[str, ...] | None, new: tuple[str, ...]) -> tuple[str, ...]:
        return new if current is None else tuple(t for t in current if t in new)


class ConsumeQueueDataSource(DataSource):
    """``format("rocketmq_cq")``: ConsumeQueue entries of one or many stores."""

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        check_options(options, "rocketmq_cq", CQ_OPTIONS)

    @classmethod
    def name(cls) -> str:
        return "rocketmq_cq"

    def schema(self) -> StructType:
        return spark_schema(QUEUE_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        return ConsumeQueueReader(_opts(self.options))


class ConsumeQueueReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        self.paths = load_paths(options)
        self.raw = _bool(options, "raw", False)
        self.brokers = broker_map(options, self.paths)

    def partitions(self) -> list[InputPartition]:
        return [_Split(replace(s, broker=self.brokers[s.store])) for s in queue_splits(self.paths)]

    def read(self, partition: InputPartition) -> Iterator:
        if not isinstance(partition, _Split):
            return iter(())
        return read_queue(partition.split, raw=self.raw)


class IndexDataSource(DataSource):
    """``format("rocketmq_index")``: index-file entries of one or many stores."""

    def __init__(self, options: dict[str, str]):
        super().__init__(options)
        check_options(options, "rocketmq_index", INDEX_OPTIONS)

    @classmethod
    def name(cls) -> str:
        return "rocketmq_index"

    def schema(self) -> StructType:
        return spark_schema(rarrow.INDEX_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        return IndexReader(_opts(self.options))


class IndexReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        self.paths = load_paths(options)
        self.brokers = broker_map(options, self.paths)

    def partitions(self) -> list[InputPartition]:
        return [_Split(replace(s, broker=self.brokers[s.store])) for s in rarrow.index_splits(self.paths)]

    def read(self, partition: InputPartition) -> Iterator:
        if not isinstance(partition, _Split):
            return iter(())
        return rarrow.read_index(partition.split)


DATA_SOURCES = (RocketMQDataSource, ConsumeQueueDataSource, IndexDataSource)


def register_data_sources(spark) -> None:
    """Register ``rocketmq``, ``rocketmq_cq`` and ``rocketmq_index`` with a session (any session; once is
    enough, again is harmless). No configuration needed: with filter pushdown off Spark filters itself.

    Spark plans and reads Python data sources with the interpreter it had when they were registered
    (``PYSPARK_PYTHON``, else ``python3`` from PATH). On a local master with neither
    ``PYSPARK_PYTHON`` nor ``spark.pyspark.python`` set, they are registered with this interpreter,
    which can import rmqdump (a venv used by path, not activated).
    """
    sc = getattr(spark, "sparkContext", None) if not _is_connect(spark) else None
    pin = sc is not None and str(sc.master).startswith("local") and not os.environ.get("PYSPARK_PYTHON") \
        and not sc.getConf().get("spark.pyspark.python")
    old = sc.pythonExec if pin else None
    try:
        if pin:
            sc.pythonExec = sys.executable
        for ds in DATA_SOURCES:
            spark.dataSource.register(ds)
    finally:
        if pin:
            sc.pythonExec = old


def _is_connect(spark) -> bool:
    return type(spark).__module__.startswith("pyspark.sql.connect")
