"""Export tasks over ranges of a segment, joined with proof.

When a job has fewer segments than the session has cores, :func:`plan` cuts each large segment into
ranges (:func:`rmqdump.rows.arrow.range_splits`: split points from the ConsumeQueue, else a header scan),
one task each. A split point is a guess: :func:`join` keeps a range's output only if the walk of the range
before it stopped exactly at its start (a walk from a true record boundary is deterministic, so then the
range's rows are the serial walk's); otherwise it drops that output and every later one of the segment and
asks for one walk from where the previous range really stopped to the segment's end. A range that ends
before its limit (damage, zeros, a BLANK) ends the segment, as it ends the serial walk: later ranges are
dropped. The kept rows are those of one walk per segment, whatever the split points were.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.errors import RmqdumpError
from rmqdump.rows import arrow as rarrow
from rmqdump.rows.schema import BodyErrors
from rmqdump.store.dledger.files import is_dledger_segment

#: One task's outcome: ("ok", index, rows, reports, files, timing) or ("error", index, message).
Outcome = tuple


def plan(splits: Sequence[rarrow.SegmentSplit], parallelism: int, read_options: dict) -> list[rarrow.SegmentSplit]:
    """The splits to run: each segment cut into ``ceil(parallelism / segments)`` ranges when that is more
    than one, else ``splits``. Never with ``keep_going`` (its walk steps over damage: where it stops is no
    proof) nor in a DLedger segment (its walk cannot start at a record header inside an entry)."""
    if not splits or len(splits) >= parallelism or read_options.get("keep_going"):
        return list(splits)
    k = -(-parallelism // len(splits))
    max_record_size = read_options.get("max_record_size") or MAX_RECORD_SIZE
    out: list[rarrow.SegmentSplit] = []
    for s in splits:
        parts = [s] if is_dledger_segment(s.segment()) else rarrow.range_splits(s, k, max_record_size=max_record_size)
        base = len(out)
        out.extend(dataclasses.replace(p, index=base + i) for i, p in enumerate(parts))
    return out


def run_joined(splits: Sequence[rarrow.SegmentSplit], parallelism: int, read_options: dict,
               run: Callable[[list[rarrow.SegmentSplit]], list[Outcome]], root: str | os.PathLike
               ) -> tuple[list[list[Outcome]], list[Outcome]]:
    """Run the export tasks of ``splits`` (``run``: the tasks' outcomes, any order) as :func:`plan` cuts them,
    join them with proof, run the walks the join asks for, delete the dropped outputs under ``root``.
    Returns the kept outcomes per segment (in order) and every outcome. Raises the first error kept."""
    runs = plan(splits, parallelism, read_options)
    outcomes = run(runs)
    joined = join(runs, outcomes)
    if joined.rewalks:  # a split point inside a record: the rest of its segment, walked whole
        more = run([r for _, r in joined.rewalks])
        by_index = {o[1]: o for o in more}
        for number, r in joined.rewalks:
            joined.segments[number].append(by_index[r.index])
        outcomes = [*outcomes, *more]
    errors = [o for kept in joined.segments for o in kept if o[0] == "error"]
    if errors:
        raise RmqdumpError(f"export failed for {len(errors)} segment(s); first: {errors[0][2]}")
    remove_outputs(joined.dropped_files, root)
    return joined.segments, sorted(outcomes, key=lambda o: o[1])


@dataclass
class Joined:
    """What :func:`join` kept: per segment (in split order) the kept outcomes, the files of dropped outputs,
    and the walks still to run: (segment number, split of the rest of that segment from where its last kept
    range really stopped), whose outcomes end their segment's list."""

    segments: list[list[Outcome]] = field(default_factory=list)
    dropped_files: list[str] = field(default_factory=list)
    rewalks: list[tuple[int, rarrow.SegmentSplit]] = field(default_factory=list)


def join(splits: Sequence[rarrow.SegmentSplit], outcomes: Sequence[Outcome]) -> Joined:
    """Keep the outcomes one serial walk per segment would have produced (module docstring)."""
    by_index = {o[1]: o for o in outcomes}
    groups: dict[tuple[str, str], list[rarrow.SegmentSplit]] = {}
    for s in splits:
        groups.setdefault((s.store, s.path), []).append(s)
    res = Joined()
    next_index = max((s.index for s in splits), default=-1) + 1
    for number, parts in enumerate(groups.values()):
        parts.sort(key=lambda s: s.range_start)
        kept: list[Outcome] = []
        cursor = parts[0].range_start
        ended = False
        for s in parts:
            out = by_index[s.index]
            if ended or s.range_start != cursor:
                if out[0] == "ok":
                    res.dropped_files.extend(f.path for f in out[4])
                if not ended:  # the split point was inside a record: the serial walk goes on from the cursor
                    res.rewalks.append((number, dataclasses.replace(s, range_start=cursor, range_end=None,
                                                                    index=next_index)))
                    next_index += 1
                    ended = True
                continue
            kept.append(out)
            if s.range_end is None or out[0] != "ok":
                ended = True  # the segment's last range, or an error (raised: the serial walk meets it too)
                continue
            if not out[3] or out[3][0].stop_kind != "limit":
                ended = True  # damage, zeros or a BLANK before the limit end the serial walk here
                continue
            cursor = out[3][0].stop_offset - s.start
        res.segments.append(kept)
    return res


def remove_outputs(paths: Sequence[str], root: str | os.PathLike) -> None:
    """Delete dropped output files, and the partition directories under ``root`` they leave empty."""
    top = Path(root).resolve()
    for name in paths:
        p = Path(name)
        p.unlink(missing_ok=True)
        d = p.parent.resolve()
        while d != top and top in d.parents:
            try:
                d.rmdir()
            except OSError:  # not empty
                break
            d = d.parent


def merge_reports(parts: Sequence[rarrow.SegmentReport]) -> rarrow.SegmentReport:
    """One report from the kept ranges of one segment (in order): how the serial walk ended."""
    if len(parts) == 1:
        return parts[0]
    last = parts[-1]
    return rarrow.SegmentReport(
        parts[0].segment, sum(p.records for p in parts), sum(p.rows for p in parts), last.stop_kind,
        last.stop_offset, last.stop_detail, sum(p.skipped for p in parts), sum(p.body_errors for p in parts),
        tuple(e for p in parts for e in p.body_error_first)[:BodyErrors.LIMIT],
        tuple(r for p in parts for r in p.skipped_ranges))
