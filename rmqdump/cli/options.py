"""Shared click option decorators: one contract per idea, so every command has the same switches.

| idea | option | commands |
|---|---|---|
| output | ``--format/-f``, ``--quiet/-q``: records default to jsonl when piped (:data:`output_options`), reports stay text (:data:`report_output_options`) | every command |
| how bodies print | ``--body SPEC`` + ``--decompress`` (:data:`body_decoder_options`) | scan, lookup, pending, consumers |
| bodies in an export | ``--body`` flag + ``--decompress`` (:data:`include_body_options`) | export, spark export |
| body CRC | ``--crc check|flag|off``; ``--no-crc`` = ``--crc off`` (:func:`crc_option`) | scan, stats, pending, consumers, export, spark export |
| store-time window | ``--since/--until``; ``--begin/--end`` aliases (:data:`time_window_options`) | scan, export, lookup, spark |
| how many records | ``--limit/-n``; ``--max`` alias (:func:`limit_option`) | scan, lookup, spark lookup |
| record filters | ``--topic --queue --tag --key --body-contains --body-regex`` + the time window (:func:`record_filter_options`) | scan, export, spark export |
| reading | ``--no-mmap``, ``--max-message-size``, ``--commitlog-path A,B``/``--broker-config FILE`` (multi-path commitlog) (:data:`access_options`; :func:`rmqdump.codec.layout.record_size_limit`) | every reader |

``append --body TEXT`` is a different idea (the body to write), not a rendering.
"""

from __future__ import annotations

import functools
import inspect
from datetime import datetime, timezone
from typing import TYPE_CHECKING

import click

from rmqdump.cli.output import FORMATS

if TYPE_CHECKING:
    from rmqdump.rows.bodyfmt import BodyDecoder


def compose(*decorators):
    def apply(f):
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


store_argument = click.argument("store", type=click.Path(exists=True, path_type=str), metavar="STORE")

_QUIET = click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary lines on stderr.")

#: records (scan, lookup, ...): for the next program when piped
output_options = compose(
    click.option("--format", "-f", "fmt", type=click.Choice(FORMATS), default=None,
                 help="Output format (default: table on a terminal, jsonl when piped)."),
    _QUIET,
)

#: reports (verify, info, repair, stats, pending): read by people, also when piped
report_output_options = compose(
    click.option("--format", "-f", "fmt", type=click.Choice(FORMATS), default=None,
                 help="Output format (default: table, plain text when piped; json or jsonl for programs)."),
    _QUIET,
)

body_options = compose(
    click.option("--body", "body_mode", type=click.Choice(("none", "text", "hex", "base64")), default=None,
                 help="How to print bodies (default: base64 in jsonl/json/csv, none in table)."),
    click.option("--decompress", is_flag=True, help="Decompress zlib/lz4/zstd bodies before printing."),
)


class BodySpecType(click.ParamType):
    """A ``--body`` spec (validated here; turned into a decoder by :func:`resolve_body_decoder`)."""

    name = "SPEC"

    def convert(self, value, param, ctx):
        from rmqdump.rows.bodyfmt import BodyDecoder, BodySpecError, parse_body_spec

        if isinstance(value, BodyDecoder):
            return value.spec
        try:
            parse_body_spec(value)
        except BodySpecError as e:
            self.fail(str(e), param, ctx)
        return value


#: ``--body`` with pluggable decoders (a superset of :data:`body_options`' choices) and ``--decompress``.
body_decoder_options = compose(
    click.option("--body", "body_mode", type=BodySpecType(), default=None,
                 help="How to print bodies: none, text, text:CHARSET (e.g. text:gbk), hex, base64, json "
                      "(parsed, embedded as JSON) or MODULE:FUNCTION (your Python callable: bytes -> str or "
                      "JSON value). Default: base64 in jsonl/json/csv, none in table."),
    click.option("--decompress", is_flag=True, help="Decompress zlib/lz4/zstd bodies before printing."),
)


def resolve_body_decoder(spec: str | None, fmt: str) -> BodyDecoder:
    """The :class:`~rmqdump.rows.bodyfmt.BodyDecoder` for a validated ``--body`` value and format."""
    from rmqdump.rows.bodyfmt import default_body_decoder

    return default_body_decoder(spec, fmt)


now_option = click.option("--now", "now", default=None, metavar="TIME",
                          help="Reference time for due/overdue (ISO 8601 or epoch ms; default: the clock). "
                               "Pin it for reproducible output.")

#: ``--body`` for exports: whether the body column is written at all (binary in Parquet, base64 in JSONL)
include_body_options = compose(
    click.option("--body", is_flag=True, help="Include message bodies (binary in Parquet, base64 in JSONL)."),
    click.option("--decompress", is_flag=True, help="Decompress zlib/lz4/zstd bodies (with --body)."),
)

