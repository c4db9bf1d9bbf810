"""The whole suite again on the compiled engine: every test, with ``RMQDUMP_FAST=1`` forcing the kernels
onto inputs of any size (the default run takes them only from 64 MiB up, so fixtures would otherwise
test only the pure path). One suite, both implementations, as markupsafe and msgpack do it.

The second run is a child pytest (minus this file, the oracle matrix and Spark, which take the same
paths as the tests run here); ``-m "not engines"`` skips it locally.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rmqdump.fast import walk

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.engines
def test_the_suite_passes_on_the_compiled_engine():
    if os.environ.get("RMQDUMP_FAST") == "1":
        pytest.skip("this run already forces the compiled engine")
    if not walk.fast_available():
        pytest.skip("numba/numpy not installed or not a little-endian host: there is no compiled engine here")
    env = {**os.environ, "RMQDUMP_FAST": "1"}
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m",
                          "not oracle and not spark and not engines", "-x", "tests"],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    tail = "\n".join(res.stdout.strip().splitlines()[-30:])
    assert res.returncode == 0, f"the suite fails with RMQDUMP_FAST=1:\n{tail}"
