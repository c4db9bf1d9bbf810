"""A RocksDB database of a store, opened read-only without writing a byte of the store.

RocksDB's read-only mode takes no ``LOCK`` and writes no ``LOG``, but the Python binding (``rocksdict``)
writes its own ``rocksdict-config.json`` into the directory it opens, even read-only. So the database is
opened through a private directory of symlinks to its files (``CURRENT``, ``MANIFEST-*``, ``OPTIONS-*``,
``*.sst``, ``*.log``; not ``LOCK``, ``LOG*`` or a binding's own files): whatever the binding or RocksDB
writes lands there. The store's directory stays byte-identical (tests/test_rocksdb.py).

A running broker may compact and delete files after the open: reads then fail with a one-line StoreError.
"""

from __future__ import annotations

import atexit
import os
import re
from collections.abc import Iterator
from pathlib import Path

from rmqdump.disk.evidence import record_read
from rmqdump.errors import StoreError

#: RocksDB's files a read-only open reads (the others are its lock, info logs and archives)
_DATA_FILE = re.compile(r"CURRENT|IDENTITY|MANIFEST-[0-9]+|OPTIONS-[0-9]+|[0-9]+\.(sst|log|blob)")
#: files that mark a directory as a RocksDB database
_MARKER = re.compile(r"CURRENT|MANIFEST-[0-9]+|[0-9]+\.sst")

_OPEN: dict[str, RocksDB] = {}


def is_rocksdb_dir(path: str | os.PathLike) -> bool:
    """True if ``path`` is a directory holding RocksDB's marker files (``CURRENT``, ``MANIFEST-*``, ``*.sst``)."""
    try:
        with os.scandir(path) as it:
            return any(_MARKER.fullmatch(e.name) and e.is_file(follow_symlinks=False) for e in it)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        raise StoreError(f"cannot list directory: {exc.strerror}", path) from None


def _binding():
    """The ``rocksdict`` module; its ImportError names it (the CLI maps it to the ``rocksdb`` extra)."""
    import rocksdict  # noqa: PLC0415 - optional dependency

    return rocksdict


class RocksDB:
    """One database opened read-only: its column families by name, iterated in key order."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        rd = _binding()
        if not is_rocksdb_dir(self.path):
            raise StoreError("not a RocksDB database (no CURRENT, MANIFEST or .sst file)", self.path)
        import shutil  # (these two cost ~6 ms at every command's start: imported where a database is opened)
        import tempfile

        self._shadow = Path(tempfile.mkdtemp(prefix="rmqdump-rocksdb-"))
        try:
            with os.scandir(self.path) as it:
                for e in it:
                    if _DATA_FILE.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                        os.symlink(os.path.abspath(e.path), self._shadow / e.name)
                        record_read(e.path)  # --evidence manifest
            opts = rd.Options(raw_mode=True)
            self.column_families = rd.Rdict.list_cf(str(self._shadow), opts)
            cfs = {n: rd.Options(raw_mode=True) for n in self.column_families if n != "default"}
            self._db = rd.Rdict(str(self._shadow), opts, column_families=cfs or None,
                                access_type=rd.AccessType.read_only())
        except Exception as exc:  # the binding raises plain Exceptions for RocksDB's statuses
            shutil.rmtree(self._shadow, ignore_errors=True)
            msg = _one_line(exc).replace(os.fspath(self._shadow), os.fspath(self.path))  # name the store's files
            raise StoreError(f"cannot open RocksDB database read-only: {msg}", self.path) from None

    def family(self, name: str = "default"):
        """The column family ``name`` (StoreError if the database has none)."""
        if name == "default":
            return self._db
        if name not in self.column_families:
            raise StoreError(f"RocksDB database has no column family {name!r} (has {self.column_families})",
                             self.path)
        return self._db.get_column_family(name)

    def items(self, family: str = "default", start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """(key, value) pairs of a column family in key order, from ``start`` (the first key if None)."""
        try:
            yield from self.family(family).items(from_key=start)
        except Exception as exc:
            raise StoreError(f"RocksDB read failed: {_one_line(exc)}", self.path) from None

    def range(self, family: str, start: bytes, stop: bytes) -> list[tuple[bytes, bytes]]:
        """Every (key, value) with ``start <= key < stop`` in key order (the bound is RocksDB's, no key past it
        is read)."""
        return self._bounded(family, start, stop, "items")

    def range_values(self, family: str, start: bytes, stop: bytes) -> list[bytes]:
        """The values of :meth:`range` alone (no key objects: half the work)."""
        return self._bounded(family, start, stop, "values")

    def _bounded(self, family: str, start: bytes, stop: bytes, what: str) -> list:
        """``items`` or ``values`` of one column family from ``start`` up to (not including) ``stop``."""
        ro = _binding().ReadOptions()
        ro.set_iterate_upper_bound(stop)
        try:
            return list(getattr(self.family(family), what)(from_key=start, read_opt=ro))
        except Exception as exc:
            raise StoreError(f"RocksDB read failed: {_one_line(exc)}", self.path) from None

    def seek_keys(self, family: str, start: bytes) -> bytes | None:
        """The first key >= ``start`` in a column family, None past the last."""
        for k, _ in self.items(family, start):
            return k
        return None

    def last_key_before(self, family: str, bound: bytes) -> bytes | None:
        """The last key <= ``bound`` in a column family, None if there is none."""
        it = self.family(family).iter()
        try:
            it.seek_for_prev(bound)
            return it.key() if it.valid() else None
        except Exception as exc:
            raise StoreError(f"RocksDB read failed: {_one_line(exc)}", self.path) from None

    def close(self) -> None:
        db, self._db = getattr(self, "_db", None), None
        if db is not None:
            try:
                db.close()
            except Exception:  # noqa: BLE001 - a close failure of a read-only handle loses nothing
                pass
        import shutil

        shutil.rmtree(self._shadow, ignore_errors=True)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def open_rocksdb(path: str | os.PathLike) -> RocksDB:
    """The read-only handle of the database at ``path``, opened once per process (closed at exit)."""
    key = os.path.realpath(path)
    db = _OPEN.get(key)
    if db is None:
        db = _OPEN[key] = RocksDB(path)
    return db


def close_all() -> None:
    """Close every database :func:`open_rocksdb` opened (and remove their symlink directories)."""
    while _OPEN:
        _OPEN.popitem()[1].close()


atexit.register(close_all)
