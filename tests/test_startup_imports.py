"""Start-up cost (issue 15), pinned by what a command imports rather than by a clock.

``rmqdump --version`` must not load click; ``rmqdump lookup --key K --topic T`` must not load what a key
lookup never uses (numeric and Arrow stacks, rich, the verifier, the scan command, the index writer, ...).
Each test runs the real entry point in a fresh interpreter and reads ``sys.modules`` at its exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from rmqdump import __version__

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "store"

#: run ``rmqdump.cli.main`` on argv, then print the loaded module names (one JSON list) on stderr's last line
_RUN = ("import json, sys\nfrom rmqdump.cli import main\nsys.argv[0] = 'rmqdump'\n"
        "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\nelse:\n    code = 0\n"
        "sys.stdout.flush()\nsys.stderr.write('\\n' + json.dumps(sorted(sys.modules)) + '\\n')\n"
        "sys.exit(code)\n")


def _run(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """The command as a user starts it: ``RMQDUMP_FAST=1`` (the suite's compiled-engine run) asks every walk,
    however short, to load the kernels, which is not the start-up these tests pin."""
    env = {k: v for k, v in os.environ.items() if k != "RMQDUMP_FAST"}
    r = subprocess.run([sys.executable, "-c", _RUN, *args], capture_output=True, text=True, timeout=120, env=env)
    return r, set(json.loads(r.stderr.splitlines()[-1]))


def _loaded(modules: set[str], names: tuple[str, ...]) -> list[str]:
    """The modules of ``names`` (a name or any of its submodules) that were imported."""
    return sorted(m for m in modules if any(m == n or m.startswith(n + ".") for n in names))


def test_version_loads_no_click_and_no_command():
    r, modules = _run("--version")
    assert r.returncode == 0
    assert r.stdout == f"rmqdump, version {__version__}\n"  # click's own version_option text
    assert _loaded(modules, ("click", "rich", "numpy", "rmqdump.cli.app", "rmqdump.store", "rmqdump.codec")) == []


def test_version_through_click_is_the_same_answer():
    """Anything beside --version still goes through the click group, whose answer is the same text."""
    r, modules = _run("--traceback", "--version")
    assert (r.returncode, r.stdout) == (0, f"rmqdump, version {__version__}\n")
    assert "click" in modules


#: never needed by a key lookup through the index (to jsonl, quiet)
NOT_FOR_LOOKUP = (
    "numpy", "numba", "llvmlite", "pyarrow", "pyspark", "rich", "csv", "calendar", "shutil", "tempfile", "hashlib",
    "rmqdump.fast", "rmqdump.analysis.verify", "rmqdump.analysis.scan", "rmqdump.write", "rmqdump.broker.recovery",
    "rmqdump.cli.scan", "rmqdump.cli.timer", "rmqdump.store.indexfile.writer",
)


def test_key_lookup_loads_only_what_it_uses():
    r, modules = _run("lookup", str(FIXTURE), "--key", "k1", "--topic", "TopicProps", "-f", "jsonl", "-q")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines()]
    assert [(row["offset"], row["topic"], row["keys"]) for row in rows] == [(8192, "TopicProps", ["k1", "k2", "k3"])]
    assert _loaded(modules, NOT_FOR_LOOKUP) == []
    assert "rmqdump.store.indexfile.reader" in modules  # it did go through the index


def test_index_writer_names_still_import_from_the_package():
    """The writer is loaded on first use of its names, which stay importable from rmqdump.store.indexfile."""
    from rmqdump.store import indexfile
    from rmqdump.store.indexfile import writer

    for name in sorted(indexfile._WRITER):
        assert getattr(indexfile, name) is getattr(writer, name)


def test_a_command_starts_no_blas_threads():
    """numpy's OpenBLAS starts a thread per core at import unless told otherwise; the CLI tells it (rmqdump
    multiplies no matrices), so a command's process holds no idle BLAS threads beside the walk."""
    import os

    if (os.cpu_count() or 1) < 2:
        import pytest

        pytest.skip("one CPU: OpenBLAS starts no threads to count")
    code = ("import os, sys\nfrom rmqdump.cli import main\nsys.argv[0] = 'rmqdump'\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nimport numpy\n"
            "sys.stderr.write('\\n%d\\n' % len(os.listdir('/proc/self/task')))\n")
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    r = subprocess.run([sys.executable, "-c", code, "info", str(FIXTURE)], capture_output=True, text=True,
                       timeout=120, env=env)
    assert int(r.stderr.splitlines()[-1]) == 1, r.stderr[-2000:]


def test_verify_loads_rich_on_a_second_thread_while_it_walks():
    """A table report needs rich (~70 ms of imports): verify of a big enough store starts importing it on a
    thread of its own, and prints the same report."""
    code = ("import sys, threading\nimport rmqdump.cli.verify as v\nv.PRELOAD_BYTES = 0\n"
            "started = []\nreal = threading.Thread.start\n"
            "def start(self):\n    started.append(self.name)\n    real(self)\n"
            "threading.Thread.start = start\nfrom rmqdump.cli import main\nsys.argv = ['rmqdump', 'verify', sys.argv[1]]\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\nsys.stderr.write('\\nSTARTED ' + ','.join(started) + '\\n')\n")
    r = subprocess.run([sys.executable, "-c", code, str(FIXTURE)], capture_output=True, text=True, timeout=120)
    assert "rmqdump-preload" in r.stderr.splitlines()[-1].split(" ", 1)[1].split(",")
    plain = subprocess.run([sys.executable, "-m", "rmqdump.cli", "verify", str(FIXTURE)], capture_output=True,
                           text=True, timeout=120)
    assert r.stdout == plain.stdout and "Summary:" in r.stdout


def test_verify_of_a_store_without_rocksdb_loads_no_rocksdb_helpers():
    """shutil and tempfile (with bz2 and lzma, ~6 ms) serve only a RocksDB database's shadow directory:
    verify of a store with none does not import them."""
    r, modules = _run("verify", "-q", "-f", "json", str(FIXTURE))
    assert r.returncode in (0, 1), r.stderr
    assert json.loads(r.stdout)["summary"]
    assert _loaded(modules, ("shutil", "tempfile")) == []
