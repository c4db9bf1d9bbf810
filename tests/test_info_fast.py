"""``info``'s end of valid data on the compiled walk (``fast.dataend``) is the pure walk's: the same end offset,
stop reason, first V2-magic record and first ``__CRC32#`` record, on every bundled store and batch size, on a
store whose CRC32 records come before its V2 ones and the other way round, and on a damaged one."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from twins import STORES, spy, store_id

from rmqdump.analysis import info
from rmqdump.codec.layout import MESSAGE_MAGIC_CODE_V2
from rmqdump.fast import dataend
from rmqdump.fast.engine import fast_available
from rmqdump.store.root import Store
from rmqdump.write.message import MessageSpec
from rmqdump.write.writer import StoreWriter

pytestmark = pytest.mark.skipif(not fast_available(), reason="numba/numpy not installed")



def _end(store: Path, monkeypatch, flag: str, batch_records: int | None) -> tuple:
    monkeypatch.setenv("RMQDUMP_FAST", flag)
    calls = spy(monkeypatch, dataend, "data_end", batch_records)
    seen: dict = {}
    end = info.data_end(Store.open(store).commitlog, seen=seen)
    return end, list(seen.items()), any(c is not None for c in calls)


def _same(store: Path, monkeypatch, batch_records: int | None = None) -> tuple:
    pure = _end(store, monkeypatch, "0", batch_records)
    fast = _end(store, monkeypatch, "1", batch_records)
    assert not pure[2] and fast[2], "each engine ran its own walk"
    assert fast[:2] == pure[:2]
    return pure


@pytest.mark.parametrize("batch_records", [None, 1, 3])
@pytest.mark.parametrize("store", STORES, ids=store_id)
def test_bundled_stores_end_alike(store, batch_records, monkeypatch):
    _same(store, monkeypatch, batch_records)


def test_store_info_documents_alike(monkeypatch):
    for store in STORES:
        docs = []
        for flag in ("0", "1"):
            monkeypatch.setenv("RMQDUMP_FAST", flag)
            docs.append(info.store_info(store))
        assert docs[0] == docs[1], store


@pytest.mark.parametrize("crc_first", [True, False])
def test_first_v2_and_crc32_records_in_walk_order(crc_first, tmp_path, monkeypatch):
    root = tmp_path / "s"
    plain = MessageSpec("T", b"x" * 50)
    v2 = MessageSpec("T", b"v", magic=MESSAGE_MAGIC_CODE_V2)
    crc = MessageSpec("T", b"c", record_crc=True)
    specs = [plain] * 45 + ([crc, plain, v2] if crc_first else [v2, plain, crc]) + [plain] * 3  # the last file
    with StoreWriter(root, commitlog_file_size=4096, build_index=False, clock=lambda: 1_700_000_000_000) as w:
        for s in specs:
            w.append(s)
        w.sync()
    for batch_records in (None, 2):
        _, seen, _ = _same(root, monkeypatch, batch_records)
        assert [name for name, _ in seen] == (["crc32", "v2"] if crc_first else ["v2", "crc32"])
    seg = sorted((root / "commitlog").iterdir())[-1]
    data = bytearray(seg.read_bytes())
    data[4:8] = b"\xde\xad\xbe\xef"
    seg.write_bytes(bytes(data))
    (end, why), _, _ = _same(root, monkeypatch, 2)
    assert not why.startswith("end_of_data")


def _blank_ended(tmp_path: Path) -> tuple[Path, list[Path]]:
    """A store of 4 KiB files whose last file was removed: the file before it, now the last, ends with a BLANK
    (``files``: as they were, the removed one last)."""
    root = tmp_path / "s"
    with StoreWriter(root, commitlog_file_size=4096, build_index=False, clock=lambda: 1_700_000_000_000) as w:
        for _ in range(50):
            w.append(MessageSpec("T", b"x" * 100))
        w.sync()
    files = sorted((root / "commitlog").iterdir())
    files[-1].unlink()
    return root, files


def test_a_gap_before_an_unwritten_file(tmp_path, monkeypatch):
    """The last file with data ends with a BLANK and the next file on disk starts past a gap, unwritten: the end
    of data stays at the BLANK's file end (the empty file adds nothing)."""
    root, files = _blank_ended(tmp_path)
    (root / "commitlog" / f"{int(files[-1].name) + 4096:020d}").write_bytes(bytes(4096))
    (end, why), _, _ = _same(root, monkeypatch, 3)
    assert end == int(files[-2].name) + 4096


def test_a_blank_ending_the_last_file(tmp_path, monkeypatch):
    """The last file ends with a BLANK and no file follows (a broker killed before creating the next one):
    RocketMQ's recovery ends at the BLANK (tests/oracle/test_write.py), and so does ``info``'s end of data (it
    said the end of the file)."""
    root, files = _blank_ended(tmp_path)
    data = files[-2].read_bytes()
    pos = 0
    while struct.unpack_from(">I", data, pos + 4)[0] != 0xCBD43194:  # records up to the BLANK
        pos += struct.unpack_from(">i", data, pos)[0]
    blank = int(files[-2].name) + pos
    for batch_records in (None, 1):
        (end, why), _, _ = _same(root, monkeypatch, batch_records)
        assert why == "end_of_data: BLANK in the last file"
        assert end == blank
