"""The compiled properties scan that lets verify's kernels clear a record without Python:
``_recordkernels.props_scan`` gives the shape, ASCII, ``__CRC32#`` and ``INNER_NUM`` checks of
``record_checks`` and the TAGS hash the CQ join compares, each checked against its reference on random
property strings built from the awkward pieces."""

from __future__ import annotations

import random

import numpy as np
import pytest

pytest.importorskip("numba")

from rmqdump.analysis.verify.record_checks import _PROPS_OK  # noqa: E402
from rmqdump.codec.javahash import java_string_hash  # noqa: E402
from rmqdump.codec.properties import parse_properties  # noqa: E402

PIECES = [b"TAGS", b"KEYS", b"a", b"xyz", b"\x01", b"\x01", b"\x02", b"\x02", b"\x00", b"__CRC32#", b"INNER_NUM",
          b"\x80", b"\xc3\xa9", b"T", b"\x01\x01", b"\x02\x02", b"\x03", b"\x7f", b"M", b"#", b"TAGS\x01",
          b"_CRC32#", b"NNER_NUM"]


def _samples(n: int = 6000) -> list[bytes]:
    rng = random.Random(15)
    out = [b"", b"TAGS\x01a", b"TAGS\x01a\x02", b"TAGS\x01\x02KEYS\x01k", b"INNER_NUM\x012", b"__CRC32#\x010001",
           b"TAGS\x01x\x02TAGS\x01y", b"TAGS\x01x\x02TAGS\x01", b"TAGS\x01\x01x", b"\x01a", b"a\x01", b"a\x01b\x02\x02"]
    for _ in range(n):
        out.append(b"".join(rng.choice(PIECES) for _ in range(rng.randint(1, 9))))
    return out


def _props_reference(raw: bytes) -> int:
    if not raw:
        return 0
    if not raw.isascii() or _PROPS_OK(raw) is None or b"__CRC32#\x01" in raw:
        return -1
    return 1 if b"INNER_NUM\x01" in raw else 0


def test_props_check_matches_record_checks():
    from rmqdump.fast._recordkernels import props_scan

    for raw in _samples():
        # neighbours outside the field that would complete a key ending at its first \x01
        before = b"\x05__CRC32#INNER_NUM"
        buf = np.frombuffer(before + raw + b"\x01\x02", dtype=np.uint8)
        assert props_scan(buf, len(before), len(raw))[0] == _props_reference(raw), raw


def test_tags_hash_matches_parse_properties():
    from rmqdump.fast._recordkernels import props_scan
    from rmqdump.fast.abi import NOT_ASCII

    for raw in _samples():
        buf = np.frombuffer(b"\x02TAGS\x01" + raw + b"\x02x", dtype=np.uint8)
        got = props_scan(buf, 6, len(raw))[1]
        if not raw.isascii():
            assert got == NOT_ASCII, raw
            continue
        tags = parse_properties(raw.decode("ascii")).get("TAGS")
        assert got == (java_string_hash(tags) if tags else 0), raw
