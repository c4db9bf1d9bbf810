"""Export's JSONL lines: the reference (:func:`jsonl_lines`, one ``json.dumps`` per row of a record batch)
and its compiled twin (:class:`CompiledJsonl`: the compiled walk's batches rendered by
:class:`rmqdump.fast.render.JsonlRenderer`, lineage columns included), byte for byte the same.

A line is the record schema's columns in order (:data:`rmqdump.rows.arrow.RECORD_SCHEMA`): ``body``
base64 (or null), ``properties`` an object, ``store_time`` ISO 8601 with milliseconds in UTC
(``+00:00``; null outside years 1970-9999), ``json.dumps(ensure_ascii=False)`` spacing.
:func:`compiled_jsonl_applies` chooses: the compiled walk must apply to the split
(:func:`rmqdump.rows.arrow.fast_split_applies`), no tag or key filter (matched per record), and
lineage names that are valid UTF-8. Records the kernel hands back (IPv6 hosts, text that is not
UTF-8, the delay topic, bodies to decompress) are rendered by the reference in their place.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa

from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS
from rmqdump.rows.arrow import FastSplitWalk, SegmentReport, SegmentSplit, fast_split_applies
from rmqdump.rows.arrow.columns import _Columns
from rmqdump.rows.filters import RecordFilter
from rmqdump.rows.schema import BodyErrors, output_body


def jsonl_lines(batch: pa.RecordBatch) -> Iterable[str]:
    """One JSON line per row: body base64, properties an object, store_time ISO 8601 (UTC)."""
    names = batch.schema.names
    cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
    conv = {}
    if "body" in names:
        conv[names.index("body")] = lambda b: None if b is None else base64.b64encode(b).decode("ascii")
    if "properties" in names:
        conv[names.index("properties")] = lambda p: None if p is None else dict(p)
    if "store_time" in names:
        conv[names.index("store_time")] = lambda t: None if t is None else t.isoformat(timespec="milliseconds")
    for i, f in conv.items():
        cols[i] = [f(v) for v in cols[i]]
    for row in zip(*cols, strict=True):
        yield json.dumps(dict(zip(names, row, strict=True)), ensure_ascii=False)


def lineage_tail(split: SegmentSplit) -> bytes | None:
    """The JSON of a split's lineage columns as the kernel appends it after ``body`` (``, "broker": ...``
    up to ``, "crc_ok": ``), or None when a name is not valid UTF-8 (a surrogate-escaped path)."""
    text = json.dumps({"broker": split.broker, "store": split.store, "segment": split.path}, ensure_ascii=False)
    try:
        return (", " + text[1:-1] + ', "crc_ok": ').encode("utf-8")
    except UnicodeEncodeError:
        return None


def compiled_jsonl_applies(split: SegmentSplit, *, flt: RecordFilter | None = None, crc: str = "check",
                           keep_going: bool = False, use_mmap: bool = True, fast: bool | None = None) -> bool:
    """Whether :class:`CompiledJsonl` writes this split (see the module docs)."""
    return fast_split_applies(split, fast=fast, flt=flt, crc=crc, keep_going=keep_going, use_mmap=use_mmap) \
        and lineage_tail(split) is not None


class CompiledJsonl:
    """Writes splits as export JSONL lines to ``write`` (a binary writer) with the compiled renderer.
    :meth:`close` stops its worker threads."""

    def __init__(self, write: Callable[[Any], Any], *, include_body: bool = False, decompress: bool = False,
                 delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS):
        from rmqdump.fast import render as fastrender
        from rmqdump.fast import walk as fastwalk

        self.include_body = include_body
        self.decompress = decompress
        self.delay = delay_levels_ms
        self._split: SegmentSplit | None = None
        self._errors = BodyErrors()
        mode = fastrender.MODE_BASE64 if include_body else fastrender.MODE_NONE
        self.renderer = fastrender.JsonlRenderer(write, self._render, mode, decompress and include_body,
                                                 jobs=min(fastwalk.default_jobs(), 4))

    def _render(self, m) -> bytes:
        """A line by the reference, for a record the kernel hands back."""
        split = self._split
        cols = _Columns(split.broker, split.store, split.path, self.delay)
        cols.add(m, output_body(m, self.decompress, self._errors) if self.include_body else None, m.crc_ok)
        (line,) = jsonl_lines(cols.to_batch())
        return (line + "\n").encode("utf-8")

    def write_split(self, split: SegmentSplit, *, flt: RecordFilter | None = None, crc: str = "check",
                    max_record_size: int, on_segment: Callable[[SegmentReport], None] | None = None,
                    progress: Callable[[int], None] | None = None) -> int:
        """Write the records of one split; ``progress(bytes of the split done)``. Returns the lines written."""
        tail = lineage_tail(split)
        if tail is None:
            raise ValueError("lineage names are not valid UTF-8: use the reference (compiled_jsonl_applies)")
        self._split = split
        self._errors = BodyErrors()
        self.renderer.set_tail(tail)
        flt = None if flt is None or flt.empty else flt
        rows = 0
        walk = FastSplitWalk(split, crc=crc, max_record_size=max_record_size)
        for rb in walk:
            select = None if flt is None else flt.batch_mask(rb)
            rows += self.renderer.write_batch(rb, select)
            if progress is not None and rb.n:
                progress(int(rb["file_pos"][-1]) + int(rb["size"][-1]))
        if on_segment is not None:
            on_segment(walk.report(rows, self._errors))
        return rows

    def close(self) -> None:
        self.renderer.close()
