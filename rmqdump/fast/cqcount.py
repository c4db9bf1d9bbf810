"""Numpy twin of the per-unit count behind ``rmqdump cq``'s queue summary (``analysis.dumps.unit_counts``): the
``fillPreBlank`` placeholders and the invalid units of a queue's broker view, and where the first invalid ones sit,
a chunk of units at a time instead of an object per unit."""

from __future__ import annotations

from collections.abc import Iterable

from rmqdump.codec.layout import CQ_PRE_BLANK_SIZE
from rmqdump.fast.cqjoin import cq_dtype
from rmqdump.fast.engine import _numpy


def unit_counts(chunks: Iterable[tuple[int, bytes]], listed: int) -> tuple[int, int, list[int]]:
    """(placeholders, invalid units, queue offsets of the first ``listed`` invalid ones) of ``chunks``:
    (queue offset of the first unit, whole 20-byte units) as ``ConsumeQueue.entry_chunks`` yields them."""
    np = _numpy()
    dtype = cq_dtype()
    pre_blank = invalid = 0
    where: list[int] = []
    for base, chunk in chunks:
        u = np.frombuffer(chunk, dtype)
        phys, size = u["phys"], u["size"]
        pre = (phys == 0) & (size == CQ_PRE_BLANK_SIZE)
        bad = ~pre & ((phys < 0) | (size <= 0))
        pre_blank += int(np.count_nonzero(pre))
        n_bad = int(np.count_nonzero(bad))
        invalid += n_bad
        if n_bad and len(where) < listed:
            where += [base + int(i) for i in np.flatnonzero(bad)[:listed - len(where)]]
    return pre_blank, invalid, where
