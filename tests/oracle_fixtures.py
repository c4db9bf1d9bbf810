"""Helpers for the stores in ``fixtures/oracle/<name>/`` (written by RocketMQ's own store code, see
``recipe.json``) and for judging results with the oracle in ``../shared/oracle`` when it is there."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
from oracle.harness import load, unavailable_reason, writable_copy

REPO = Path(__file__).resolve().parents[1]
ORACLE_FIXTURES = REPO / "fixtures" / "oracle"


def fixture_dir(name: str) -> Path:
    return ORACLE_FIXTURES / name


def recipe(name: str) -> dict:
    return json.loads((fixture_dir(name) / "recipe.json").read_text(encoding="utf-8"))


def run_args(name: str) -> list[str]:
    """``run``'s arguments for the fixture store ``name`` (its geometry and settings)."""
    r = recipe(name)
    return [*r["run_args"], *(f"--set={k}={v}" for k, v in r.get("run_sets", {}).items())]


def rocketmq_loads(name: str, store: Path, tmp_path: Path) -> bool | None:
    """RocketMQ's own ``load()`` verdict on a copy of ``store`` (a changed copy of the fixture ``name``), None
    where the oracle is not (the caller's own assertions stand alone then)."""
    import shutil

    if unavailable_reason(name[:3]) is not None:
        return None
    copy = shutil.copytree(store, tmp_path / "rocketmq-copy")
    try:
        return next(m for m in load(name[:3], copy, run_args(name)) if m["type"] == "store_info")["load_ok"]
    finally:
        shutil.rmtree(copy, ignore_errors=True)


def fixture_manifest(name: str) -> list[dict]:
    """What RocketMQ's ``run`` read back from the fixture store (recorded when it was made)."""
    text = (fixture_dir(name) / "manifest.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def copy_store(name: str, dst: Path) -> Path:
    """A writable copy of ``fixtures/oracle/<name>/store``."""
    return writable_copy(fixture_dir(name) / "store", dst)


def tree_state(root: Path) -> dict[str, str]:
    """Every path under ``root`` — directories included — with a sha256 for files ("dir" for directories)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root) + "/"] = "dir"
        for f in filenames:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = hashlib.sha256(fh.read()).hexdigest()
    return out


def oracle_run(version: str, store: Path, tmp_path: Path, args: list[str]) -> list[dict]:
    """RocketMQ ``<version>/run`` on a COPY of ``store``; skips when the oracle or java is missing."""
    reason = unavailable_reason(version)
    if reason:
        pytest.skip(reason)
    manifest = load(version, store, args)
    assert next(m for m in manifest if m["type"] == "store_info")["load_ok"], "RocketMQ's load() refused the store"
    return manifest
