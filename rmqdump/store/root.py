"""Store discovery: what a path holds (store root, commitlog dir or one segment) and what is missing."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
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
from rmqdump.findings import WARNING, Finding
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.dledger.files import find_dledger, has_data_files, is_dledger_segment

#: the commitlog folders (``storePathCommitLog="a,b"``) every :meth:`Store.open` uses unless told; see
#: :func:`commitlog_paths`
_COMMITLOG_PATHS: ContextVar[tuple[str, ...] | None] = ContextVar("rmqdump_commitlog_paths", default=None)


@contextmanager
def commitlog_paths(paths: list[str] | tuple[str, ...] | None) -> Iterator[None]:
    """Within the block, :meth:`Store.open` reads the commitlog from these folders (a multi-path
    ``storePathCommitLog``; relative ones are taken relative to the store root). None: the store's own."""
    token = _COMMITLOG_PATHS.set(tuple(paths) if paths else None)
    try:
        yield
    finally:
        _COMMITLOG_PATHS.reset(token)


def split_paths(value: str) -> list[str]:
    """A ``storePathCommitLog`` value split as RocketMQ splits it (``MULTI_PATH_SPLITTER`` is a comma)."""
    return [v.strip() for v in value.strip().split(",") if v.strip()]


def broker_config_commitlog_paths(path: str | os.PathLike) -> list[str]:
    """The commitlog folders a broker properties file names: ``storePathCommitLog`` (comma-separated) plus
    ``readOnlyCommitLogStorePaths``, which ``MultiPathMappedFileQueue.load`` lists too; empty when neither is
    set (``StoreError`` if the file cannot be read)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise StoreError(f"cannot read broker config: {e.strerror}", Path(path)) from None
    props: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        key, value = (re.split(r"\s*[=:]\s*|\s+", line, maxsplit=1) + [""])[:2]
        props[key] = value.strip()
    out = split_paths(props.get("storePathCommitLog", ""))
    return out + [r for r in split_paths(props.get("readOnlyCommitLogStorePaths", "")) if r not in out]


def _hint_other_folders(cl: CommitLog, root: Path) -> None:
    """Commitlog segments in another folder of the store root, not read: say how to read the whole log."""
    from rmqdump.store.inventory import other_commitlog_folders

    others = other_commitlog_folders(root)
    if others:
        names = [STORE_COMMITLOG_DIR] + [str(o.relative_to(root)).rstrip("/") for o in others]
        cl.problems.append(Finding(WARNING, "commitlog_path_unread", str(others[0]), None,
                                   f"{', '.join(names[1:])} also hold(s) commitlog segments (a multi-path "
                                   f"storePathCommitLog?), not read: give --commitlog-path {','.join(names)}"))


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
    def open(cls, path: str | os.PathLike, commitlog_paths: list[str] | None = None) -> Store:
        """Open a store root, its ``commitlog/`` directory, or a single segment file. ``commitlog_paths``
        (default: those of :func:`commitlog_paths`) reads the commitlog from several folders."""
        p = Path(path)
        if not p.exists():
            raise StoreError("no such file or directory", p)
        root: Path | None
        if p.is_dir() and p.name == "data" and p.parent.name.startswith("dledger-"):
            p = p.parent.parent  # a DLedger data folder: its store root
        dl = find_dledger(p) if p.is_dir() else None
        if dl is not None and has_data_files(dl.data_dir):
            return cls._open_dledger(p, dl)
        multi = commitlog_paths if commitlog_paths is not None else _COMMITLOG_PATHS.get()
        if multi and p.is_dir():
            return cls._open_multipath(p, list(multi))
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
        if root is not None:
            _hint_other_folders(cl, root)
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

    @classmethod
    def _open_multipath(cls, p: Path, paths: list[str]) -> Store:
        """A commitlog spread over several folders; relative folders are taken relative to the store root."""
        root = p.parent if p.name == STORE_COMMITLOG_DIR and not (p / STORE_COMMITLOG_DIR).is_dir() else p
        dirs: list[Path] = []
        for s in paths:
            d = Path(s) if os.path.isabs(s) else root / s
            if d not in dirs:
                dirs.append(d)
        present = [d for d in dirs if d.is_dir()]
        if not present:
            raise StoreError("none of the commitlog folders exists: " + ", ".join(map(str, dirs)), root)
        cl = CommitLog.from_directories(present)
        cl.problems += [Finding(WARNING, "commitlog_path_missing", str(d), None,
                                "a configured commitlog folder does not exist (the broker skips it)")
                        for d in dirs if d not in present]
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
