"""Chain-of-custody manifest: which files a command read, with their hashes (``--evidence FILE``).

The readers call :func:`record_read` from their open helpers (commitlog segments,
consume-queue files, index files, checkpoint, config files); while a manifest is being
collected (:func:`start`) a Python audit hook also notes every other ``open`` of a path, so
files opened by code that bypasses those helpers are listed too when they lie inside the
store, and any open *for writing* inside the store is reported (``opened_for_write``). :func:`write_evidence` hashes them *after* the command and
writes a JSON manifest: per file path, size, sha256 and mtime (ns), plus the tool
version, the command line and the store geometry. Size and mtime are also taken when a
file is first opened, so a file that changed while it was read (a live store) is flagged.
Writing the manifest into the store itself is refused: evidence is never modified.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rmqdump.disk.guard import refuse_inside
from rmqdump.errors import StoreError

MANIFEST_VERSION = 1
_CHUNK = 1 << 20

_lock = threading.Lock()
# fspath as recorded -> (absolute path, size, mtime_ns) at first open (None if stat failed)
_READ: dict[str, tuple[str, int | None, int | None]] = {}
_started_ns: int | None = None
# audit-hook registry: fspath -> OR of the open flags seen (only while _active)
_AUDIT: dict[str, int] = {}
_active = False
_hook_installed = False
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _audit(event: str, args: tuple) -> None:
    if not _active or event != "open":
        return
    path, flags = args[0], args[2]
    if path is None or isinstance(path, int) or not isinstance(flags, int):
        return
    try:
        key = os.fsdecode(path)
    except (TypeError, ValueError):
        return
    _AUDIT[key] = _AUDIT.get(key, 0) | flags


def start() -> None:
    """Begin collecting for a manifest: reset the registry and watch every ``open``."""
    global _active, _hook_installed
    reset()
    with _lock:
        _AUDIT.clear()
    if not _hook_installed:
        sys.addaudithook(_audit)  # cannot be removed: it is inert unless _active
        _hook_installed = True
    _active = True


def stop() -> None:
    """Stop watching opens (the registry is kept)."""
    global _active
    _active = False


def record_read(path: str | os.PathLike) -> None:
    """Note that ``path`` was opened for reading while a manifest is collected (free otherwise; repeated calls
    are free)."""
    if not _active:
        return  # :func:`start` resets the registry: nothing recorded before it is kept
    key = os.fspath(path)
    if key in _READ:
        return
    absolute = os.path.abspath(key)
    try:
        st = os.stat(absolute)
        size, mtime = st.st_size, st.st_mtime_ns
    except OSError:
        size = mtime = None
    with _lock:
        _READ.setdefault(key, (absolute, size, mtime))


def reset() -> None:
    """Forget every recorded file and restart the clock (start of a command)."""
    global _started_ns
    with _lock:
        _READ.clear()
        _started_ns = time.time_ns()


def recorded() -> list[str]:
    """Absolute paths of the files the readers recorded so far, sorted, without duplicates."""
    with _lock:
        return sorted({v[0] for v in _READ.values()})


def _audited_within(store: str | None, write: bool) -> list[str]:
    """Audited paths inside ``store`` opened read-only (``write=False``) or for writing."""
    if store is None:
        return []
    root = Path(os.path.realpath(store))
    with _lock:
        items = list(_AUDIT.items())
    out = set()
    for path, flags in items:
        if bool(flags & _WRITE_FLAGS) != write:
            continue
        real = Path(os.path.realpath(os.path.abspath(path)))
        if _is_within(real, root) and (write or real.is_file()):
            out.add(os.path.abspath(path))
    return sorted(out)


def _first_seen() -> dict[str, tuple[int | None, int | None]]:
    with _lock:
        out: dict[str, tuple[int | None, int | None]] = {}
        for absolute, size, mtime in _READ.values():
            out.setdefault(absolute, (size, mtime))
        return out


def hash_file(path: str | os.PathLike) -> dict:
    """``{path, size, sha256, mtime_ns}`` of one file, read through a read-only descriptor.

    A symlink is recorded with its target (``symlink_to``) and the target's hash if that is
    a regular file; FIFOs, sockets and devices are recorded by type and never read.
    """
    p = os.fspath(path)
    entry: dict = {"path": p}
    try:
        lst = os.lstat(p)
    except OSError as e:
        return {**entry, "error": e.strerror or str(e)}
    real = p
    if stat.S_ISLNK(lst.st_mode):
        try:
            entry["symlink_to"] = os.readlink(p)
        except OSError as e:
            return {**entry, "error": e.strerror or str(e)}
        real = os.path.realpath(p)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        return {**entry, "error": e.strerror or str(e)}
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return {**entry, "error": f"not a regular file (mode {stat.filemode(st.st_mode)}); not read"}
        pos, digest = _sha256(fd, st.st_size)
        st2 = os.fstat(fd)
    except OSError as e:
        return {**entry, "error": e.strerror or str(e)}
    finally:
        os.close(fd)
    entry.update(size=pos, sha256=digest, mtime_ns=st2.st_mtime_ns)
    if st.st_size != st2.st_size or st.st_mtime_ns != st2.st_mtime_ns or pos != st2.st_size:
        entry["changed_while_hashing"] = True
    return entry


def _sha256(fd: int, size: int) -> tuple[int, str]:
    """(bytes hashed, sha256 hex) of the file: its data extents read into one buffer, its holes (a sparse
    file's, as RocketMQ creates its queue files) hashed as zeros without reading them, then anything past
    ``size`` up to the end of the file (it grew; the caller flags that)."""
    import hashlib  # (~7 ms of imports that only an --evidence manifest needs; platform below likewise)

    from rmqdump.disk.extents import data_extents

    h = hashlib.sha256()
    buf = bytearray(_CHUNK)
    view = memoryview(buf)
    pos = 0

    def read_to(stop: int | None) -> bool:
        """Hash bytes read from ``pos`` up to ``stop`` (None: the end of the file); False at an early end."""
        nonlocal pos
        while stop is None or pos < stop:
            n = os.preadv(fd, [view[:_CHUNK if stop is None else min(_CHUNK, stop - pos)]], pos)
            if not n:
                return stop is None
            h.update(view[:n])
            pos += n
        return True

    for a, b in data_extents(fd, 0, size):
        if a > pos:
            _update_zeros(h, a - pos)
            pos = a
        if not read_to(b):
            return pos, h.hexdigest()  # it shrank (the caller flags that)
    if size > pos:
        _update_zeros(h, size - pos)
        pos = size
    read_to(None)
    return pos, h.hexdigest()


def _update_zeros(h, n: int) -> None:
    from rmqdump.disk.extents import CHUNK, ZEROS

    zeros = memoryview(ZEROS)
    while n > 0:
        h.update(zeros[:min(n, CHUNK)])
        n -= CHUNK


def find_store_root(paths: list[str]) -> str | None:
    """The nearest ancestor of the first read file that looks like a store root (has ``commitlog/``)."""
    for p in paths:
        for parent in Path(p).parents:
            if (parent / "commitlog").is_dir():
                return str(parent)
    return None


def _is_within(path: Path, base: Path) -> bool:
    return path == base or base in path.parents


def _hash_all(files: list[str]) -> list[dict]:
    """:func:`hash_file` of each file, in order, on every core (hashing and reads release the GIL)."""
    jobs = min(len(files), os.cpu_count() or 1)
    if jobs <= 1:
        return [hash_file(p) for p in files]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=jobs) as ex:
        return list(ex.map(hash_file, files))


def build_manifest(store: str | os.PathLike | None = None, version: str | None = None,
                   geometry: dict | Callable[[str | None], dict] | None = None,
                   argv: list[str] | None = None) -> dict:
    """The manifest document for the files recorded so far (hashes taken now). ``geometry``: the store's
    layout, or a function of the store root giving it (the store layer's ``layout_summary``)."""
    stop()
    files = recorded()
    if store is None:
        with _lock:
            audited = [os.path.abspath(k) for k, f in _AUDIT.items() if not f & _WRITE_FLAGS]
        store = find_store_root(files + audited)
    store = None if store is None else os.fspath(store)
    files = sorted(set(files) | set(_audited_within(store, write=False)))
    if callable(geometry):
        geometry = geometry(store)
    elif geometry is None:
        geometry = {}
    first = _first_seen()
    entries = []
    for p, e in zip(files, _hash_all(files), strict=True):
        size0, mtime0 = first.get(p, (None, None))
        if "error" not in e and size0 is not None and (size0 != e["size"] or mtime0 != e["mtime_ns"]):
            e["changed_during_command"] = {"size_at_open": size0, "mtime_ns_at_open": mtime0}
        entries.append(e)
    import platform

    now = time.time_ns()
    return {
        "manifest_version": MANIFEST_VERSION,
        "tool": "rmqdump",
        "version": version,
        "argv": list(sys.argv if argv is None else argv),
        "python": platform.python_version(),
        "host": platform.node(),
        "started_ns": _started_ns,
        "finished_ns": now,
        "store": None if store is None else os.path.abspath(store),
        "geometry": geometry,
        "files": entries,
        "opened_for_write": _audited_within(store, write=True),
    }


def write_evidence(file: str | os.PathLike, store: str | os.PathLike | None = None, version: str | None = None,
                   geometry: dict | Callable[[str | None], dict] | None = None, argv: list[str] | None = None) -> dict:
    """Hash every recorded file and write the manifest to ``file`` (atomically); returns it.

    Refuses (StoreError) to write inside the store or over a file that was read.
    """
    doc = build_manifest(store, version, geometry, argv)
    out = Path(os.path.abspath(file))
    real_out = Path(os.path.realpath(out))
    if doc["store"] is not None:
        refuse_inside(out, [doc["store"]], "the evidence manifest")
    if str(real_out) in {os.path.realpath(e["path"]) for e in doc["files"]}:
        raise StoreError("refusing to overwrite a file that was read", out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    data = (json.dumps(doc, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, out)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise StoreError(f"cannot write evidence manifest: {e.strerror or e}", out) from None
    return doc
