"""What a repair changes: :class:`Change` (one file's final state) and :class:`RepairPlan`."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import MIN_RECORD_SIZE_V1_IPV4

MANIFEST = "manifest.json"


MANIFEST_FORMAT = "rmqdump-repair-backup/1"


SALVAGE_CHOICES = ("truncate", "filler", "recrc")


#: smallest record (V1, IPv4 hosts, empty topic/body/properties): the smallest filler
MIN_FILLER = MIN_RECORD_SIZE_V1_IPV4


_CHUNK = 1 << 20


@dataclass
class Change:
    """One file's change. ``write``: bytes at ``offset`` (``data``, or ``length`` zeros when
    ``data`` is None); ``create``: a new file of ``size`` bytes with ``pieces`` (or the
    non-zero extents of the staged file ``source``); ``delete``: remove the file."""

    op: str
    path: str  # relative to the store root
    offset: int = 0
    length: int = 0
    data: bytes | None = None
    size: int = 0
    pieces: list[tuple[int, bytes]] = field(default_factory=list)
    source: Path | None = None
    group: str = ""
    why: str = ""

    def to_dict(self) -> dict:
        d = {"op": self.op, "path": self.path, "group": self.group, "why": self.why}
        if self.op == "write":
            d.update(offset=self.offset, length=self.length, zero=self.data is None)
        elif self.op == "create":
            d.update(size=self.size)
        return d


@dataclass
class RepairPlan:
    """What :func:`apply_plan` would do, and why (``to_dict`` is the stable JSON form)."""

    store: Path
    mode: str = ""
    reason: str = ""
    broker_end: int | None = None  # where the broker's recovery would end the commitlog
    end: int | None = None  # where the repaired commitlog ends
    records_kept: int = 0  # the store's messages the repaired commitlog holds from the recovery start
    records_written: int = 0  # filler and tombstone records the plan writes over damage
    records_lost: int = 0  # intact records the plan discards
    broker_would_lose: int = 0  # intact records the broker's recovery would discard
    salvage_needed: bool = False
    salvage: str | None = None
    choices: list[dict] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)  # human-level actions
    changes: list[Change] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    blocked: str | None = None  # why nothing can be applied
    abort_present: bool = False
    stage_dir: Path | None = None
    prediction: object | None = None

    @property
    def needs_repair(self) -> bool:
        return bool(self.changes) or self.abort_present

    def step(self, group: str, action: str, **info) -> None:
        self.steps.append({"group": group, "action": action, **info})

    def to_dict(self) -> dict:
        pred = self.prediction
        return {
            "store": str(self.store), "mode": self.mode, "reason": self.reason, "broker_end": self.broker_end,
            "end": self.end, "records_kept": self.records_kept,
            "records_written": self.records_written, "records_lost": self.records_lost,
            "broker_would_lose": self.broker_would_lose, "salvage_needed": self.salvage_needed,
            "salvage": self.salvage, "choices": self.choices, "steps": self.steps,
            "changes": [c.to_dict() for c in self.changes],
            "bytes_changed": sum(c.length if c.op == "write" else c.size for c in self.changes),
            "warnings": self.warnings, "blocked": self.blocked, "abort_present": self.abort_present,
            "needs_repair": self.needs_repair,
            "broker_recovery": pred.to_dict() if pred is not None else None,
        }

    def cleanup(self) -> None:
        if self.stage_dir is not None:
            shutil.rmtree(self.stage_dir, ignore_errors=True)
            self.stage_dir = None
