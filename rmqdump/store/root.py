"""Store discovery: what a path holds (store root, commitlog dir or one segment) and what is missing."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import (
    STORE_ABORT_FILE,
    STORE_BATCH_CONSUMEQUEUE_DIR,
    STORE_CHECKPOINT_FILE,
    STORE_COMMITLOG_DIR,
    STORE_CONFIG_DIR,
    STORE_CONSUMEQUEUE_DIR,
    STORE_INDEX_DIR,
    STORE_LOCK_FILE,
)
from rmqdump.disk.segment import parse_file_name
from rmqdump.errors import StoreError
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.dledger.files import find_dledger, has_data_files, is_dledger_segment

_PARTS = {
    "consumequeue": STORE_CONSUMEQUEUE_DIR,
    "batchconsumequeue": STORE_BATCH_CONSUMEQUEUE_DIR,
    "index": STORE_INDEX_DIR,
    "checkpoint": STORE_CHECKPOINT_FILE,
    "abort": STORE_ABORT_FILE,
    "lock": STORE_LOCK_FILE,
    "config": STORE_CONFIG_DIR,
}


@dataclass
class Store:
    """A broker store as found on disk. ``root`` is None when only commitlog files were given."""

    commitlog: CommitLog
    root: Path | None
    parts: dict[str, Path] = field(default_factory=dict)
    missing: list[str] = field(default_factory=list)

    @classmethod
    def open(cls, path: str | os.PathLike) -> Store:
        """Open a store root, its ``commitlog/`` directory, or a single segment file."""
        p = Path(path)
        if not p.exists():
            raise StoreError("no such file or directory", p)
        root: Path | None
        if p.is_dir() and p.name == "data" and p.parent.name.startswith("dledger-"):
            p = p.parent.parent  # a DLedger data folder: its store root
        dl = find_dledger(p) if p.is_dir() else None
        if dl is not None and has_data_files(dl.data_dir):
            return cls._open_dledger(p, dl)
        if p.is_dir() and (p / STORE_COMMITLOG_DIR).is_dir():
            root = p
        elif p.is_dir() and p.name == STORE_COMMITLOG_DIR:
            root = p.parent
        elif p.is_dir():
            if not any(parse_file_name(n) is not None for n in os.listdir(p)):
                raise StoreError("not a RocketMQ store: no commitlog/ directory and no 20-digit segment files", p)
            root = None
        else:
            root = None
        cl = CommitLog.open(p if root is None else root / STORE_COMMITLOG_DIR)
        if root is None and cl.segments and is_dledger_segment(cl.segments[0]):
            from rmqdump.store.dledger.log import DLedgerCommitLog

            cl = DLedgerCommitLog.files_only(cl)  # DLedger data files given alone (no index, no checkpoint)
        return cls(cl, root)._find_parts()

    @classmethod
    def _open_dledger(cls, root: Path, dl) -> Store:
        """A DLedger store (``enableDLegerCommitLog``): its commitlog is ``dledger-<id>/data``."""
        from rmqdump.store.dledger.log import DLedgerCommitLog

        cl = DLedgerCommitLog.open_member(dl)
        old = root / STORE_COMMITLOG_DIR
        if old.is_dir() and has_data_files(old):  # mixed: a broker switched to DLedger keeps its old files
            cl = cl.after_old_commitlog(CommitLog.from_directory(old))
        return cls(cl, root)._find_parts()

    def _find_parts(self) -> Store:
        if self.root is not None:
            for name, rel in _PARTS.items():
                q = self.root / rel
                if q.exists():
                    self.parts[name] = q
                elif name not in ("abort", "batchconsumequeue"):
                    self.missing.append(rel)
        return self

    @property
    def dledger(self):
        """The store's ``dledger-<id>/`` (:class:`~rmqdump.store.dledger.files.DLedgerDir`), None for a plain
        commitlog."""
        return getattr(self.commitlog, "dledger", None)

    def path(self, part: str) -> Path | None:
        """Path of a store part (``consumequeue``, ``index``, ``checkpoint``, ...) if present."""
        return self.parts.get(part)

    @property
    def abort_present(self) -> bool:
        return "abort" in self.parts
