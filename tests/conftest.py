"""Shared fixtures: the real RocketMQ stores beside the checkout and the bundled fixture store."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from oracle.harness import writable_copy

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
REAL = SHARED / "real-store" / "broker498"
FIXTURES = REPO / "fixtures"


def manifest(name: str) -> list[dict]:
    """Lines of a real-store manifest (e.g. ``clean`` or ``crash_kill9_after_rocketmq_recovery``)."""
    path = REAL / f"manifest_{name}.jsonl"
    if not path.is_file():
        pytest.skip(f"real-store manifest {path} is not beside the checkout (../shared)")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def real_store(name: str) -> Path:
    path = REAL / name
    if not path.is_dir():
        pytest.skip(f"real store {path} is not beside the checkout")
    return path


@pytest.fixture
def store_copy(tmp_path):
    """Return a function copying a real store into a writable temp dir."""

    def _copy(name: str) -> Path:
        return writable_copy(real_store(name), tmp_path / name)

    return _copy


@pytest.fixture
def controller_store(tmp_path) -> Path:
    """A copy of ``fixtures/store`` with the controller-mode files of ``fixtures/controller`` beside it."""
    st = tmp_path / "store"
    shutil.copytree(FIXTURES / "store", st)
    for f in (FIXTURES / "controller").iterdir():
        shutil.copy(f, st / f.name)
    return st


@pytest.fixture(scope="session", autouse=True)
def _compiled_kernels_ready():
    """With ``RMQDUMP_FAST=1`` (the suite's compiled-engine run) every path takes the kernels: build their
    shared libraries once, before tests that time their subprocesses start."""
    import os

    if os.environ.get("RMQDUMP_FAST") == "1":
        from rmqdump.fast import render, walk

        if walk.fast_available():
            walk.backend()
            render.backend()
    yield
