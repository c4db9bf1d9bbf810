"""``write.repair.expired``: where a rebuilt queue's own units begin, past the placeholders its writer put before
them (whole compared chunks, then unit by unit)."""

from __future__ import annotations

import pytest

from rmqdump.codec.layout import CQ_UNIT
from rmqdump.store.consumequeue.entries import PRE_BLANK_ENTRY
from rmqdump.write.repair import expired

UNIT = CQ_UNIT.pack(4096, 100, 7)


@pytest.mark.parametrize("placeholders", [0, 1, 4095, 4096, 4097, 9000, 12288])
def test_first_rebuilt_unit_past_any_number_of_placeholders(placeholders, tmp_path):
    units = 12288
    qdir = tmp_path / "q"
    qdir.mkdir()
    start = 3 * units * 20
    body = PRE_BLANK_ENTRY * placeholders + UNIT * (units - placeholders)
    (qdir / f"{start:020d}").write_bytes(body)
    assert expired._first_rebuilt(qdir, units * 20) == 3 * units + placeholders


def test_no_rebuilt_file(tmp_path):
    assert expired._first_rebuilt(tmp_path / "none", 60) is None
