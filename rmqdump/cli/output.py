"""Rendering: one stdout console for data, one stderr console for diagnostics, record writers."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # rich is imported where it renders, so commands that print JSON never load it
    from rich.console import Console
    from rich.text import Text

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
_CONTROL = r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
_SURROGATE = r"[\ud800-\udfff]"
_JSON_UNSAFE = r"[\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]"


@functools.cache
def _re(pattern: str) -> re.Pattern:
    """``pattern`` compiled on first use: these character classes take milliseconds each to compile, which
    start-up would pay in every command whether it prints such text or not."""
    return re.compile(pattern)


def escape_control(s: str) -> str:
    """Make data safe for a terminal: control (including newline and tab, so a value can never start a
    forged output row), bidi and lone-surrogate characters become ``\\xNN``/``\\uNNNN``."""

    def rep(m: re.Match) -> str:
        c = ord(m.group())
        return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"

    return _re(_CONTROL).sub(rep, s)


def _dumps(obj, indent: int | None = None) -> str:
    """JSON text; a lone surrogate (undecodable bytes in a name) is written as a JSON escape, not a crash."""
    text = json.dumps(obj, ensure_ascii=False, indent=indent)
    if not text.isascii() and _re(_SURROGATE).search(text):  # isascii: O(1), no surrogate
        text = json.dumps(obj, ensure_ascii=True, indent=indent)
    return text


def terminal_json(text: str) -> str:
    """JSON text for a terminal: DEL, C1 controls, line separators and bidi overrides (which ``json.dumps``
    leaves raw) become ``\\uNNNN`` escapes; the JSON value is the same."""
    return _re(_JSON_UNSAFE).sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def _stdout_is_terminal(out) -> bool:
    try:
        return out.isatty()
    except (AttributeError, ValueError):
        return False


def _plain(s: str) -> str:
    """Text for CSV: lone surrogates spelled ``\\udcNN`` so the UTF-8 stream can take them."""
    return _re(_SURROGATE).sub(lambda m: f"\\u{ord(m.group()):04x}", s)


def _no_color() -> bool:
    return "NO_COLOR" in os.environ


#: what a table report imports (~70 ms): :func:`preload_rich` loads it while the command works
RICH_MODULES = ("rich.console", "rich.text", "rich.cells")


def _import_quietly(names: Sequence[str]) -> None:
    import importlib

    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - the report's own import raises it, on the main thread
            return


def preload_rich() -> None:
    """Import rich for a table report on a background thread, while a long command works on the main one
    (whose compiled walks release the GIL); the report's own imports then find it loaded, or wait for it."""
    if all(name in sys.modules for name in RICH_MODULES):
        return
    import threading

    threading.Thread(target=_import_quietly, args=(RICH_MODULES,), name="rmqdump-preload", daemon=True).start()


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
        self._cols = [as_column(c, n) for n, c in enumerate(self.table_columns)]
        self._plan: TablePlan | None = None
        self._announced = False
        self._hidden: set[int] = set()
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
        cols = self._cols
        rows = [[_cell_text(row.get(c.key), c.style) for c in cols] for row in self._pending]
        old = self._plan
        plan = old
        if old is None:
            plan = plan_table(cols, rows, self._console.width)
            if self.title:
                from rich.text import Text

                self._console.print(Text(escape_control(self.title), style="bold"))
        elif any(r[i].cell_len > old.widths[i] for r in rows for i in old.shown if cols[i].kind in ("num", "fixed")):
            plan = plan_table(cols, rows, old.width, floor=old)  # a longer offset: never cut, text gives way
        # a new header when the columns change (a longer offset left no room for one of them)
        render_table(self._console, cols, plan, rows,
                     show_header=old is None or (plan.shown, plan.below) != (old.shown, old.below))
        self._hidden.update(plan.hidden)
        self._plan = plan
        self._pending.clear()

    def _announce(self) -> None:
        """Name the columns the terminal was too narrow for, once, on stderr."""
        plan = self._plan
        note = None
        if plan is not None and not self._announced:
            note = hidden_note(self._cols, TablePlan(plan.width, plan.shown, plan.widths, sorted(self._hidden)))
        if note:
            self._announced = True
            diag(note, "yellow")

    def flush(self) -> None:
        """Print buffered table rows and flush the stream (used by ``--follow``)."""
        if self.fmt == "table":
            self._flush_table()
        self.out.flush()
        if self.fmt == "table":
            self._announce()

    def close(self) -> None:
        if self.fmt == "json":
            self.out.write("[]\n" if self.count == 0 else "\n]\n")
        elif self.fmt == "table":
            self._flush_table()
        self.out.flush()
        if self.fmt == "table":
            self._announce()


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