#: the store-time window; ``--begin``/``--end`` are the older spellings of lookup
time_window_options = compose(
    click.option("--since", "--begin", "since", default=None, metavar="TIME",
                 help="Store time lower bound (ISO 8601, UTC by default, or epoch ms)."),
    click.option("--until", "--end", "until", default=None, metavar="TIME",
                 help="Store time upper bound (ISO 8601 or epoch ms)."),
)


def parse_window(since: str | None, until: str | None) -> tuple[int | None, int | None]:
    """The parsed ``--since``/``--until`` pair (epoch ms), refusing a window that ends before it starts."""
    lo, hi = parse_time(since, "--since"), parse_time(until, "--until")
    if lo is not None and hi is not None and lo > hi:
        raise click.BadParameter("--since is after --until", param_hint="--since")
    return lo, hi


def limit_option(help: str):
    """``--limit/-n N`` (``--max`` is the older spelling of lookup): print at most N records."""
    return click.option("--limit", "-n", "--max", "limit", type=click.IntRange(0), default=None, metavar="N",
                        help=help)


def record_filter_options(topic_help: str = "Only records of this topic (repeatable)."):
    """``--topic/--queue/--tag/--key/--body-contains/--body-regex`` and the time window: the criteria of
    :class:`rmqdump.rows.filters.RecordFilter` (the command receives ``body_contains`` and ``body_regex``)."""
    return compose(
        click.option("--topic", "-t", multiple=True, help=topic_help),
        click.option("--queue", "queue_id", type=int, default=None, help="Only records of this queue id."),
        click.option("--tag", multiple=True, help="Only records whose TAGS equals this (repeatable)."),
        click.option("--key", multiple=True, help="Only records with this key in KEYS or as UNIQ_KEY (repeatable)."),
        click.option("--body-contains", multiple=True, metavar="TEXT",
                     help="Only records whose body contains TEXT (UTF-8; compressed bodies are decompressed first; "
                          "repeatable: any of them)."),
        click.option("--body-regex", default=None, metavar="RE",
                     help="Only records whose body matches the Python regular expression RE (searched in the "
                          "decompressed body read as UTF-8)."),
        time_window_options,
    )


def make_filter(topic, queue_id, tag, key, since, until, body_contains=(), body_regex=None):
    """The :class:`~rmqdump.rows.filters.RecordFilter` of :func:`record_filter_options` (None when it keeps all;
    a bad ``--body-regex`` is a one-line error)."""
    from rmqdump.rows.filters import RecordFilter

    lo, hi = parse_window(since, until)
    flt = RecordFilter(tuple(topic), queue_id, tuple(tag), tuple(key), lo, hi, tuple(body_contains), body_regex)
    return None if flt.empty else flt


CRC_HELP = {
    "check": "a body-CRC mismatch is damage (the walk stops there, as the broker's recovery does)",
    "flag": "keep going and set crc_ok",
    "off": "do not compute body CRCs (faster; the broker's dispatcher does not check them either)",
}


def crc_option(modes: tuple[str, ...] = ("check", "off")):
    """``--crc MODE`` (default check) with ``--no-crc`` as the spelling of ``--crc off``; the command
    receives ``crc`` (one of ``modes``)."""
    help_text = "; ".join(f"{m}: {CRC_HELP[m]}" for m in modes) + "."

    def decorate(f):
        @functools.wraps(f)
        def command(*args, crc: str, no_crc: bool, **kwargs):
            if no_crc:
                src = click.get_current_context().get_parameter_source("crc")
                if src is not None and src.name != "DEFAULT" and crc != "off":
                    raise click.UsageError(f"--no-crc contradicts --crc {crc}")
                crc = "off"
            return f(*args, crc=crc, **kwargs)

        command = click.option("--no-crc", is_flag=True, help="Same as --crc off.")(command)
        return click.option("--crc", type=click.Choice(modes), default="check", show_default=True,
                            help=help_text)(command)

    return decorate


def live_broker(paths) -> tuple[str, int] | None:
    """(store root, pid) when a process holds the broker ``lock`` of the store a path belongs to (a store
    root, its ``commitlog/`` or a segment in it): a live broker, which may truncate or delete files."""
    from pathlib import Path

    from rmqdump.broker.lock import probe_lock
    from rmqdump.errors import RmqdumpError

    for p in paths:
        p = Path(p)
        for root in (p, p.parent, p.parent.parent):
            if (root / "lock").is_file():
                try:
                    pid = probe_lock(root)
                except (RmqdumpError, OSError):
                    pid = None
                if pid is not None:
                    return str(root), pid
                break
    return None


