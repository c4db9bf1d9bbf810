"""Session fixtures of the oracle matrix: every store written (and judged) by RocketMQ itself."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from .harness import Built, build_base, build_variant, unavailable_reason
from .scenarios import DAMAGES, all_bases, variants_for

BASES = all_bases()
VARIANTS = [(b, d) for b in BASES for d in variants_for(b)]
STORE_IDS = [b.name for b in BASES] + [f"{b.name}~{d}" for b, d in VARIANTS]
CLEAN_IDS = [b.name for b in BASES if not b.flags]
BASE_IDS = [b.name for b in BASES]
JOBS = int(os.environ.get("RMQDUMP_ORACLE_JOBS", "2"))


def _guard(fn):
    """Return the exception instead of raising it: one store that cannot be built fails its own tests only."""

    def call(arg):
        try:
            return fn(arg)
        except Exception as e:  # noqa: BLE001 - handed to the test that asks for this store
            return e

    return call


class Matrix:
    """Builds stores on first use (bases in parallel, then their damaged variants) and hands them out."""

    def __init__(self) -> None:
        self._built: dict[str, Built | Exception | None] = {}
        self._bases = {b.name: b for b in BASES}

    def _build_all(self) -> None:
        with ThreadPoolExecutor(JOBS) as pool:
            for b, built in zip(BASES, pool.map(_guard(build_base), BASES), strict=True):
                self._built[b.name] = built

            @_guard
            def variant(item):
                b, d = item
                base = self._built[b.name]
                if isinstance(base, Exception):
                    raise base
                mutations = DAMAGES[d](base)
                return None if mutations is None else build_variant(base, d, mutations)

            for (b, d), built in zip(VARIANTS, pool.map(variant, VARIANTS), strict=True):
                self._built[f"{b.name}~{d}"] = built

    def get(self, name: str) -> Built:
        if not self._built:
            self._build_all()
        built = self._built[name]
        if isinstance(built, Exception):
            raise built
        if built is None:
            pytest.skip(f"{name}: that damage does not apply to this store's shape")
        return built


@pytest.fixture(scope="session")
def matrix() -> Matrix:
    reason = unavailable_reason("498") or unavailable_reason("533")
    if reason:
        pytest.skip(reason)
    return Matrix()
