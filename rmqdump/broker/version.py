"""Which broker versions can read a store, and refusing records its broker cannot read.

A 4.x broker knows only the V1 magic: its recovery stops at the first V2-magic record
(0xDAA320AB, 2-byte topic length, written by 5.1+ for topics over 127 UTF-16 units) and
truncates the commitlog there, dropping that record and every later one. So before
rmqdump writes a V2 record it needs evidence that a 5.x broker owns the store:

* a V2-magic record already in the store (only 5.x writes them; found by the 4.9 recovery
  walk of :func:`rmqdump.broker.recovery.predict_recovery_auto`), or
* a file or directory only a 5.x broker creates (:data:`FIVE_X_ONLY_PATHS`), or
* the user's word (``--broker-version 5``).

Not evidence (weak): ``abort.bak`` and a PID in ``abort`` (they tell that a 5.x broker
started on the store once, not which broker will read it next), checkpoint bytes 24–39
(0 on disk after a clean 5.x shutdown), ``__CRC32#`` properties (rmqdump itself writes
them with ``--record-crc``). :func:`rmqdump.broker.recovery.predict_recovery_auto` — the model
``verify`` applies — uses the same evidence, so rmqdump's own writes never change it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rmqdump.errors import UnsupportedError

#: paths under the store root that only a 5.x broker creates (format note §1, and what
#: RocketMQ 5.3.3's store code leaves: ``batchconsumequeue/`` for BatchCQ topics, the timer
#: store's ``timerwheel``/``timerlog/``/``config/timercheck``/``config/timermetrics``,
#: ``compaction/position-checkpoint`` (default ``enableCompaction=true``), controller mode)
FIVE_X_ONLY_PATHS = ("batchconsumequeue", "timerlog", "timerwheel", "config/timercheck", "config/timermetrics",
                     "compaction", "epochFileCheckpoint", "brokerIdentity")

BROKER_4 = "4.9"
BROKER_5 = "5"
#: ``--broker-version`` choices of ``append`` (5.3 is accepted as a spelling of 5)
APPEND_CHOICES = ("auto", BROKER_4, BROKER_5, "5.3")


def five_x_files(root: str | os.PathLike | None) -> list[str]:
    """The :data:`FIVE_X_ONLY_PATHS` present under ``root`` (any file type; symlinks not followed)."""
    if root is None:
        return []
    out = []
    for rel in FIVE_X_ONLY_PATHS:
        try:
            os.lstat(Path(root) / rel)
        except OSError:
            continue
        out.append(rel)
    return out


def five_x_files_reason(files: list[str]) -> str:
    return f"5.x: {files[0]} exists (only a 5.x broker creates it)"


@dataclass(frozen=True)
class BrokerVersion:
    """The oldest broker line that must be able to read the store, and why."""

    version: str  # BROKER_4 or BROKER_5
    reason: str
    explicit: bool = False

    @property
    def reads_v2(self) -> bool:
        return self.version == BROKER_5


def normalise(requested: str | None) -> str:
    """``auto``, ``4.9`` or ``5`` from the option's spellings."""
    if requested in (None, "auto"):
        return "auto"
    if requested in ("4", "4.9", "4.x"):
        return BROKER_4
    if requested in ("5", "5.3", "5.x"):
        return BROKER_5
    raise ValueError(f"unknown broker version {requested!r} (auto, 4.9 or 5)")


def resolve(requested: str | None, *, model_version: str | None, model_reason: str | None,
            root: str | os.PathLike | None) -> BrokerVersion:
    """The store's broker version: ``requested`` if explicit, else what the auto model found
    (``model_version`` "5.3" = a V2 record or a 5.x-only file), else the 5.x-only files of a
    store with no commitlog yet, else 4.x."""
    v = normalise(requested)
    if v != "auto":
        return BrokerVersion(v, f"--broker-version {requested}", explicit=True)
    if model_version is not None and model_version != BROKER_4:
        return BrokerVersion(BROKER_5, model_reason or "5.x recovery model")
    files = five_x_files(root)
    if files:
        return BrokerVersion(BROKER_5, five_x_files_reason(files))
    return BrokerVersion(BROKER_4, "no V2-magic record and no file only a 5.x broker creates")


class BrokerVersionError(UnsupportedError):
    """A record the store's broker version cannot read (nothing was written)."""


def refuse_v2(topic: str, bv: BrokerVersion, where: str = "") -> BrokerVersionError:
    units = len(topic.encode("utf-16-le", "surrogatepass")) // 2
    return BrokerVersionError(
        f"{where}refusing to write a V2-magic record (topic of {units} UTF-16 units > 127): a 4.x broker cannot "
        f"read it — its recovery would truncate the commitlog there, dropping it and every later record — and "
        f"this store's broker is taken to be {bv.version} ({bv.reason}); nothing was written; use a topic of at "
        f"most 127 characters, or pass --broker-version 5 if a 5.1+ broker owns this store")


__all__ = ["APPEND_CHOICES", "BROKER_4", "BROKER_5", "BrokerVersion", "BrokerVersionError", "FIVE_X_ONLY_PATHS",
           "five_x_files", "five_x_files_reason", "normalise", "refuse_v2", "resolve"]
