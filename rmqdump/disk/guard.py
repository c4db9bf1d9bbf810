"""The one output guard: no command writes a file inside a store it reads (or a backup it restores).

Every path rmqdump writes to on a user's behalf (``export --to``, ``spark export --out``, ``repair --to``,
repair backups, ``--evidence``) passes :func:`refuse_inside` first. The check follows symlinks (of the
path and of its parents, also for a path that does not exist yet) and refuses an existing file that is
hard-linked elsewhere, so neither a link into the store nor a second name of one of its files gets
overwritten.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from rmqdump.errors import StoreError


def _within(path: str, base: str) -> bool:
    return path == base or path.startswith(base.rstrip(os.sep) + os.sep)


def protected_root(path: str | os.PathLike) -> str:
    """What to protect for an input ``path``: the directory itself, or a file's directory; for a
    ``commitlog/`` directory or a segment in one, the store directory above it (a segment given alone
    is still part of a store)."""
    real = os.path.realpath(path)
    d = real if os.path.isdir(real) else os.path.dirname(real)
    return os.path.dirname(d) if os.path.basename(d) == "commitlog" else d


def refuse_inside(out: str | os.PathLike, protected: Iterable[str | os.PathLike], what: str) -> Path:
    """``out`` as a Path, or :class:`StoreError` when it lies inside (or is) one of the ``protected``
    directories, or is an existing file with other hard links (it might be a store file)."""
    out = Path(out)
    real = os.path.realpath(out)
    for base in protected:
        real_base = os.path.realpath(base)
        if _within(real, real_base):
            raise StoreError(f"{what} must not be inside the store it reads ({real_base}): nothing was written", out)
    try:
        st = os.stat(real)
    except OSError:
        return out
    if not os.path.isdir(real) and st.st_nlink > 1:
        raise StoreError(f"{what} is a file with {st.st_nlink} hard links (it may be a store file); "
                         "refusing to overwrite it", out)
    return out
