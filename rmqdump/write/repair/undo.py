"""Undo: put back every byte range and file a repair changed, from its backup, and check the sha256s."""

from __future__ import annotations

import base64
import os
import time
from dataclasses import dataclass
from pathlib import Path

from rmqdump.disk.durable import fsync_dir, fsync_fd, open_write
from rmqdump.errors import StoreError
from rmqdump.write.repair.apply import (
    APPLY_GROUPS,
    _guard,
    _safe_target,
    _set_abort,
    _write_manifest,
    read_manifest,
)
from rmqdump.write.repair.files import _copy_extents, _open, _pwrite_all, sha256_file, sha256_range


@dataclass
class UndoResult:
    store: Path
    restored: int
    verified: int
    mismatched_before: list[str]


def _item_states(root: Path, items: list[dict], applied: bool) -> list[str]:
    """Per backup item: 'before' (untouched), 'after' (as the repair left it), 'either' (cannot tell or
    need not), or 'changed' (neither: someone else changed it, or an interrupted apply tore it)."""
    replaced = {it["path"] for it in items if it["op"] == "create" and it.get("replaces")}
    deleted = {it["path"]: it["sha256_before"] for it in items if it["op"] == "delete" and it["path"] in replaced}
    out = []
    for it in items:
        target = _safe_target(root, it["path"])
        st = "either"
        if it["op"] == "write":
            now = sha256_range(target, it["offset"], it["length"]) if target.exists() else None
            st = {it["sha256_before"]: "before", it["sha256_after"]: "after"}.get(now, "changed")
            if it["sha256_before"] == it["sha256_after"] and now == it["sha256_before"]:
                st = "either"
        elif it["op"] == "delete" and it["path"] not in replaced:  # a replaced file: its create is checked
            if not target.exists():
                st = "after"
            else:
                st = "before" if sha256_file(target) == it["sha256_before"] else "changed"
        elif it["op"] == "create":
            if not target.exists():
                st = "before"
            elif applied and it.get("sha256_after") and sha256_file(target) != it["sha256_after"]:
                st = "changed"
            elif it.get("replaces") and sha256_file(target) == deleted.get(it["path"]):
                st = "before"  # the file it replaces, not yet deleted
            else:
                st = "after"  # (before the manifest says applied, possibly written in part)
        out.append(st)
    return out


def _torn_by_interrupted_apply(root: Path, items: list[dict], states: list[str]) -> int | None:
    """The index of the one write a killed ``apply`` left half done, or None.

    A kill inside a write leaves its range neither before nor after (a large ``pwrite`` stops at a
    page when the process is killed). That is the repair's own doing, not a later change, when: the
    store still carries the repair's abort marker, that write is the only changed item, and every
    change applied after it (``APPLY_GROUPS`` order) is untouched. Undo then restores its whole range.
    """
    from rmqdump.write.appender import ABORT_TAG, read_abort

    changed = [i for i, st in enumerate(states) if st == "changed"]
    if len(changed) != 1 or items[changed[0]]["op"] != "write":
        return None
    abort = read_abort(root)
    if abort is None or not abort.content.startswith(ABORT_TAG + b" repair "):
        return None
    rank = {g: k for k, g in enumerate(APPLY_GROUPS)}
    order = sorted(range(len(items)), key=lambda i: rank.get(items[i].get("group"), len(rank)))
    later = order[order.index(changed[0]) + 1:]
    if any(states[i] not in ("before", "either") for i in later):
        return None
    return changed[0]


