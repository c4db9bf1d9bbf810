"""Backup and apply: every byte a repair changes is copied first, then changed (``undo`` puts it back)."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from rmqdump.codec.layout import (
    STORE_ABORT_FILE,
)
from rmqdump.disk.durable import fsync_dir, fsync_fd, open_write
from rmqdump.disk.extents import nonzero_chunks
from rmqdump.disk.guard import refuse_inside
from rmqdump.errors import FormatError, LockError, StoreError
from rmqdump.write.repair.files import (
    _copy_extents,
    _open,
    _pread_all,
    _pwrite_all,
    sha256_file,
)
from rmqdump.write.repair.model import _CHUNK, MANIFEST, MANIFEST_FORMAT, Change, RepairPlan
from rmqdump.write.repair.plan import plan_repair
from rmqdump.write.writer import ensure_store_dir

#: the order changes are applied in (a change of another group is a bug: refused before anything is written)
APPLY_GROUPS = ("commitlog", "consumequeue", "index", "checkpoint", "config", "compaction")


def _safe_target(root: Path, rel: str) -> Path:
    """``root/rel`` with every existing directory component a real directory inside the store (no
    symlinks); missing components are named, not created (the file may not exist yet)."""
    parts = rel.split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise StoreError(f"refusing path {rel!r}", root)
    d, _ = ensure_store_dir(root, *parts[:-1], create=False)
    target = d / parts[-1]
    if target.is_symlink():
        raise StoreError("is a symlink; refusing to follow it out of the store", target)
    return target


def default_backup_dir(root: Path) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = root.parent / f"{root.name}.rmqdump-backup-{stamp}"
    p, n = base, 1
    while p.exists():
        n += 1
        p = Path(f"{base}-{n}")
    return p


def _write_manifest(backup: Path, doc: dict) -> None:
    tmp = backup / (MANIFEST + ".tmp")
    data = json.dumps(doc, indent=1, ensure_ascii=False).encode()
    fd = open_write(tmp, create=True, truncate=True)
    try:
        _pwrite_all(fd, data, 0)
        fsync_fd(fd, tmp)
    finally:
        os.close(fd)
    os.replace(tmp, backup / MANIFEST)
    fsync_dir(backup)


def _missing_dirs(root: Path, rel_file: str) -> list[str]:
    """The directories (relative, outermost first) that must be created to hold ``root/rel_file``."""
    parts = rel_file.split("/")[:-1]
    out = []
    for i in range(1, len(parts) + 1):
        rel = "/".join(parts[:i])
        if out or not os.path.lexists(root / rel):
            out.append(rel)
    return out


def _backup_changes(root: Path, plan: RepairPlan, backup: Path) -> list[dict]:
    """Copy what each change will overwrite or remove into ``backup/blobs`` (fsynced); name every
    directory a create will make (each once, in the first item that needs it) so undo removes it."""
    blobs = backup / "blobs"
    blobs.mkdir(parents=True)
    items = []
    planned_dirs: set[str] = set()
    for n, c in enumerate(plan.changes, 1):
        target = _safe_target(root, c.path)
        item: dict = {"op": c.op, "path": c.path, "why": c.why, "group": c.group}
        if c.op == "write":
            size = target.stat().st_size
            if c.offset + c.length > size:
                raise StoreError(f"write [{c.offset}, {c.offset + c.length}) past the end of a {size}-byte file",
                                 target)
            blob = blobs / f"{n:06d}.bin"
            fd = _open(target)
            try:
                old = _pread_all(fd, c.length, c.offset)
            finally:
                os.close(fd)
            _write_blob(blob, old)
            new = c.data if c.data is not None else bytes(c.length)
            item.update(offset=c.offset, length=c.length, backup=blob.name,
                        sha256_before=hashlib.sha256(old).hexdigest(), sha256_after=hashlib.sha256(new).hexdigest())
        elif c.op == "delete":
            st = os.stat(target, follow_symlinks=False)
            fd = _open(target)
            try:
                size = st.st_size
                has_data = next(nonzero_chunks(fd, 0, size), None) is not None
            finally:
                os.close(fd)
            item.update(size=size, mode=stat.S_IMODE(st.st_mode), sha256_before=sha256_file(target))
            if has_data:
                blob = blobs / f"{n:06d}.bin"
                bfd = open_write(blob, create=True, exclusive=True)
                try:
                    os.ftruncate(bfd, size)
                    _copy_extents(target, bfd)
                    fsync_fd(bfd, blob)
                finally:
                    os.close(bfd)
                item["backup"] = blob.name
            else:
                item["zero_filled"] = True
        elif c.op == "create":
            replaces = any(o.op == "delete" and o.path == c.path for o in plan.changes[:n - 1])
            if (target.exists() or target.is_symlink()) and not replaces:
                raise StoreError("file to create already exists", target)
            if replaces:
                item["replaces"] = True
            missing = [d for d in _missing_dirs(root, c.path) if d not in planned_dirs]
            planned_dirs.update(missing)
            item.update(size=c.size, created_dirs=missing)
        items.append(item)
    fsync_dir(blobs)
    return items


def _write_blob(path: Path, data: bytes) -> None:
    fd = open_write(path, create=True, exclusive=True)
    try:
        _pwrite_all(fd, data, 0)
        fsync_fd(fd, path)
    finally:
        os.close(fd)


def _apply_change(root: Path, c: Change, item: dict, synced_dirs: set[Path]) -> None:
    if c.op == "create":  # parents first: the target is computed in the directories that now exist
        parts = c.path.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise StoreError(f"refusing path {c.path!r}", root)
        missing = _missing_dirs(root, c.path)
        _, changed = ensure_store_dir(root, *parts[:-1])
        synced_dirs.update(changed)
        # what was really created (the manifest is rewritten after apply; undo removes these)
        item["created_dirs"] = missing
    target = _safe_target(root, c.path)
    if c.op == "write":
        fd = _open(target, os.O_RDWR)
        try:
            if c.data is not None:
                _pwrite_all(fd, c.data, c.offset)
            else:
                z = bytes(min(_CHUNK, c.length))
                done = 0
                while done < c.length:
                    n = min(len(z), c.length - done)
                    _pwrite_all(fd, z[:n], c.offset + done)
                    done += n
            fsync_fd(fd, target)
        finally:
            os.close(fd)
    elif c.op == "delete":
        try:
            os.unlink(target)
        except OSError as e:
            raise StoreError(f"cannot delete: {e.strerror}", target) from None
        synced_dirs.add(target.parent)
    elif c.op == "create":
        fd = open_write(target, read=True, create=True, exclusive=True)
        try:
            os.ftruncate(fd, c.size)
            if c.source is not None:
                _copy_extents(c.source, fd)
            for off, data in c.pieces:
                _pwrite_all(fd, data, off)
            fsync_fd(fd, target)
        finally:
            os.close(fd)
        synced_dirs.add(target.parent)
        item["sha256_after"] = sha256_file(target)


def _set_abort(root: Path, content: bytes | None) -> None:
    """Make ``abort`` exist with ``content`` (None: make it absent); fsync file and store root."""
    path = root / STORE_ABORT_FILE
    if content is None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as e:
            raise StoreError(f"cannot remove abort: {e.strerror}", path) from None
    else:
        if path.is_symlink():
            raise StoreError("abort is a symlink; refusing to follow it", path)
        fd = open_write(path, create=True, truncate=True)
        try:
            _pwrite_all(fd, content, 0)
            fsync_fd(fd, path)
        finally:
            os.close(fd)
    fsync_dir(root)


def _guard(root: Path) -> None:
    """Hard refusals: a process has the store open, or abort names a live 5.x broker."""
    from rmqdump.write.appender import broker_evidence, read_abort

    evidence = broker_evidence(root, read_abort(root))
    if evidence:
        raise LockError("refusing to write: " + "; ".join(evidence), root)


@dataclass
class ApplyResult:
    backup: Path
    changes: int
    bytes_backed_up: int
    seconds: float


def apply_plan(store_path: str | os.PathLike, *, salvage: str | None = None, rebuild_cq: bool = False,
               rebuild_index: bool = False, backup_dir: str | os.PathLike | None = None, lock_timeout: float = 1.0,
               use_mmap: bool = True, name_clock=None, cq_file_size: int | None = None,
               commitlog_file_size: int | None = None, restore_config: bool = False
               ) -> tuple[RepairPlan, ApplyResult | None]:
    """Plan again under the broker's lock, back up, and apply. Returns (plan, result); result is None
    when there was nothing to do."""
    from rmqdump.broker.lock import StoreLock
    from rmqdump.write.appender import ABORT_TAG, read_abort
    from rmqdump.write.appender.liveness import AFTER_APPEND

    t0 = time.perf_counter()
    root = Path(store_path)
    with StoreLock(root, timeout=lock_timeout):
        _guard(root)
        plan = plan_repair(root, salvage=salvage, rebuild_cq=rebuild_cq, rebuild_index=rebuild_index,
                           cq_file_size=cq_file_size, commitlog_file_size=commitlog_file_size,
                           use_mmap=use_mmap, name_clock=name_clock, restore_config=restore_config)
        try:
            if plan.blocked:
                raise StoreError(plan.blocked, plan.store)
            if not plan.needs_repair:
                return plan, None
            stray = sorted({c.group for c in plan.changes} - set(APPLY_GROUPS))
            if stray:
                raise StoreError(f"repair plan has changes of unknown group(s) {', '.join(stray)}; nothing was "
                                 "written", plan.store)
            root = plan.store
            abort = read_abort(root)
            backup = Path(backup_dir) if backup_dir else default_backup_dir(root)
            refuse_inside(backup, [root], "the backup directory")
            try:
                backup.mkdir(parents=True, exist_ok=False)
            except FileExistsError:
                raise StoreError("backup directory already exists", backup) from None
            manifest = {
                "format": MANIFEST_FORMAT, "store": str(Path(os.path.realpath(root))), "created": time.time(),
                "state": "preparing", "abort_before": None if abort is None else
                base64.b64encode(abort.content).decode(), "plan": plan.to_dict(), "items": [],
            }
            _write_manifest(backup, manifest)
            items = _backup_changes(root, plan, backup)
            manifest["items"] = items
            manifest["state"] = "prepared"
            _write_manifest(backup, manifest)
            fsync_dir(backup.parent)
            # the store may be inconsistent from here on: the broker must run its abnormal recovery, and a
            # second repair must know an interrupted one may have stopped inside a file (the broker's own
            # abort content is in the manifest: undo puts it back)
            # over an interrupted append's marker, say so: what lay past the append's end was never acknowledged,
            # whether or not this repair finishes (the next plan may still truncate it without asking)
            over = AFTER_APPEND if abort is not None and abort.by_append else b""
            _set_abort(root, ABORT_TAG + f" repair pid={os.getpid()}".encode() + over + b"\n")
            synced: set[Path] = set()
            for group in APPLY_GROUPS:
                for c, item in zip(plan.changes, items, strict=True):
                    if c.group == group:
                        _apply_change(root, c, item, synced)
                for d in sorted(synced, key=lambda p: -len(p.parts)):
                    fsync_dir(d)
                synced.clear()
            _set_abort(root, None)
            manifest["state"] = "applied"
            manifest["applied"] = time.time()
            manifest["items"] = items
            _write_manifest(backup, manifest)
            backed = sum(i.get("length", 0) if i["op"] == "write" else (i.get("size", 0) if i.get("backup") else 0)
                         for i in items)
            return plan, ApplyResult(backup, len(items), backed, time.perf_counter() - t0)
        finally:
            plan.cleanup()


def read_manifest(backup: str | os.PathLike) -> dict:
    path = Path(backup) / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise StoreError("no manifest.json: not an rmqdump repair backup", backup) from None
    except (OSError, ValueError) as e:
        raise FormatError(f"unreadable manifest: {e}", path) from None
    if doc.get("format") != MANIFEST_FORMAT:
        raise FormatError(f"unknown backup format {doc.get('format')!r}", path)
    return doc
