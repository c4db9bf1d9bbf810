"""The Spark export of a segment cut into ranges (rmqdump.spark.ranges), run without Spark: the driver's own
code (plan, join with proof, the walk of the rest, dropped outputs removed) with the executor task run in
this process. Its rows, files and segment reports are the single-process export's, on segments whose split
points land inside records (fake headers in bodies: the rest is walked again), behind damage and at a
BLANK, for Parquet, the compiled JSONL lines and a partitioned layout, on both walks."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_segment_split import image, segment

from rmqdump.codec.encoder import encode_blank
from rmqdump.fast import segment_split as ss
from rmqdump.fast import walk as fastwalk
from rmqdump.rows import arrow as rarrow
from rmqdump.rows.export import export as local_export
from rmqdump.spark import ranges
from rmqdump.spark.jobs import _export_task

FAST = [False, True] if fastwalk.fast_available() else [False]
SIZE = 256 * 1024


@pytest.fixture(autouse=True)
def _small_segments_split(monkeypatch):
    monkeypatch.setattr(ss, "SPLIT_MIN_BYTES", 1)


def ranged_export(store: Path, out: Path, k: int, fmt: str = "parquet", partition_by: tuple[str, ...] = (),
                  **opts) -> tuple[list, list[list]]:
    """``jobs.export``'s driver over ``store`` with ``k`` cores, its tasks run here: (segments, rounds)."""
    out.mkdir()
    rounds: list[list] = []

    def run(runs):
        rounds.append(list(runs))
        return list(_export_task(str(out), fmt, partition_by, "zstd", {"batch_size": 8192, **opts}, 1, iter(runs)))

    segments, _ = ranges.run_joined(rarrow.segment_splits([str(store)]), k, opts, run, out)
    return segments, rounds


def rows_of(files: list[Path], fmt: str) -> list[dict]:
    if fmt == "jsonl":
        rows = [json.loads(line) for f in files for line in f.read_text().splitlines()]
    else:
        rows = pa.concat_tables([pq.read_table(f) for f in files]).to_pylist()
    return sorted(rows, key=lambda r: r["offset"])


def tree(out: Path, fmt: str = "parquet") -> list[Path]:
    return sorted(out.rglob(f"*.{fmt}"))


def store_of(tmp_path: Path, data: bytes) -> Path:
    root = tmp_path / "store"
    segment(root, data)
    return root


def check(store: Path, tmp_path: Path, k: int, fmt: str = "parquet", **opts) -> tuple[list, list[list]]:
    """The ranged export equals the single-process export: rows, report; returns (segments, rounds)."""
    segments, rounds = ranged_export(store, tmp_path / "ranged", k, fmt, **opts)
    local = local_export(str(store), tmp_path / f"local.{fmt}", **opts)
    assert rows_of(tree(tmp_path / "ranged", fmt), fmt) == rows_of([tmp_path / f"local.{fmt}"], fmt)
    assert [ranges.merge_reports([r for o in kept for r in o[3]]) for kept in segments] == local.reports
    assert sum(o[2] for kept in segments for o in kept) == local.rows > 0
    kept_files = {f.path for kept in segments for o in kept for f in o[4]}
    assert {str(p) for p in tree(tmp_path / "ranged", fmt)} == kept_files  # dropped outputs deleted
    return segments, rounds


@pytest.mark.parametrize("fast", FAST)
def test_links_close_on_true_boundaries(tmp_path, fast):
    data, _ = image(SIZE)
    segments, rounds = check(store_of(tmp_path, data), tmp_path, 3, fast=fast)
    assert len(rounds) == 1 and len(rounds[0]) == 3  # three ranges, every link closed: nothing walked again
    assert [len(kept) for kept in segments] == [3]


@pytest.mark.parametrize("fast", FAST)
@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_split_inside_a_record_walks_the_rest_again(tmp_path, fast, fmt):
    data, starts = image(SIZE, fake=True)
    store = store_of(tmp_path, data)
    plan = ranges.plan(rarrow.segment_splits([str(store)]), 3, {})
    assert any(p.range_start not in starts for p in plan)  # the header scan found a fake header in a body
    segments, rounds = check(store, tmp_path, 3, fmt, fast=fast)
    assert len(rounds) == 2 and len(rounds[1]) == 1 and rounds[1][0].range_end is None
    assert rounds[1][0].range_start in starts


def test_partitioned_layout_has_no_dropped_directories(tmp_path):
    data, _ = image(SIZE, fake=True)
    store = store_of(tmp_path, data)
    _, rounds = ranged_export(store, tmp_path / "ranged", 3, partition_by=("topic", "date"))
    assert len(rounds) == 2
    local_export(str(store), tmp_path / "local", partition_by="topic,date")
    layout = {p.parent.relative_to(tmp_path / "ranged") for p in tree(tmp_path / "ranged")}
    assert layout == {p.parent.relative_to(tmp_path / "local") for p in tree(tmp_path / "local")}
    assert rows_of(tree(tmp_path / "ranged"), "parquet") == rows_of(tree(tmp_path / "local"), "parquet")
    assert all(any(d.iterdir()) for d in (tmp_path / "ranged").rglob("*") if d.is_dir())


@pytest.mark.parametrize("fast", FAST)
def test_damage_in_a_range_ends_the_segment_there(tmp_path, fast):
    data, starts = image(SIZE)
    i = next(i for i in range(len(starts) // 6, len(starts)) if starts[i + 1] - starts[i] > 600)
    bad = starts[i]  # inside the first of three ranges
    data[bad + 300] ^= 0xFF  # a body byte (bodies start ~100 bytes in): BODYCRC mismatch
    segments, rounds = check(store_of(tmp_path, data), tmp_path, 3, fast=fast)
    assert len(rounds) == 1 and [len(kept) for kept in segments] == [1]
    assert segments[0][0][3][0].stop_offset == bad


@pytest.mark.parametrize("fast", FAST)
def test_blank_ends_the_segment(tmp_path, fast):
    data, starts = image(SIZE)
    cut = starts[len(starts) // 2]
    data[cut:] = encode_blank(SIZE - cut) + bytes(SIZE - cut - 8)
    segments, _ = check(store_of(tmp_path, data), tmp_path, 3, fast=fast)
    assert ranges.merge_reports([r for o in segments[0] for r in o[3]]).stop_kind == "blank"


def test_keep_going_and_many_segments_are_not_cut(tmp_path):
    data, _ = image(SIZE)
    splits = rarrow.segment_splits([str(store_of(tmp_path, data))])
    assert len(ranges.plan(splits, 3, {})) == 3
    assert ranges.plan(splits, 3, {"keep_going": True}) == splits
    assert ranges.plan(splits, 1, {}) == splits