def utc_ms(ms: int | None) -> str:
    """Epoch milliseconds as a table cell: ``2026-11-01T00:00:02.037Z`` (UTC, 24 cells; ``-`` for none)."""
    text = iso_ms(ms)
    return text[:-6] + "Z" if text.endswith("+00:00") else text


# --- tables that fit the terminal -----------------------------------------------------------------------------

class Column(NamedTuple):
    """One table column; ``kind`` says how it may give way when the terminal is narrow.

    * ``num``: numbers and offsets, never shortened (the column is as wide as its widest value);
    * ``fixed``: short fixed-format text (times, states, kinds, file names, locations), never shortened;
    * ``text``: free text (topics, keys, bodies), abbreviated with a visible ``…`` down to ``min`` cells;
    * ``wrap``: long free text (details, notes), wrapped in its column; when the terminal leaves it fewer than
      ``min`` cells it goes on its own indented line under its row.

    When even the minimum widths do not fit, whole columns are left out, highest ``priority`` first (0: never),
    and the table says which (:func:`hidden_note`). Headers are never shortened.
    """

    key: str
    header: str
    kind: str = "text"
    priority: int = 5
    max: int | None = None
    min: int = 8
    justify: str = "left"
    style: str | None = None


#: how old ``(key, header, width)`` column tuples are read
_NUM_KEYS = frozenset({"offset", "queue_id", "queue_offset", "size", "commit_log_offset", "phy_offset", "number",
                       "key_hash", "slot", "time_diff", "time", "prev_index", "level", "committed", "min_offset",
                       "max_offset", "lag", "records", "bytes", "body_bytes", "first_offset", "end_offset"})
_FIXED_KEYS = frozenset({"store_time", "msg_id", "uniq_key", "file", "status", "state", "kind", "due"})
GAP = 2
INDENT = 4


def as_column(spec: Column | tuple, position: int) -> Column:
    """A :class:`Column` from a Column or an old ``(key, header, width)`` tuple (first column kept longest)."""
    if isinstance(spec, Column):
        return spec
    key, header, width = spec
    kind = "num" if key in _NUM_KEYS else "fixed" if key in _FIXED_KEYS else "text"
    return Column(key, header, kind, position, width)


@dataclass
class TablePlan:
    """Which columns a table shows, how wide, which it leaves out and which go under their row."""

    width: int
    shown: list[int]
    widths: dict[int, int]
    hidden: list[int] = field(default_factory=list)
    below: list[int] = field(default_factory=list)


def _cell_text(v, style: str | None = None) -> Text:
    from rich.text import Text

    if isinstance(v, Text):
        if style:
            v = v.copy()
            v.stylize(style)
        return v
    return Text(escape_control(_cell(v)), style=style or "")


def plan_table(columns: Sequence[Column], rows: Sequence[Sequence[Text]], width: int,
               floor: TablePlan | None = None) -> TablePlan:
    """Lay ``columns`` out in ``width`` cells for these ``rows`` (cells as rich Text). With ``floor`` (the plan
    of a streamed table's earlier rows), numbers and fixed text are no narrower than there."""
    from rich.cells import cell_len

    natural = [max([cell_len(c.header)] + [r[i].cell_len for r in rows]) for i, c in enumerate(columns)]

    def need(i: int) -> int:
        c = columns[i]
        head = cell_len(c.header)
        if c.kind in ("num", "fixed"):
            return max(natural[i], floor.widths.get(i, 0) if floor else 0)
        return max(head, min(natural[i], c.max or natural[i], c.min))

    def total(idx: list[int]) -> int:
        return sum(need(i) for i in idx) + GAP * max(0, len(idx) - 1)

    wraps = [i for i, c in enumerate(columns) if c.kind == "wrap"]
    shown = [i for i in range(len(columns)) if i not in wraps]
    hidden, below = [], []
    while total(shown) > width:
        droppable = [i for i in shown if columns[i].priority > 0]
        if not droppable:
            break
        drop = max(droppable, key=lambda i: (columns[i].priority, i))
        shown.remove(drop)
        hidden.append(drop)
    for i in wraps:
        if total(shown) + GAP + need(i) <= width:
            shown.append(i)
        else:
            below.append(i)
    shown.sort()
    hidden.sort()
    widths = {i: need(i) for i in shown}
    extra = width - total(shown)
    # text columns grow to their natural width first (most needed first), then wrapped ones take the rest
    for i in sorted((i for i in shown if columns[i].kind in ("text", "wrap")),
                    key=lambda i: (columns[i].kind == "wrap", columns[i].priority)):
        if extra <= 0:
            break
        c = columns[i]
        want = (natural[i] if c.kind == "wrap" else min(natural[i], c.max or natural[i])) - widths[i]
        give = max(0, min(want, extra))
        widths[i] += give
        extra -= give
    return TablePlan(width, shown, widths, hidden, below)


