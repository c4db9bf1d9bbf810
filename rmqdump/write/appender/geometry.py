"""The file sizes of a store to append to (:class:`StoreGeometry`), read from its files; refusing to guess the
ConsumeQueue file size."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from rmqdump.codec.layout import (
    MAPPED_FILE_SIZE_COMMITLOG,
    MAPPED_FILE_SIZE_CONSUME_QUEUE,
    MAX_HASH_SLOT_NUM,
    MAX_INDEX_NUM,
    STORE_COMMITLOG_DIR,
)
from rmqdump.errors import StoreError


@dataclass(frozen=True)
class StoreGeometry:
    """File sizes a store uses (the broker refuses files of any other size)."""

    commitlog_file_size: int = MAPPED_FILE_SIZE_COMMITLOG
    cq_file_size: int = MAPPED_FILE_SIZE_CONSUME_QUEUE
    index_slots: int = MAX_HASH_SLOT_NUM
    index_entries: int = MAX_INDEX_NUM


def store_geometry(root: str | os.PathLike, *, commitlog_file_size: int | None = None, cq_file_size: int | None = None,
                   index_slots: int | None = None, index_entries: int | None = None) -> StoreGeometry:
    """The geometry of an existing store, read from its files; explicit values win, defaults fill gaps."""
    from rmqdump.store.commitlog import CommitLog
    from rmqdump.store.consumequeue import infer_store_cq_file_size
    from rmqdump.store.indexfile import infer_geometry, list_index_files

    root = Path(root)
    if commitlog_file_size is None and _has_segments(root):
        commitlog_file_size = CommitLog.open(root / STORE_COMMITLOG_DIR).file_size or None
    if cq_file_size is None:
        cq_file_size = infer_store_cq_file_size(root)
    if index_slots is None or index_entries is None:
        files = [f for f in list_index_files(root) if f.stat().st_size]  # zero-length: a crash artefact
        if files:
            geo = infer_geometry(files[-1].stat().st_size, index_slots, index_entries, files[-1])
            index_slots, index_entries = geo.hash_slot_num, geo.index_num
    d = StoreGeometry()
    return StoreGeometry(commitlog_file_size or d.commitlog_file_size, cq_file_size or d.cq_file_size,
                         index_slots or d.index_slots, index_entries or d.index_entries)


def require_cq_file_size(root: str | os.PathLike) -> None:
    """Refuse to guess the ConsumeQueue file size of an existing store none of whose CQ files tells it:
    a file of another size than the broker's mappedFileSizeConsumeQueue stops the broker from starting."""
    from rmqdump.store.consumequeue import infer_store_cq_file_size

    root = Path(root)
    if _has_segments(root) and infer_store_cq_file_size(root) is None:
        raise StoreError("no ConsumeQueue file of this store tells the broker's ConsumeQueue file size "
                         "(mappedFileSizeConsumeQueue), and a file of the wrong size stops the broker from starting: "
                         "pass --cq-file-size (the broker's default is 6000000)", root)


def _has_segments(root: Path) -> bool:
    from rmqdump.disk.segment import parse_file_name

    d = root / STORE_COMMITLOG_DIR
    try:
        return any(parse_file_name(n) is not None for n in os.listdir(d))
    except FileNotFoundError:
        return False
    except OSError as e:
        raise StoreError(f"cannot list directory: {e.strerror}", d) from None
