"""`rmqdump export`: commitlog records to Parquet or JSONL on one machine (pyarrow, no Spark)."""

from __future__ import annotations

import time

import click

from rmqdump.cli.options import (
    access_options,
    crc_option,
    include_body_options,
    make_filter,
    record_filter_options,
    store_argument,
)
from rmqdump.codec.layout import record_size_limit

COMPRESSIONS = ("zstd", "snappy", "gzip", "lz4", "none")
EXPORT_CRC_MODES = ("check", "flag", "off")


def read_options(body: bool, decompress: bool, flt, crc: str, keep_going: bool, no_mmap: bool,
                 max_message_size: int) -> dict:
    if decompress and not body:
        raise click.UsageError("--decompress needs --body")
    return {"include_body": body, "decompress": decompress, "flt": flt, "crc": crc, "keep_going": keep_going,
            "use_mmap": not no_mmap, "max_record_size": record_size_limit(max_message_size)}


def report_segments(reports, quiet: bool) -> int:
    """Print segments that ended at damage or held bodies that would not decompress; 1 if any did, else 0."""
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
            for off, detail in r.body_error_first:
                diag(f"{r.segment}: offset {off}: {detail}; body exported as stored", "yellow")
            more = r.body_errors - len(r.body_error_first)
            if more > 0:
                diag(f"{r.segment}: ... and {more} more bodies that would not decompress", "yellow")
    bad_bodies = any(r.body_errors for r in reports)
    return 1 if damaged or bad_bodies or any(r.skipped for r in reports) else 0


@click.command()
@store_argument
@click.option("--to", "to", required=True, type=click.Path(path_type=str),
              help="Output file (.parquet or .jsonl), or a new/empty directory with --partition-by.")
@click.option("--format", "fmt", type=click.Choice(("parquet", "jsonl")), default=None,
              help="Output format (default: from the --to suffix; parquet for --partition-by).")
@click.option("--partition-by", default=None, metavar="COLS",
              help="Hive-style directories by broker,topic,queue_id,date,hour (comma-separated), e.g. topic,date.")
@include_body_options
@record_filter_options()
@crc_option(EXPORT_CRC_MODES)
@click.option("--keep-going", is_flag=True, help="Resynchronise past damaged regions inside a segment.")
@click.option("--compression", type=click.Choice(COMPRESSIONS), default="zstd", show_default=True,
              help="Parquet compression codec.")
@click.option("--overwrite", is_flag=True, help="Replace an existing output file.")
@click.option("--quiet", "-q", is_flag=True, help="No progress bar and no summary on stderr.")
@access_options
def export(store, to, fmt, partition_by, body, decompress, topic, queue_id, tag, key, since, until, body_contains,
           body_regex, crc, keep_going, compression, overwrite, quiet, no_mmap, max_message_size):
    """Export the records of STORE to Parquet or JSONL with pyarrow, on this machine.

    Columns: the scan JSONL schema in typed form (body binary, properties a map, keys a
    list) plus lineage (broker, store, segment, crc_ok, store_time). Every segment is read
    to its own end of valid data. Topic names from the store are encoded into safe
    directory names for --partition-by. Exit 1 if a segment stopped at damage.
    For many stores at once use `rmqdump spark export`.
    """
    from rmqdump.cli.output import diag, progress_bar
    from rmqdump.rows.export import export as run_export  # no pyarrow: one line naming the extra (cli.EXTRAS)
    from rmqdump.rows.export import infer_format, parse_partition_by

    cols = parse_partition_by(partition_by)
    if not cols:
        fmt = infer_format(to, fmt)
    flt = make_filter(topic, queue_id, tag, key, since, until, body_contains, body_regex)
    opts = read_options(body, decompress, flt, crc, keep_going, no_mmap, max_message_size)
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
