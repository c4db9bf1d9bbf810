"""The click group behind ``rmqdump`` (built on first use, so ``rmqdump --version`` never imports click)."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

import click

from rmqdump import __version__

#: (module, attribute, one-line help) per command name: ``rmqdump.cli.COMMANDS``
Specs = dict[str, tuple[str, str, str]]


class LazyGroup(click.Group):
    """A click group whose subcommands are imported on first use."""

    def __init__(self, *args, specs: Specs, missing_extra: Callable[[ImportError, str | None], str | None],
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.specs = specs
        self.missing_extra = missing_extra

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.specs)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        spec = self.specs.get(name)
        if spec is None:
            return None
        import importlib

        module = importlib.import_module(spec[0])
        return getattr(module, spec[1])

    def invoke(self, ctx: click.Context):
        from rmqdump.errors import RmqdumpError

        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            # the reader went away (`| head`): stop quietly with 0, as `git log | head` does (click itself
            # would exit 1, which `set -o pipefail` reads as "damage found")
            silence_stdout()
            ctx.exit(0)
        except ImportError as e:
            msg = self.missing_extra(e, ctx.invoked_subcommand)
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
        rows = [(name, self.specs[name][2]) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def build(specs: Specs, missing_extra: Callable[[ImportError, str | None], str | None]) -> click.Group:
    """The ``rmqdump`` group over ``specs`` (``missing_extra`` turns a missing optional dependency into one line)."""

    @click.group(cls=LazyGroup, specs=specs, missing_extra=missing_extra,
                 context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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

    return cli


def _finish_evidence(path: str) -> None:
    """After the command: hash every file it read into the manifest (an error here exits 2)."""
    from rmqdump.disk import evidence
    from rmqdump.errors import RmqdumpError
    from rmqdump.store.geometry import layout_summary

    try:
        evidence.write_evidence(path, version=__version__, geometry=layout_summary)
    except RmqdumpError as e:
        click.echo(f"rmqdump: error: {e}", err=True)
        raise click.exceptions.Exit(2) from None


def silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail on the closed pipe."""
    from rmqdump.disk.durable import open_devnull

    try:
        devnull = open_devnull()
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
