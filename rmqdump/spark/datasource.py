"""PySpark (>= 4.0) Python data sources over the core decoder.

``spark.read.format("rocketmq").load(path_or_paths)``: commitlog records, one partition
per segment, read as Arrow record batches (:data:`rmqdump.rows.arrow.RECORD_SCHEMA`).
Options: ``includeBody`` (false), ``decompress`` (false), ``topic`` (comma-separated),
``key``, ``queueId``, ``crc`` (check | flag | off), ``keepGoing`` (false), ``useMmap`` (true),
``maxRecordSize``, ``batchSize``, ``broker`` (name for a single store).
Equality / IN filters on ``topic`` (and ``queue_id``) are also pushed down into the decoder.

``rocketmq_cq``: ConsumeQueue entries (:data:`rmqdump.rows.arrow.CQ_SCHEMA`), one partition per
queue; option ``raw`` (every unit instead of the broker's recovered view).
``rocketmq_index``: index-file entries (:data:`rmqdump.rows.arrow.INDEX_SCHEMA`), one partition per file.

Paths are store roots (or commitlog directories / segment files for ``rocketmq``); executors
must see them at the same paths.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping

from pyspark.sql.datasource import DataSource, DataSourceReader, EqualTo, Filter, In, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.errors import RmqdumpError
from rmqdump.rows import arrow as rarrow
from rmqdump.rows.filters import RecordFilter

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


def _opts(options: Mapping[str, str]) -> dict[str, str]:
    """Spark hands options over case-insensitively (lower-cased keys): look them up that way."""
    return {str(k).lower(): v for k, v in options.items()}


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
    """The store paths given to ``load()``: ``path`` (one) and/or ``paths`` (a JSON list)."""
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
    return list(dict.fromkeys(out))


def spark_schema(schema) -> StructType:
    """A pyarrow schema as a Spark StructType."""
    return from_arrow_schema(schema)


class _Split(InputPartition):
    """An InputPartition carrying one of rmqdump.rows.arrow's split dataclasses."""

    def __init__(self, split):
        super().__init__(split)
        self.split = split


class RocketMQDataSource(DataSource):
    """``format("rocketmq")``: commitlog records of one or many stores."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq"

    def schema(self) -> StructType:
        return spark_schema(rarrow.RECORD_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        return RocketMQReader(_opts(self.options))


class RocketMQReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        self.paths = load_paths(options)
        broker = options.get("broker")
        if broker and len(self.paths) != 1:
            raise RmqdumpError("option broker names a single store; with several paths the directory names are used")
        self.brokers = {self.paths[0]: broker} if broker else None
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
        self.max_record_size = _int(options, "maxRecordSize", MAX_RECORD_SIZE)
        self.batch_size = _int(options, "batchSize", rarrow.DEFAULT_BATCH_SIZE)
        self.pushed_topics: tuple[str, ...] | None = None
        self.pushed_queue: int | None = None

    def pushFilters(self, filters: list[Filter]):  # noqa: N802 (Spark's name)
        """Prune by ``topic`` / ``queue_id`` equality or IN while decoding; Spark still re-checks them."""
        for f in filters:
            col = f.attribute[0] if len(f.attribute) == 1 else None
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

    def partitions(self) -> list[InputPartition]:
        return [_Split(s) for s in rarrow.segment_splits(self.paths, self.brokers)]

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
        return rarrow.read_split(split, batch_size=self.batch_size, include_body=self.include_body,
                                 decompress=self.decompress, flt=self._filter(), crc=self.crc,
                                 keep_going=self.keep_going, use_mmap=self.use_mmap,
                                 max_record_size=self.max_record_size)


class ConsumeQueueDataSource(DataSource):
    """``format("rocketmq_cq")``: ConsumeQueue entries of one or many stores."""

    @classmethod
    def name(cls) -> str:
        return "rocketmq_cq"

    def schema(self) -> StructType:
        return spark_schema(rarrow.CQ_SCHEMA)

    def reader(self, schema: StructType) -> DataSourceReader:
        return ConsumeQueueReader(_opts(self.options))


class ConsumeQueueReader(DataSourceReader):
    def __init__(self, options: dict[str, str]):
        self.paths = load_paths(options)
        self.raw = _bool(options, "raw", False)

    def partitions(self) -> list[InputPartition]:
        return [_Split(s) for s in rarrow.queue_splits(self.paths)]

    def read(self, partition: InputPartition) -> Iterator:
        if not isinstance(partition, _Split):
            return iter(())
        return rarrow.read_queue(partition.split, raw=self.raw)


class IndexDataSource(DataSource):
    """``format("rocketmq_index")``: index-file entries of one or many stores."""

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

    def partitions(self) -> list[InputPartition]:
        return [_Split(s) for s in rarrow.index_splits(self.paths)]

    def read(self, partition: InputPartition) -> Iterator:
        if not isinstance(partition, _Split):
            return iter(())
        return rarrow.read_index(partition.split)


DATA_SOURCES = (RocketMQDataSource, ConsumeQueueDataSource, IndexDataSource)


def register_data_sources(spark) -> None:
    """Register ``rocketmq``, ``rocketmq_cq`` and ``rocketmq_index`` with a session."""
    for ds in DATA_SOURCES:
        spark.dataSource.register(ds)