def access_options(f):
    """``--no-mmap``, ``--max-message-size``, ``--commitlog-path`` and ``--broker-config`` (the latter shared with
    a command's own geometry option when it has one). A store whose broker lock is held (a live broker, which
    may truncate a file under a mapping: SIGBUS) is read with pread as if ``--no-mmap`` were given. The commitlog
    folders apply to every store the command opens (:func:`rmqdump.store.root.commitlog_paths`)."""
    own_config = "broker_config" in inspect.signature(f).parameters  # the command declares --broker-config

    @functools.wraps(f)
    def command(*args, no_mmap: bool, commitlog_path: str | None, **kwargs):
        from rmqdump.store.root import broker_config_commitlog_paths, commitlog_paths, split_paths

        broker_config = kwargs.get("broker_config") if own_config else kwargs.pop("broker_config", None)
        paths = split_paths(commitlog_path) if commitlog_path else None
        if paths is None and broker_config:
            paths = broker_config_commitlog_paths(broker_config)
            paths = paths if len(paths) > 1 else None  # one folder: the store's own commitlog/ layout
        if not no_mmap:
            src = kwargs.get("store") or kwargs.get("path") or kwargs.get("stores")
            live = live_broker(src if isinstance(src, (list, tuple)) else [src]) if src else None
            if live is not None:
                no_mmap = True
                if not kwargs.get("quiet"):
                    from rmqdump.cli.output import diag

                    diag(f"process {live[1]} holds {live[0]}/lock (a live broker): reading with pread, as with "
                         "--no-mmap (a file truncated under a mapping would end rmqdump with SIGBUS)")
        with commitlog_paths(paths):
            return f(*args, no_mmap=no_mmap, **kwargs)

    if not own_config:
        command = click.option("--broker-config", type=click.Path(exists=True, dir_okay=False), default=None,
                               metavar="FILE",
                               help="The broker's properties file: its storePathCommitLog (and "
                                    "readOnlyCommitLogStorePaths) name the commitlog folders when there are "
                                    "several.")(command)
    command = click.option("--commitlog-path", default=None, metavar="A,B",
                           help="Commitlog folders, comma-separated as the broker's storePathCommitLog (multi-path); "
                                "relative ones are inside STORE. Default: STORE/commitlog.")(command)

    command = click.option("--max-message-size", type=click.IntRange(1, 1 << 30), default=4 * 1024 * 1024,
                           show_default=True,
                           help="Broker maxMessageSize; records over this + 64 KiB are treated as damage.")(command)
    return click.option("--no-mmap", is_flag=True,
                        help="Read with pread instead of mmap (automatic when a broker holds the store's lock: "
                             "safe if it truncates files under us).")(command)


def parse_time(value: str | None, param: str) -> int | None:
    """ISO 8601 (UTC unless an offset is given) or epoch milliseconds -> epoch ms."""
    if value is None:
        return None
    v = value.strip()
    if v.lstrip("-").isdigit():
        return int(v)
    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither epoch milliseconds nor an ISO 8601 time",
                                 param_hint=param) from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return int(dt.timestamp() * 1000)


def resolve_body_mode(body_mode: str | None, fmt: str) -> str:
    if body_mode:
        return body_mode
    return "none" if fmt == "table" else "base64"


def _delay_levels(ctx, param, value):
    """--delay-levels SPEC -> milliseconds per level (None: the broker's default)."""
    if not value:
        return None
    from rmqdump.codec.javahash import parse_delay_levels

    try:
        return parse_delay_levels(value)
    except (ValueError, KeyError, IndexError):
        raise click.BadParameter(f"cannot parse {value!r}", ctx=ctx, param=param) from None


#: the switches `verify` and `spark verify` share (``delay_levels`` arrives parsed, in ms)
verify_options = compose(
    click.option("--keep-going", is_flag=True,
                 help="Resynchronise past damage (as scan --keep-going) and report the intact records beyond it."),
    click.option("--broker-version", type=click.Choice(("auto", "4.9", "5.3")), default="auto", show_default=True,  # recovery.VERSIONS
                 help="Recovery model: 4.9.x, 5.3 (5.3.2-5.3.3 rules where they differ), or auto: 4.9 unless the "
                      "store holds V2-magic records, which only 5.x writes."),
    click.option("--commitlog-only", is_flag=True,
                 help="Skip consume-queue, index, checkpoint, config and lock checks."),
    click.option("--delay-levels", default=None, metavar="SPEC", callback=_delay_levels,
                 help='Broker messageDelayLevel, e.g. "1s 5s 10s" (for SCHEDULE_TOPIC_XXXX tagsCode checks).'),
    click.option("--list-limit", type=click.IntRange(0), default=10000, show_default=True,
                 help="List at most N offsets per category in the report (counts stay complete)."),
    click.option("--max-findings", "max_findings", type=click.IntRange(1), default=1000, show_default=True,
                 help="List at most N findings per kind (and per segment)."),
)
