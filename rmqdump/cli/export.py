"""`rmqdump export`: commitlog records to Parquet or JSONL on one machine (pyarrow, no Spark)."""

from __future__ import annotations

import time

import click

from rmqdump.cli.options import access_options, parse_time, store_argument
from rmqdump.codec.layout import MAX_MESSAGE_SIZE, MAX_RECORD_SIZE

COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "none")


def record_filter_options(f):
    """--topic/--queue/--tag/--key/--since/--until, as scan has them."""
    for d in reversed([
        click.option("--topic", "-t", multiple=True, help="Only records of this topic (repeatable)."),
        click.option("--queue", "queue_id", type=int, default=None, help="Only records of this queue id."),
        click.option("--tag", multiple=True, help="Only records whose TAGS equals this (repeatable)."),
        click.option("--key", multiple=True, help="Only records with this key in KEYS or as UNIQ_KEY (repeatable)."),
        click.option("--since", help="Store time lower bound (ISO 8601, UTC by default, or epoch ms)."),
        click.option("--until", help="Store time upper bound (ISO 8601 or epoch ms)."),
    ]):
        f = d(f)
    return f


def make_filter(topic, queue_id, tag, key, since, until):
    from rmqdump.rows.filters import RecordFilter

    flt = RecordFilter(tuple(topic), queue_id, tuple(tag), tuple(key), parse_time(since, "--since"),
                       parse_time(until, "--until"))
    return None if flt.empty else flt


def read_options(body: bool, decompress: bool, flt, crc: str, keep_going: bool, no_mmap: bool,
                 max_message_size: int) -> dict:
    if decompress and not body:
        raise click.UsageError("--decompress needs --body")
    return {"include_body": body, "decompress": decompress, "flt": flt, "crc": crc, "keep_going": keep_going,
            "use_mmap": not no_mmap, "max_record_size": max_message_size + (MAX_RECORD_SIZE - MAX_MESSAGE_SIZE)}


def report_segments(reports, quiet: bool) -> int:
    """Print segments that ended at damage; return 1 if any did, else 0."""
    from rmqdump.cli.output import diag

    damaged = [r for r in reports if r.stop_kind not in ("end_of_data", "blank")]
    if not quiet:
        for r in damaged[:20]:
            diag(f"{r.segment}: stopped at damage at offset {r.stop_offset}: {r.stop_kind}: {r.stop_detail}", "yellow")
        if len(damaged) > 20:
            diag(f"... and {len(damaged) - 20} more damaged segments", "yellow")
        for r in reports:
            if r.skipped:
                diag(f"{r.segment}: {r.skipped} damaged range(s) skipped (--keep-going)", "yellow")
    return 1 if damaged or any(r.skipped for r in reports) else 0


@click.command()
@store_argument
@click.option("--to", "to", required=True, type=click.Path(path_type=str),
              help="Output file (.parquet or .jsonl), or a new/empty directory with --partition-by.")
@click.option("--format", "fmt", type=click.Choice(("parquet", "jsonl")), default=None,
              help="Output format (default: from the --to suffix; parquet for --partition-by).")
@click.option("--partition-by", default=None, metavar="COLS",
              help="Hive-style directories by broker,topic,queue_id,date,hour (comma-separated), e.g. topic,date.")
@click.option("--body", is_flag=True, help="Include message bodies (binary in Parquet, base64 in JSONL).")
@click.option("--decompress", is_flag=True, help="Decompress zlib/lz4/zstd bodies (with --body).")
@record_filter_options
@click.option("--crc", type=click.Choice(("check", "flag", "off")), default="check", show_default=True,
              help="check: a body-CRC mismatch ends the segment like scan; flag: keep going and set crc_ok; off.")
@click.option("--keep-going", is_flag=True, help="Resynchronise past damaged regions inside a segment.")
@click.option("--compression", type=click.Choice(COMPRESSIONS), default="zstd", show_default=True,
              help="Parquet compression codec.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary on stderr.")
@access_options
def export(store, to, fmt, partition_by, body, decompress, topic, queue_id, tag, key, since, until, crc, keep_going,
           compression, overwrite, quiet, no_mmap, max_message_size):
    """Export the records of STORE to Parquet or JSONL with pyarrow, on this machine.

    Columns: the scan JSONL schema in typed form (body binary, properties a map, keys a
    list) plus lineage (broker, store, segment, crc_ok, store_time). Every segment is read
    to its own end of valid data. Topic names from the store are encoded into safe
    directory names for --partition-by. Exit 1 if a segment stopped at damage.
    For many stores at once use `rmqdump spark export`.
    """
    try:
        from rmqdump.rows.export import export as run_export
        from rmqdump.rows.export import infer_format, parse_partition_by
    except ImportError as e:
        raise click.ClickException(f"export needs pyarrow ({e}): pip install pyarrow") from None
    from rmqdump.cli.output import diag, progress_bar

    cols = parse_partition_by(partition_by)
    if not cols:
        fmt = infer_format(to, fmt)
    opts = read_options(body, decompress, make_filter(topic, queue_id, tag, key, since, until), crc, keep_going,
                        no_mmap, max_message_size)
    t0 = time.perf_counter()
    from rmqdump.rows.arrow import iter_splits

    total = sum(s.size for s in iter_splits(store))
    with progress_bar(total, "exporting", not quiet) as update:
        res = run_export(store, to, fmt=fmt, partition_by=cols, overwrite=overwrite,
                         compression="none" if compression == "none" else compression,
                         progress=lambda done, _total: update(done), **opts)
    dt = time.perf_counter() - t0
    if not quiet:
        rate = f", {res.rows / dt:,.0f} records/s" if dt > 0 else ""
        diag(f"exported {res.rows} records from {res.segments} segment(s) to {to} "
             f"({len(res.files)} file(s), {res.output_bytes:,} bytes) in {dt:.2f} s{rate}")
    rc = report_segments(res.reports, quiet)
    if rc:
        raise SystemExit(rc)
    return 0