def render_table(console: Console, columns: Sequence[Column], plan: TablePlan, rows: Sequence[Sequence[Text]],
                 show_header: bool = True) -> None:
    """Print ``rows`` as ``plan`` lays them out: one line per row (more when a ``wrap`` cell wraps), then the
    cells that go under their row, indented. No line is wider than the plan (unless its never-shortened
    columns alone are)."""
    from rich.text import Text

    sep = Text(" " * GAP)
    last = plan.shown[-1] if plan.shown else None
    out: list[Text] = []

    def line(parts: list[tuple[int, Text]]) -> Text:
        pieces = []
        for i, t in parts:
            pad = plan.widths[i] - t.cell_len
            if pad > 0 and columns[i].justify == "right":
                t = Text(" " * pad) + t
            elif pad > 0 and i != last:
                t = t + Text(" " * pad)
            pieces.append(t)
        joined = sep.join(pieces)
        joined.rstrip()
        return joined

    if show_header and plan.shown:
        out.append(line([(i, Text(columns[i].header, style="bold")) for i in plan.shown]))
        out.extend(Text(" " * INDENT) + Text(columns[i].header, style="bold") for i in plan.below
                   if any(_shows(r[i]) for r in rows))
    under = max(8, plan.width - INDENT)
    for row in rows:
        cells: list[tuple[int, list[Text]]] = []
        for i in plan.shown:
            c, t = columns[i], row[i]
            if c.kind == "wrap":
                lines = [x for x in t.wrap(console, plan.widths[i], overflow="fold")] or [Text("")]
                for x in lines:
                    x.rstrip()
            elif c.kind == "text" and t.cell_len > plan.widths[i]:
                t = t.copy()
                t.truncate(plan.widths[i], overflow="ellipsis")
                lines = [t]
            else:
                lines = [t]
            cells.append((i, lines))
        for k in range(max(len(ls) for _, ls in cells) if cells else 0):
            out.append(line([(i, ls[k] if k < len(ls) else Text("")) for i, ls in cells]))
        for i in plan.below:
            if _shows(row[i]):
                for x in row[i].wrap(console, under, overflow="fold"):
                    x.rstrip()
                    out.append(Text(" " * INDENT) + x)
    if out:
        console.print(Text("\n").join(out), soft_wrap=True)


def _shows(cell: Text) -> bool:
    return cell.plain.strip() not in ("", "-")


def hidden_note(columns: Sequence[Column], plan: TablePlan, fmt_hint: str = "-f jsonl") -> str | None:
    """The line that names the columns a narrow terminal left out, and how to see them (None: none left out)."""
    if not plan.hidden:
        return None
    names = ", ".join(columns[i].header for i in plan.hidden)
    return f"hidden at {plan.width} columns: {names} (a wider terminal or {fmt_hint} shows them)"


def print_table(console: Console, columns: Sequence[Column | tuple], rows: Iterable[Sequence], *,
                title=None, show_header: bool = True, fmt_hint: str = "-f json") -> TablePlan:
    """A whole table (a report's) laid out for the console's width; hidden columns are named under it."""
    from rich.text import Text

    cols = [as_column(c, n) for n, c in enumerate(columns)]
    cells = [[_cell_text(v, c.style) for c, v in zip(cols, r, strict=True)] for r in rows]
    plan = plan_table(cols, cells, console.width)
    if title is not None:
        console.print(title if isinstance(title, Text) else Text(escape_control(str(title)), style="bold"))
    render_table(console, cols, plan, cells, show_header)
    note = hidden_note(cols, plan, fmt_hint)
    if note:
        console.print(Text(note, style="dim"))
    return plan


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
