"""What verifying one commitlog segment yields: :class:`SegmentResult` (findings, statistics, the
state merged across segments), the queue-offset run it keeps per queue, and the emitter that caps
findings per kind."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rmqdump.findings import INFO, Finding


@dataclass
class QueueRun:
    """Queue-offset continuity state of one topic-queue inside one segment."""

    first_queue_offset: int
    first_offset: int
    next_expected: int
    count: int = 1
    alt_expected: int = -1  # next value if the pending anomaly was a single damaged field
    pending: tuple | None = None  # (offset, file_pos, expected, got)


@dataclass
class SegmentResult:
    """Findings and statistics of one verified segment."""

    segment: str
    file: str
    start: int
    size: int
    findings: list[Finding] = field(default_factory=list)
    records: int = 0
    blanks: int = 0
    record_bytes: int = 0
    end_offset: int = 0  # end of the last valid record (or of the BLANK: the segment end)
    tail: str = "zeros"  # blank | zeros | full | damage | empty | garbage
    stop_offset: int | None = None
    stop_kind: str | None = None
    damaged: list[tuple[int, int, str]] = field(default_factory=list)
    first_damage: int | None = None
    intact_after_damage: int = 0
    intact_after_damage_offsets: list[int] = field(default_factory=list)
    topics: Counter = field(default_factory=Counter)
    min_store_timestamp: int | None = None
    max_store_timestamp: int | None = None
    first_record_store_timestamp: int | None = None
    last_record_offset: int | None = None
    blank_offset: int | None = None
    queues: dict[bytes, dict[int, QueueRun]] = field(default_factory=dict)
    half_offsets: set[int] = field(default_factory=set)
    tx_refs: list[tuple[int, int, int, int]] = field(default_factory=list)  # offset, file_pos, prepared, type
    #: compiled path, clean segments only: what the broker's recovery walk of this file would see
    #: (:func:`rmqdump.fast.recovery_walk.broker_walk_fast` reuses it instead of walking again)
    walk_summary: tuple | None = None

    def stats(self) -> dict:
        return {
            "segment": self.segment, "start": self.start, "size": self.size, "records": self.records,
            "blanks": self.blanks, "record_bytes": self.record_bytes, "end_offset": self.end_offset,
            "tail": self.tail, "damaged_ranges": len(self.damaged), "first_damage": self.first_damage,
            "intact_after_damage": self.intact_after_damage,
            "min_store_timestamp": self.min_store_timestamp, "max_store_timestamp": self.max_store_timestamp,
        }


class _Emitter:
    """Appends findings for one segment, capping each kind."""

    def __init__(self, res: SegmentResult, cap: int):
        self.res, self.cap, self.counts = res, cap, Counter()

    def __call__(self, severity: str, kind: str, offset: int | None, detail: str, file: str | None = None) -> None:
        self.counts[kind] += 1
        if self.counts[kind] <= self.cap:
            self.res.findings.append(Finding(severity, kind, file or self.res.file, offset, detail))

    def suppressed(self, label: str) -> None:
        """One ``findings_suppressed`` finding per kind that went over the cap."""
        for kind, c in self.counts.items():
            if c > self.cap:
                self.res.findings.append(Finding(INFO, "findings_suppressed", label, None,
                                                 f"{c - self.cap} more {kind} findings in this segment not listed"))
