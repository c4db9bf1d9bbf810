"""Shared click option decorators, so every command has the same switches."""

from __future__ import annotations

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

output_options = compose(
    click.option("--format", "-f", "fmt", type=click.Choice(FORMATS), default=None,
                 help="Output format (default: table on a terminal, jsonl when piped)."),
    click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary lines on stderr."),
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

access_options = compose(
    click.option("--no-mmap", is_flag=True,
                 help="Read with pread instead of mmap (safe on a live store that may be truncated under us)."),
    click.option("--max-message-size", type=click.IntRange(1, 1 << 30), default=4 * 1024 * 1024, show_default=True,
                 help="Broker maxMessageSize; records over this + 64 KiB are treated as damage."),
)


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
