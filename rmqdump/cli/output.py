"""Rendering: one stdout console for data, one stderr console for diagnostics, record writers."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # rich is imported where it renders, so commands that print JSON never load it
    from rich.console import Console

#: rich names this module used to import eagerly; still reachable as ``output.<name>`` (loaded on first use)
_RICH = {"Console": "rich.console", "Table": "rich.table", "Text": "rich.text", "Progress": "rich.progress",
         "BarColumn": "rich.progress", "DownloadColumn": "rich.progress", "TextColumn": "rich.progress",
         "TimeRemainingColumn": "rich.progress", "TransferSpeedColumn": "rich.progress"}


def __getattr__(name: str):
    module = _RICH.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


FORMATS = ("table", "jsonl", "json", "csv")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def escape_control(s: str) -> str:
    """Make data safe for a terminal: control (including newline and tab, so a value can never start a
    forged output row), bidi and lone-surrogate characters become ``\\xNN``/``\\uNNNN``."""

    def rep(m: re.Match) -> str:
        c = ord(m.group())
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"

    return _CONTROL.sub(rep, s)


def _dumps(obj, indent: int | None = None) -> str:
    """JSON text; a lone surrogate (undecodable bytes in a name) is written as a JSON escape, not a crash."""
    text = json.dumps(obj, ensure_ascii=False, indent=indent)
    if _SURROGATE.search(text):
        text = json.dumps(obj, ensure_ascii=True, indent=indent)
    return text


_JSON_UNSAFE = re.compile(r"[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def terminal_json(text: str) -> str:
    """JSON text for a terminal: DEL, C1 controls, line separators and bidi overrides (which ``json.dumps``
    leaves raw) become ``\\uNNNN`` escapes; the JSON value is the same."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _stdout_is_terminal(out) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def _plain(s: str) -> str:
    """Text for CSV: lone surrogates spelled ``\\udcNN`` so the UTF-8 stream can take them."""
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", s)


def _no_color() -> bool:
    return "NO_COLOR" in os.environ


def stdout_console() -> Console:
    """Data console; wide when piped so tables are not squeezed to 80 columns."""
    from rich.console import Console

    width = None if sys.stdout.isatty() else 240

    class _Console(Console):
        def on_broken_pipe(self) -> None:  # the reader went away (`| head`): exit 0, not rich's 1
            self.quiet = True
            raise BrokenPipeError

    return _Console(file=sys.stdout, highlight=False, no_color=_no_color(), width=width)


def stderr_console() -> Console:
    """Diagnostics console; soft-wrapped so every message stays one line."""
    from rich.console import Console

    return Console(file=sys.stderr, stderr=True, highlight=False, no_color=_no_color(), soft_wrap=True)


def default_format(fmt: str | None, report: bool = False) -> str:
    """The output format when ``--format`` is not given. Records (scan, lookup, ...) are ``table`` on a
    terminal and ``jsonl`` when piped, for the next program; a report (verify, info, repair, stats,
    consumers, pending) is read by people, so it stays human text when piped too (plain, no colour):
    JSON only with ``-f json``/``-f jsonl``."""
    if fmt:
        return fmt
    if report:
        return "table"
    return "table" if sys.stdout.isatty() else "jsonl"


def iso_ms(ms: int | None) -> str:
    """Epoch milliseconds as UTC ISO 8601 (``-`` for none/zero/out of range)."""
    if not ms:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat(timespec="milliseconds")
    except (OverflowError, OSError, ValueError):
        return str(ms)


def _jsonable(v):
    return v