def undo_backup(backup: str | os.PathLike, *, store: str | os.PathLike | None = None, force: bool = False,
                lock_timeout: float = 1.0) -> UndoResult:
    """Restore every byte range and file a repair changed, then verify the sha256s of the result.

    Refuses (unless ``force``) when the store no longer holds what the repair wrote — e.g. a
    broker ran since — because restoring would then destroy newer data.
    """
    from rmqdump.broker.lock import StoreLock
    from rmqdump.write.appender import ABORT_TAG

    backup = Path(backup)
    doc = read_manifest(backup)
    if doc.get("state") not in ("prepared", "applied"):
        raise StoreError(f"backup state is {doc.get('state')!r}; nothing to undo", backup)
    root = Path(store) if store is not None else Path(doc["store"])
    items = doc["items"]
    blobs = backup / "blobs"
    with StoreLock(root, timeout=lock_timeout):
        _guard(root)
        applied = doc["state"] == "applied"
        states = _item_states(root, items, applied)
        torn = None if applied else _torn_by_interrupted_apply(root, items, states)
        mismatched = [it["path"] for i, (it, st) in enumerate(zip(items, states, strict=True))
                      if st == "changed" and i != torn]
        created_dirs = sorted({d for it in items if it["op"] == "create" for d in it.get("created_dirs", [])},
                              key=lambda d: (-d.count("/"), d))  # deepest first
        ours = {it["path"] for it in items if it["op"] == "create"} | set(created_dirs)
        for d in created_dirs:  # a directory the repair made must hold only what the repair made
            try:
                names = os.listdir(_safe_target(root, d))
            except FileNotFoundError:
                continue
            except NotADirectoryError:
                mismatched.append(d)
                continue
            foreign = [n for n in names if f"{d}/{n}" not in ours]
            if foreign:
                mismatched.append(f"{d}/{foreign[0]}")
        if mismatched and not force:
            raise StoreError("the store changed since the repair (" + ", ".join(mismatched[:5])
                             + "); refusing to overwrite it (--force to restore anyway)", root)
        for it in items:  # the blobs must be intact before anything is touched
            if it.get("backup"):
                blob = blobs / it["backup"]
                if it["op"] == "write" and sha256_file(blob) != it["sha256_before"]:
                    raise StoreError("backup blob does not match its sha256", blob)
                if it["op"] == "delete" and sha256_file(blob) != it["sha256_before"]:
                    raise StoreError("backup blob does not match its sha256", blob)
        _set_abort(root, ABORT_TAG + f" undo pid={os.getpid()}\n".encode())
        synced: set[Path] = set()
        for it in reversed(items):
            target = _safe_target(root, it["path"])
            if it["op"] == "write":
                data = (blobs / it["backup"]).read_bytes()
                fd = _open(target, os.O_RDWR)
                try:
                    _pwrite_all(fd, data, it["offset"])
                    fsync_fd(fd, target)
                finally:
                    os.close(fd)
            elif it["op"] == "delete":
                tmp = target.with_name(target.name + ".rmqdump-undo")
                fd = open_write(tmp, read=True, create=True, truncate=True, mode=it.get("mode", 0o644))
                try:
                    os.ftruncate(fd, it["size"])
                    if it.get("backup"):
                        _copy_extents(blobs / it["backup"], fd)
                    fsync_fd(fd, tmp)
                finally:
                    os.close(fd)
                os.replace(tmp, target)
                synced.add(target.parent)
            elif it["op"] == "create":
                if target.exists():
                    os.unlink(target)
                    synced.add(target.parent)
        left = []
        for d in created_dirs:  # deepest first, after every file the repair created is gone
            path = _safe_target(root, d)
            try:
                os.rmdir(path)
            except FileNotFoundError:
                continue
            except OSError as e:
                left.append(f"{d} ({e.strerror})")
                continue
            synced.discard(path)
            synced.add(path.parent)
        for d in sorted(synced, key=lambda p: -len(p.parts)):
            if d.exists():
                fsync_dir(d)
        verified = 0
        for it in items:
            target = root / it["path"]
            if it["op"] == "write":
                ok = sha256_range(target, it["offset"], it["length"]) == it["sha256_before"]
            elif it["op"] == "delete":
                ok = target.exists() and sha256_file(target) == it["sha256_before"]
            else:
                ok = it.get("replaces") or not target.exists()  # a replaced file is checked by its delete
            if not ok:
                raise StoreError("restored bytes do not match the backup's sha256", target)
            verified += 1
        if left:
            raise StoreError("cannot remove directories the repair created: " + ", ".join(left[:5])
                             + " (the abort marker stays)", root)
        before = doc.get("abort_before")
        _set_abort(root, None if before is None else base64.b64decode(before))
        doc["state"] = "undone"
        doc["undone"] = time.time()
        _write_manifest(backup, doc)
    return UndoResult(root, len(items), verified, mismatched)
