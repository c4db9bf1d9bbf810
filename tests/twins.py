"""Shared by the differential tests of the compiled twins that walk the commitlog's files (``fast.filewalk``): the
bundled stores both engines walk, their test ids, and a spy on a twin's entry point."""

from __future__ import annotations

import inspect
from pathlib import Path

from conftest import FIXTURES

#: the bundled stores: RocketMQ-written ``fixtures/oracle`` ones (DLedger left out: the kernels do not walk it),
#: ``fixtures/store`` and ``fixtures/store-5x``
STORES = [FIXTURES / "store", FIXTURES / "store-5x",
          *sorted(p for p in FIXTURES.glob("oracle/*/store") if not p.parent.name.endswith("dledger"))]

_ORIGINALS: dict[tuple[str, str], object] = {}


def store_id(p: Path) -> str:
    return p.name if p.parent.name == "fixtures" else p.parent.name


def spy(monkeypatch, module, name: str, batch_records: int | None) -> list:
    """Replace ``module.name`` (a generator or a function taking ``batch_records``) by one that passes
    ``batch_records`` and records what it gives (each item, or the return value); returns that record."""
    real = _ORIGINALS.setdefault((module.__name__, name), getattr(module, name))
    seen: list = []
    if inspect.isgeneratorfunction(real):
        def wrapper(*a, **k):
            for item in real(*a, **k, batch_records=batch_records):
                seen.append(item)
                yield item
    else:
        def wrapper(*a, **k):
            got = real(*a, **k, batch_records=batch_records)
            seen.append(got)
            return got
    monkeypatch.setattr(module, name, wrapper)
    return seen