class RecordWriter:
    """Streams dict rows as table, jsonl, json (one array) or csv to stdout."""

    def __init__(self, fmt: str, columns: Sequence[str], table_columns: Sequence[tuple[str, str, int | None]] = (),
                 out=None, title: str | None = None):
        self.fmt = fmt
        self.columns = list(columns)
        self.table_columns = list(table_columns) or [(c, c, None) for c in columns]
        self.out = out or sys.stdout
        self.count = 0
        self.title = title
        self._pending: list[dict] = []
        self._csv = None
        self._console = stdout_console() if fmt == "table" else None
        # on a terminal every format is escaped (piped output stays byte-exact)
        self._tty = fmt != "table" and _stdout_is_terminal(self.out)

    def write(self, row: dict) -> None:
        fmt = self.fmt
        if fmt == "jsonl":
            text = _dumps(row)
            self.out.write((terminal_json(text) if self._tty else text) + "\n")
        elif fmt == "json":
            text = _dumps(row)
            self.out.write(("[\n" if self.count == 0 else ",\n") + (terminal_json(text) if self._tty else text))
        elif fmt == "csv":
            if self._csv is None:
                import csv

                self._csv = csv.writer(self.out)
                self._csv.writerow(self.columns)
            cells = [_csv_cell(row.get(c)) for c in self.columns]
            if self._tty:
                cells = [escape_control(c) if isinstance(c, str) else c for c in cells]
            self._csv.writerow(cells)
        else:
            self._pending.append(row)
            if len(self._pending) >= 200:
                self._flush_table()
        self.count += 1

    def _flush_table(self) -> None:
        if not self._pending:
            return
        from rich.table import Table
        from rich.text import Text

        first = self.count <= len(self._pending)
        table = Table(show_header=first, box=None, pad_edge=False, title=self.title if first else None)
        for _, header, width in self.table_columns:
            table.add_column(header, width=width, no_wrap=True, overflow="ellipsis")
        for row in self._pending:
            table.add_row(*[Text(escape_control(_cell(row.get(k)))) for k, _, _ in self.table_columns])
        self._console.print(table)
        self._pending.clear()

    def flush(self) -> None:
        """Print buffered table rows and flush the stream (used by ``--follow``)."""
        if self.fmt == "table":
            self._flush_table()
        self.out.flush()

    def close(self) -> None:
        if self.fmt == "json":
            self.out.write("[]\n" if self.count == 0 else "\n]\n")
        elif self.fmt == "table":
            self._flush_table()
        self.out.flush()


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, (list, tuple)):
        return " ".join(map(str, v))
    if isinstance(v, dict):
        return json.dumps(v, ensure_ascii=False)
    return str(v)


def _csv_cell(v):
    if v is None:
        return ""
    if isinstance(v, dict):
        return _dumps(v)
    if isinstance(v, (list, tuple)):
        return _plain(" ".join(map(str, v)))
    if isinstance(v, str):
        return _plain(v)
    return v


def report_body_errors(decoder, quiet: bool) -> None:
    """On stderr: the records whose body could not be rendered as asked (a ``--body`` callable that
    raised, a body that would not ``--decompress``): the first few, then the count."""
    if decoder.errors and not quiet:
        for m in decoder.error_messages:
            diag(m, "yellow")
        if decoder.errors > len(decoder.error_messages):
            diag(f"{decoder.errors} records in all whose body could not be rendered as asked", "yellow")


def emit_document(doc, fmt: str, render_table: Callable[[Console, object], None]) -> None:
    """Print one document (info, stats, verify report): JSON for json/jsonl, rich for table."""
    if fmt in ("json", "jsonl"):
        text = _dumps(doc, indent=2 if fmt == "json" else None)
        sys.stdout.write((terminal_json(text) if _stdout_is_terminal(sys.stdout) else text) + "\n")
    elif fmt == "csv":
        raise ValueError("csv is not available for this command")
    else:
        render_table(stdout_console(), doc)


#: Work shorter than this many seconds never shows a progress bar.
PROGRESS_DELAY = 1.0


@contextmanager
def progress_bar(total: int, description: str, enabled: bool, delay: float = PROGRESS_DELAY):
    """A rich progress bar on stderr when it is a terminal; otherwise a no-op updater.

    The bar appears only once the work has taken ``delay`` seconds (quick runs stay quiet)
    and disappears when done. Pass ``enabled=False`` for ``--quiet``.
    """
    if not enabled or not sys.stderr.isatty() or total <= 0:
        yield lambda done: None
        return
    t0 = time.monotonic()
    state: dict = {}

    def update(done: int) -> None:
        if "progress" not in state:
            if time.monotonic() - t0 < delay:
                return
            from rich.progress import (
                BarColumn,
                DownloadColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
                TransferSpeedColumn,
            )

            progress = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(),
                                TransferSpeedColumn(), TimeRemainingColumn(), console=stderr_console(),
                                transient=True)
            progress.start()
            state["progress"] = progress
            state["task"] = progress.add_task(description, total=total)
        state["progress"].update(state["task"], completed=done)

    try:
        yield update
    finally:
        if "progress" in state:
            state["progress"].stop()


def _plain_stderr() -> bool:
    """Whether rich would print to stderr without any styling (not a terminal, no FORCE_COLOR/TTY_COMPATIBLE)."""
    if "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ:
        return False
    try:
        return not sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def diag(message: str, style: str | None = None) -> None:
    """One diagnostic line on stderr (never on the data stream).

    Styled through rich on a terminal; written as is otherwise (what rich would print, without loading it).
    """
    text = escape_control(message)
    if _plain_stderr():
        sys.stderr.write(text + "\n")
        sys.stderr.flush()
        return
    from rich.text import Text

    stderr_console().print(Text(text, style=style or ""))


def consume(it: Iterable) -> None:
    for _ in it:
        pass
