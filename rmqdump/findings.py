"""Findings: what is wrong (or notable), where, and how bad — shared by discovery, scan and verify."""

from __future__ import annotations

from dataclasses import asdict, dataclass

ERROR = "error"
WARNING = "warning"
INFO = "info"
SEVERITIES = (ERROR, WARNING, INFO)


@dataclass(frozen=True)
class Finding:
    """One observation about a store file at a byte offset (``offset`` None for whole-file facts)."""

    severity: str
    kind: str
    file: str | None
    offset: int | None
    detail: str

    def to_dict(self) -> dict:
        return asdict(self)

    def __str__(self) -> str:
        where = self.file or ""
        if self.offset is not None:
            where += f"@{self.offset}"
        return f"{self.severity}: {self.kind}: {where}: {self.detail}" if where else f"{self.severity}: {self.kind}: {self.detail}"
