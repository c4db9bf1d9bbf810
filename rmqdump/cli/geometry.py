"""Shared switches for store geometry (index slots/entries, broker.conf) and their resolution."""

from __future__ import annotations

import click

from rmqdump.cli.options import compose

broker_config_option = click.option(
    "--broker-config", type=click.Path(exists=True, dir_okay=False, path_type=str), default=None, metavar="FILE",
    help="broker.conf: mappedFileSize*, maxHashSlotNum, maxIndexNum, messageDelayLevel, maxMessageSize.")

geometry_options = compose(
    click.option("--index-slots", type=click.IntRange(1), default=None, metavar="N",
                 help="IndexFile maxHashSlotNum (default: from the file size, with maxIndexNum = 4 x slots)."),
    click.option("--index-entries", type=click.IntRange(2), default=None, metavar="N",
                 help="IndexFile maxIndexNum (default: from the file size)."),
    broker_config_option,
)


def explicit_max_message_size(max_message_size: int) -> int | None:
    """The --max-message-size value if the user gave it (so a broker.conf value may apply otherwise)."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    return None if ctx.get_parameter_source("max_message_size") == ParameterSource.DEFAULT else max_message_size


def resolve(store, index_slots: int | None, index_entries: int | None, broker_config: str | None,
            max_message_size: int | None, parts: tuple[str, ...]):
    """StoreGeometry for ``store`` from the switches (library: :func:`rmqdump.store.geometry.resolve_geometry`)."""
    from rmqdump.store.geometry import parse_broker_conf, resolve_geometry

    conf = parse_broker_conf(broker_config) if broker_config else None
    return resolve_geometry(store.root, commitlog_file_size=store.commitlog.file_size, index_slots=index_slots,
                            index_entries=index_entries, broker_conf=conf,
                            max_message_size=None if max_message_size is None
                            else explicit_max_message_size(max_message_size), parts=parts)
