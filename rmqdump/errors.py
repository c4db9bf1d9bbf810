"""The one error root of rmqdump.

Every failure caused by the bytes of a store (or by how the user pointed at it) is a
:class:`RmqdumpError`; anything else escaping the library on damaged input is a bug.
Each error carries the file and byte offset it concerns, so the CLI can print one line.
"""

from __future__ import annotations

import os


class RmqdumpError(Exception):
    """Root of all rmqdump errors; ``file`` and ``offset`` locate the problem."""

    def __init__(self, message: str, file: str | os.PathLike | None = None, offset: int | None = None):
        super().__init__(message)
        self.message = message
        self.file = os.fspath(file) if file is not None else None
        self.offset = offset

    def __str__(self) -> str:
        where = ""
        if self.file is not None:
            where = self.file
            if self.offset is not None:
                where += f" at byte {self.offset}"
            where += ": "
        elif self.offset is not None:
            where = f"offset {self.offset}: "
        return where + self.message


class FormatError(RmqdumpError):
    """Bytes that do not follow the RocketMQ on-disk format."""


class StoreError(RmqdumpError):
    """A store layout problem: missing, mis-sized or unexpected files."""


class LockError(RmqdumpError):
    """The broker's lock is held (or cannot be taken); ``pid`` names the holder."""

    def __init__(self, message: str, file=None, offset=None, pid: int | None = None):
        super().__init__(message, file, offset)
        self.pid = pid


class UnsupportedError(RmqdumpError):
    """A valid feature rmqdump does not decode here (e.g. a RocksDB consume queue)."""


class NotFoundError(RmqdumpError):
    """A looked-up message, queue or offset does not exist in the store."""
