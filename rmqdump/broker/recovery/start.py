"""What stops the broker's start besides its store's ``load()``: the files ``BrokerController`` loads around it.

Read from ``BrokerController.initialize`` (4.9.8; 5.3.3: ``initializeMetadata``, ``initializeMessageStore``,
``recoverAndInitService``) and 4.9.8's ``DefaultMessageStore.load``:

* **before the store loads** (its recovery never runs): the config tables of ``ConfigManager.load`` (a table
  fails only when its file is missing, empty or bad and its ``.bak`` holds bytes that do not decode:
  :func:`rmqdump.store.config.load_fails`), the ones each version's controller loads (a table 5.x keeps in
  RocksDB is read from there, not from its JSON); on 5.x a ``timerwheel`` of another non-zero length (the
  ``TimerWheel`` constructor throws in ``initializeMessageStore``);
* **after the store's recovery ran**: ``delayOffset.json`` (4.9.8 loads it at the end of the store's own
  ``load()``, 5.x after the timer store); on 5.x the timer store's ``load()`` (``timerWheelEnable`` is true by
  default): a timerlog file its ``MappedFileQueue.load`` fails on, ``config/timermetrics`` that fails as a
  config table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rmqdump.broker.recovery.inputs import VERSION_49
from rmqdump.codec.layout import STORE_CONFIG_DIR, STORE_TIMERLOG_DIR, STORE_TIMERWHEEL_FILE, TIMER_WHEEL_SIZE
from rmqdump.errors import RmqdumpError
from rmqdump.store import config as sc

#: the tables each version's ``BrokerController`` loads before its store, in its order: (file, decoder, RocksDB
#: table or None; a store holding that RocksDB table was written by a 5.x broker that reads the table from there)
_TOPICS = (sc.TOPICS_JSON, sc.decode_topics, "topics")
_OFFSETS = (sc.CONSUMER_OFFSET_JSON, sc.decode_consumer_offsets, "consumerOffsets")
_GROUPS = (sc.SUBSCRIPTION_GROUP_JSON, sc.decode_subscription_groups, "subscriptionGroups")
_FILTERS = (sc.CONSUMER_FILTER_JSON, sc.keep, None)
_TABLES_49 = (_TOPICS, _OFFSETS, _GROUPS, _FILTERS)
_TABLES_5X = (_TOPICS, ("topicQueueMapping.json", sc.keep, None), _OFFSETS, _GROUPS, _FILTERS,
              ("consumerOrderInfo.json", sc.keep, None))

_TABLE_FAILS = "it and its .bak do not decode: ConfigManager.load fails"
BEFORE, AFTER = "before the store loads", "after the store's recovery"


@dataclass(frozen=True)
class StartFailure:
    """A file the broker's start fails on; ``before_store``: it stops before its store loads (no recovery)."""

    file: str  # relative to the store root
    reason: str
    before_store: bool

    def to_dict(self) -> dict:
        return {"file": self.file, "reason": self.reason, "stage": BEFORE if self.before_store else AFTER}


def start_failures(root: str | os.PathLike, version: str) -> list[StartFailure]:
    """Why the broker's start fails on the files around its store (empty: none does); see the module docstring."""
    r = Path(root)
    out: list[StartFailure] = []
    cdir = r / STORE_CONFIG_DIR
    for name, decode, table in _TABLES_49 if version == VERSION_49 else _TABLES_5X:
        if table is not None and _in_rocksdb(r, table):
            continue
        if _table_fails(cdir / name, decode):
            out.append(StartFailure(f"{STORE_CONFIG_DIR}/{name}", _TABLE_FAILS, True))
    if version != VERSION_49:
        wheel = r / STORE_TIMERWHEEL_FILE
        try:
            size = wheel.stat().st_size if wheel.is_file() else 0
        except OSError:
            size = 0
        if size not in (0, TIMER_WHEEL_SIZE):
            out.append(StartFailure(STORE_TIMERWHEEL_FILE, f"{size} bytes, not {TIMER_WHEEL_SIZE}: the TimerWheel "
                                                           "constructor throws", True))
        out += _timer_load(r)
    if _table_fails(cdir / sc.DELAY_OFFSET_JSON, sc.decode_delay_offsets):
        out.append(StartFailure(f"{STORE_CONFIG_DIR}/{sc.DELAY_OFFSET_JSON}",
                                f"{_TABLE_FAILS} (the schedule service's load)", False))
    return out


def loaded_at_start(root: str | os.PathLike, name: str) -> bool:
    """Whether a broker of either version loads ``config/<name>`` at start as a ``ConfigManager`` table whose
    failure stops it (a table kept in RocksDB is read from there instead)."""
    for n, _, table in (*_TABLES_5X, (sc.DELAY_OFFSET_JSON, sc.decode_delay_offsets, None)):  # 5.x's hold 4.9's
        if n == name:
            return table is None or not _in_rocksdb(Path(root), table)
    return False


def _timer_load(r: Path) -> list[StartFailure]:
    """``TimerMessageStore.load()``'s failures: its timerlog's ``MappedFileQueue.load``, ``TimerMetrics.load``."""
    from rmqdump.store.timer.log import TimerLog
    from rmqdump.store.timer.metrics import timer_metrics_load_fails

    out: list[StartFailure] = []
    if (r / STORE_TIMERLOG_DIR).is_dir():
        try:
            log = TimerLog.open(r / STORE_TIMERLOG_DIR)
        except RmqdumpError:
            log = None
        for name in log.refusals if log is not None else ():
            out.append(StartFailure(f"{STORE_TIMERLOG_DIR}/{name}", "the timerlog's MappedFileQueue.load fails on "
                                                                    "it: TimerMessageStore.load() fails", False))
    if timer_metrics_load_fails(r):
        out.append(StartFailure(f"{STORE_CONFIG_DIR}/timermetrics", f"{_TABLE_FAILS}: TimerMessageStore.load() "
                                                                    "fails", False))
    return out


def _table_fails(path: Path, decode) -> bool:
    try:
        return sc.load_fails(path, decode)
    except OSError:
        return False


def _in_rocksdb(root: Path, table: str) -> bool:
    from rmqdump.store.rocksdb.config import read_config_table

    try:
        return read_config_table(root, table) is not None
    except (RmqdumpError, OSError):
        return False


def describe(failures: list[dict]) -> str:
    """One line from :meth:`StartFailure.to_dict` items: why the broker does not start, and whether its store's
    recovery runs first."""
    f = failures[0]
    more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
    when = ("the broker stops before its store loads: none of this recovery runs until that is fixed"
            if f["stage"] == BEFORE else "the store's load and this recovery run, then the broker stops")
    return f"does not start — {f['file']}: {f['reason']}{more}; {when}"
