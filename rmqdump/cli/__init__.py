"""rmqdump command line: a thin click layer over the library (lazy-loaded per command).

Importing this package loads neither click nor any command: ``main`` answers ``rmqdump --version`` by
itself, and the click group (:mod:`rmqdump.cli.app`) is built on first use of ``cli``.
"""

from __future__ import annotations

import os
import sys

from rmqdump import __version__

# name -> (module, attribute, one-line help). Modules load only when their command runs,
# so `rmqdump --help` stays fast.
COMMANDS: dict[str, tuple[str, str, str]] = {
    "info": ("rmqdump.cli.info", "info", "Summarise a store: segments, queues, index files, checkpoint, lock."),
    "stats": ("rmqdump.cli.stats", "stats", "Counts and bytes per topic, queue, tag, host and hour; skew, sizes."),
    "pending": ("rmqdump.cli.pending", "pending", "What the broker still owes: undelivered delayed, half, timer messages."),
    "consumers": ("rmqdump.cli.consumers", "consumers", "Committed offsets, max offsets and lag per group; unconsumed messages."),
    "append": ("rmqdump.cli.append", "append", "Append messages to a stopped broker's store (under its lock)."),
    "repair": ("rmqdump.cli.repair", "repair", "Plan or apply the repair of a damaged store; undo a repair."),
    "scan": ("rmqdump.cli.scan", "scan", "Walk the commitlog and print its records."),
    "export": ("rmqdump.cli.export", "export", "Export records to Parquet or JSONL on this machine (pyarrow)."),
    "spark": ("rmqdump.cli.spark", "spark", "Jobs over many stores on Spark: export, verify, stats, lookup."),
    "lookup": ("rmqdump.cli.lookup", "lookup", "Find messages by key, client id, msg id, queue position or offset."),
    "cq": ("rmqdump.cli.cq", "cq", "Dump consume queues: min/max offsets, gaps, entries."),
    "index": ("rmqdump.cli.index", "index", "Dump index files: headers, slot occupancy, chain lengths, entries."),
    "verify": ("rmqdump.cli.verify", "verify", "Check a store and predict what the broker's recovery would drop."),
    "diff": ("rmqdump.cli.diff", "diff", "Compare two stores: first commitlog divergence, queues, index, config."),
    "fingerprint": ("rmqdump.cli.fingerprint", "fingerprint", "Digest per segment and queue file; compare replicas."),
    "bundle": ("rmqdump.cli.bundle", "bundle", "Write a support bundle: layout, config without secrets, info, verify."),
    "timer": ("rmqdump.cli.timer", "timer", "The 5.x timer store: pending timer deliveries per due time; its checks."),
    "report": ("rmqdump.cli.report", "report", "Write one self-contained HTML page: store map, topics, lag, findings."),
}


#: optional dependency (top-level module) -> the extra that installs it
EXTRAS = {"pyspark": "spark", "pyarrow": "export", "numba": "fast", "numpy": "fast", "llvmlite": "fast",
          "lz4": "codecs", "zstandard": "codecs", "rocksdict": "rocksdb"}


def missing_extra_message(e: ImportError, command: str | None) -> str | None:
    """One line naming the extra to install when ``e`` is a missing optional dependency, else None."""
    top = (e.name or "").split(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    if command == "spark" and top == "pyarrow":
        extra = "spark"
    what = f"`rmqdump {command}`" if command else "this command"
    return f"{what} needs {top}, which is not installed: pip install 'rmqdump[{extra}]'"


def __getattr__(name: str):
    # the click group and its class, built on first use (``from rmqdump.cli import cli``)
    if name == "cli":
        return _group()
    if name == "LazyGroup":
        from rmqdump.cli.app import LazyGroup

        return LazyGroup
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _group():
    group = globals().get("cli")
    if group is None:
        from rmqdump.cli.app import build

        globals()["cli"] = group = build(COMMANDS, missing_extra_message)
    return group


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (errors become one line and exit 2 inside the group)."""
    try:
        if (sys.argv[1:] if argv is None else argv) == ["--version"]:
            # click's own answer and exit, without importing click (start-up time)
            sys.stdout.write(f"rmqdump, version {__version__}\n")
            sys.stdout.flush()
            sys.exit(0)
        # rmqdump never multiplies matrices: numpy's BLAS would start a thread per core at import, which
        # spin beside the walk (~0.1 s of CPU per command); a value the user set is kept
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
        _group().main(args=argv, prog_name="rmqdump")
    except BrokenPipeError:
        from rmqdump.cli.app import silence_stdout

        silence_stdout()
        sys.exit(0)
    except KeyboardInterrupt:
        import click

        click.echo("rmqdump: interrupted", err=True)
        sys.exit(130)
