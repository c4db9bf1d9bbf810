"""rmqdump command line: a thin click layer over the library (lazy-loaded per command)."""

from __future__ import annotations

import importlib
import os
import sys

import click

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


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        spec = COMMANDS.get(name)
        if spec is None:
            return None
        module = importlib.import_module(spec[0])
        return getattr(module, spec[1])

    def invoke(self, ctx: click.Context):
        from rmqdump.errors import RmqdumpError

        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # the reader went away (`| head`): stop quietly with 0, as `git log | head` does (click itself
            # would exit 1, which `set -o pipefail` reads as "damage found")
            _silence_stdout()
            ctx.exit(0)
        except ImportError as e:
            msg = missing_extra_message(e, ctx.invoked_subcommand)
            if msg is None or (ctx.obj or {}).get("traceback"):
                raise
            click.echo(f"rmqdump: error: {msg}", err=True)
            ctx.exit(2)
        except (RmqdumpError, OSError) as e:
            if (ctx.obj or {}).get("traceback"):
                raise
            if isinstance(e, RmqdumpError):
                msg = str(e)
            else:
                msg = (f"{e.filename}: " if getattr(e, "filename", None) else "") + (e.strerror or str(e))
            from rmqdump.cli.output import escape_control

            click.echo(f"rmqdump: error: {escape_control(msg)}", err=True)  # one line, whatever it quotes
            ctx.exit(2)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, "--version", prog_name="rmqdump")
@click.option("--traceback", is_flag=True, help="Show Python tracebacks instead of one-line errors (debugging).")
@click.option("--evidence", "evidence_file", type=click.Path(dir_okay=False, path_type=str), default=None,
              help="Write a manifest (path, size, sha256, mtime of every file read; version; geometry) to FILE.")
@click.pass_context
def cli(ctx: click.Context, traceback: bool, evidence_file: str | None) -> None:
    """Forensic toolkit for Apache RocketMQ broker stores.

    Reads commitlog, consumequeue, index, checkpoint and config files offline. Read-only
    commands never modify the store. Exit codes: 0 ok, 1 findings (damage found),
    2 error (bad input or usage).
    """
    ctx.ensure_object(dict)
    ctx.obj["traceback"] = traceback
    if evidence_file:
        from rmqdump.disk import evidence

        evidence.start()
        ctx.call_on_close(lambda: _finish_evidence(evidence_file))


def _finish_evidence(path: str) -> None:
    """After the command: hash every file it read into the manifest (an error here exits 2)."""
    from rmqdump import __version__
    from rmqdump.disk import evidence
    from rmqdump.errors import RmqdumpError
    from rmqdump.store.geometry import layout_summary

    try:
        evidence.write_evidence(path, version=__version__, geometry=layout_summary)
    except RmqdumpError as e:
        click.echo(f"rmqdump: error: {e}", err=True)
        raise click.exceptions.Exit(2) from None


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail on the closed pipe."""
    from rmqdump.disk.durable import open_devnull

    try:
        devnull = open_devnull()
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (errors become one line and exit 2 inside the group)."""
    try:
        cli.main(args=argv, prog_name="rmqdump")
    except BrokenPipeError:
        _silence_stdout()
        sys.exit(0)
    except KeyboardInterrupt:
        click.echo("rmqdump: interrupted", err=True)
        sys.exit(130)
