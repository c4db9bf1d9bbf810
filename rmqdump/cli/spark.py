"""`rmqdump spark export|verify|stats|lookup`: jobs over many stores on Spark (pyspark loaded lazily)."""

from __future__ import annotations

import json
import sys
import time
from contextlib import contextmanager

import click

from rmqdump.cli.export import EXPORT_CRC_MODES, read_options, report_segments
from rmqdump.cli.options import (
    access_options,
    body_decoder_options,
    compose,
    crc_option,
    include_body_options,
    limit_option,
    make_filter,
    output_options,
    parse_window,
    record_filter_options,
    report_output_options,
    resolve_body_decoder,
    time_window_options,
    verify_options,
)
from rmqdump.codec.layout import record_size_limit


def _expand_stores(ctx, param, value) -> list[str]:
    """STORE arguments: paths, ``file://`` URIs or globs (expanded here, sorted, deduplicated); each must exist."""
    import os

    from rmqdump.errors import RmqdumpError
    from rmqdump.spark.plumbing import expand_paths

    try:
        paths = expand_paths(value)
    except RmqdumpError as e:
        raise click.BadParameter(str(e), ctx, param) from None
    for p in paths:
        if not os.path.exists(p):
            raise click.BadParameter(f"path {p!r} does not exist", ctx, param)
    return paths


stores_argument = click.argument("stores", nargs=-1, required=True, type=click.Path(path_type=str),
                                 metavar="STORE...", callback=_expand_stores)

spark_options = compose(
    click.option("--store-name", "store_name", multiple=True, metavar="NAME=PATH",
                 help="Broker name of the store at PATH (one of the STOREs; repeatable). Default: from the path, "
                      "made unique (host1/root, host2/root)."),
    click.option("--master", default=None, metavar="URL",
                 help="Spark master: local[*] (default), local[N], spark://host:7077, yarn, k8s://... "
                      "Under spark-submit its --master is used."),
    click.option("--conf", "conf", multiple=True, metavar="KEY=VALUE", help="Extra Spark setting (repeatable)."),
)


def _store_names(stores: list[str], items) -> dict[str, str]:
    """--store-name NAME=PATH items as store path -> broker name, checked against STOREs (before any session)."""
    from rmqdump.errors import RmqdumpError
    from rmqdump.spark.plumbing import store_names

    given: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name.strip() or not path:
            raise click.BadParameter(f"expected NAME=PATH, got {item!r}", param_hint="--store-name")
        given[path] = name.strip()
    try:
        store_names(stores, given)  # unknown paths, duplicate names: one line, exit 2
    except RmqdumpError as e:
        raise RmqdumpError(f"--store-name: {e}") from None
    return given


def _parse_conf(items) -> dict[str, str]:
    out = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise click.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--conf")
        out[k.strip()] = v
    return out


def _session(master, conf, quiet: bool):
    from rmqdump.cli.output import diag

    t0 = time.perf_counter()
    import logging

    from rmqdump.spark.session import build_session  # no pyspark: one line naming the extra (cli.EXTRAS)

    logging.getLogger("DataFrameQueryContextLogger").setLevel(logging.CRITICAL)  # errors are reported by rmqdump
    spark = build_session(master, conf=_parse_conf(conf))
    if not quiet:
        diag(f"spark {spark.version} session on {spark.sparkContext.master} ready in {time.perf_counter() - t0:.1f} s")
    return spark


@contextmanager
def _task_progress(description: str, enabled: bool):
    """A rich bar counting Spark tasks (stderr, terminals only); yields the jobs' progress callback."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from rmqdump.cli.output import stderr_console

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("tasks"),
                        TimeElapsedColumn(), console=stderr_console(), transient=True)
    with progress:
        task = progress.add_task(description, total=None)
        yield lambda done, total: progress.update(task, completed=done, total=total)


@click.group()
def spark() -> None:
    """Jobs over many stores on Apache Spark (pyspark >= 4): export, verify, stats, lookup.

    One Spark task per commitlog segment. --master defaults to local[*]; any master URL
    works, and the stores (and the export directory) must be readable at the same paths on
    every executor. Spark's console progress bar and INFO logs are off; rmqdump shows its
    own progress on a terminal.
    """


@spark.command("export")
@stores_argument
@click.option("--out", "out", required=True, type=click.Path(path_type=str),
              help="Output directory (new or empty); executors must be able to write it.")
@click.option("--partition-by", default=None, metavar="COLS",
              help="Hive-style directories by broker,topic,queue_id,date,hour (comma-separated).")
@include_body_options
@click.option("--format", "file_format", type=click.Choice(("parquet", "jsonl")), default="parquet",
              show_default=True, help="Output file format.")
@record_filter_options()
@crc_option(EXPORT_CRC_MODES)
@click.option("--keep-going", is_flag=True, help="Resynchronise past damaged regions inside a segment.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary (rows, files, seconds, rates) on stdout.")
@click.option("--quiet", "-q", is_flag=True, help="No progress and no summary on stderr.")
@spark_options
@access_options
def export_cmd(stores, out, partition_by, body, decompress, file_format, topic, queue_id, tag, key, since, until,
               body_contains, body_regex, crc, keep_going, as_json, quiet, store_name, master, conf, no_mmap,
               max_message_size):
    """Export the records of every STORE to Parquet (or JSONL) files under --out, one task per segment.

    Same columns and directory naming as `rmqdump export`; a _SUCCESS file marks a complete
    export. Exit 1 if a segment stopped at damage.
    """
    from rmqdump.cli.output import diag
    from rmqdump.rows.export import check_output, parse_partition_by
    from rmqdump.spark.plumbing import local_path

    cols = parse_partition_by(partition_by)
    out = local_path(out, "export directory")  # s3a://, hdfs://: refused (one line, exit 2)
    names = _store_names(stores, store_name)
    check_output(out, partitioned=True, stores=stores)  # before paying for a session
    flt = make_filter(topic, queue_id, tag, key, since, until, body_contains, body_regex)
    opts = read_options(body, decompress, flt, crc, keep_going, no_mmap, max_message_size)
    t0 = time.perf_counter()
    session = _session(master, conf, quiet)
    t1 = time.perf_counter()
    from rmqdump.spark import jobs

    with _task_progress("exporting", not quiet) as progress:
        res = jobs.export(session, list(stores), out, partition_by=cols, fmt=file_format, progress=progress,
                          brokers=names, **opts)
    dt = time.perf_counter() - t1
    summary = {"rows": res.rows, "segments": res.segments, "files": len(res.files), "input_bytes": res.input_bytes,
               "output_bytes": res.output_bytes, "seconds": round(dt, 3), "session_seconds": round(t1 - t0, 3),
               "rows_per_s": round(res.rows / dt, 1) if dt else None, "master": session.sparkContext.master,
               "out": out}
    if as_json:
        sys.stdout.write(json.dumps(summary) + "\n")
    if not quiet:
        diag(f"exported {res.rows} records from {res.segments} segment(s) of {len(stores)} store(s) to {out} "
             f"({len(res.files)} file(s), {res.output_bytes:,} bytes) in {dt:.2f} s")
    rc = report_segments(res.reports, quiet)
    if rc:
        raise SystemExit(rc)
    return 0


STATS_COLUMNS = ("records", "bytes", "body_bytes", "first_offset", "end_offset", "first_store_timestamp",
                 "last_store_timestamp")


@spark.command("stats")
@stores_argument
@click.option("--by", default="broker,topic,queue_id,hour", show_default=True, metavar="COLS",
              help="Group by these of broker,store,topic,queue_id,date,hour (UTC).")
@click.option("--topic", "-t", multiple=True, help="Only records of this topic (repeatable).")
@output_options
@spark_options
@access_options
def stats_cmd(stores, by, topic, fmt, quiet, store_name, master, conf, no_mmap, max_message_size):
    """Record counts and bytes of every STORE per broker/topic/queue/hour (or --by).

    Each segment is walked past damage, as `rmqdump stats` does; damage is reported on
    stderr and makes the exit status 1.
    """
    from rmqdump.cli.output import RecordWriter, default_format, diag

    keys = tuple(k.strip() for k in by.split(",") if k.strip())
    fmt = default_format(fmt)
    names = _store_names(stores, store_name)
    session = _session(master, conf, quiet)
    from rmqdump.spark import jobs

    options = {"topic": ",".join(topic) if topic else None, "useMmap": not no_mmap,
               "maxRecordSize": record_size_limit(max_message_size), "brokers": names}
    damage: list[dict] = []
    with _task_progress("counting", not quiet) as progress:
        rows = jobs.stats(session, list(stores), by=keys, progress=progress, damage=damage, **options)
    writer = RecordWriter(fmt, (*keys, *STATS_COLUMNS))
    try:
        for r in rows:
            writer.write(r)
    finally:
        writer.close()
    if damage:
        if not quiet:
            for d in damage:
                diag(f"rmqdump: {d['broker']}: {d['segment']} at offset {d['offset']}: {d['detail']}", "red")
            diag(f"rmqdump: {len(damage)} damaged range(s) while walking (damage skipped)", "red")
        raise SystemExit(1)
    return 0


LOOKUP_EXTRA = ("broker", "store", "crc_ok")


@spark.command("lookup")
@stores_argument
@click.option("--key", "-k", required=True, help="A KEYS element or UNIQ_KEY.")
@click.option("--topic", "-t", default=None, help="Topic of the key (without it every topic each store names).")
@time_window_options
@limit_option("At most N hits per store.")
@click.option("--scan", "force_scan", is_flag=True, help="Walk every commitlog instead of using the indexes.")
@output_options
@body_decoder_options
@spark_options
@access_options
def lookup_cmd(stores, key, topic, since, until, limit, force_scan, fmt, quiet, body_mode, decompress, store_name,
               master, conf, no_mmap, max_message_size):
    """Find messages by key across every STORE at once (one task per store), like `rmqdump lookup --key`.

    Prints the scan JSONL schema plus broker, store and crc_ok; each store's hits newest
    first. Exit 0 found, 1 nothing found.
    """
    from rmqdump.cli.output import RecordWriter, default_format, diag, iso_ms
    from rmqdump.rows.schema import FIELDS

    fmt = default_format(fmt)
    decoder = resolve_body_decoder(body_mode, fmt)
    lo, hi = parse_window(since, until)
    names = _store_names(stores, store_name)
    session = _session(master, conf, quiet)
    from rmqdump.spark import jobs

    with _task_progress("looking up", not quiet) as progress:
        rep = jobs.lookup(session, list(stores), key, topic=topic, begin=lo, end=hi, max_num=limit,
                          force_scan=force_scan, include_body=decoder.needs_body, decompress=decompress,
                          use_mmap=not no_mmap, progress=progress, brokers=names)
    table = [("broker", "BROKER", 14), ("offset", "OFFSET", 12), ("topic", "TOPIC", 24), ("queue_id", "Q", 3),
             ("queue_offset", "QOFF", 6), ("store_time", "STORE TIME (UTC)", 29), ("keys", "KEYS", 24),
             ("body", "BODY", 30)]
    writer = RecordWriter(fmt, (*FIELDS, *LOOKUP_EXTRA), table)
    try:
        for row in rep.rows:
            out = {k: row[k] for k in (*FIELDS, *LOOKUP_EXTRA)}
            out["properties"] = dict(row["properties"] or [])
            body = row["body"]
            out["body"] = decoder.text(body) if fmt in ("table", "csv") else decoder.decode(body)
            if fmt == "table":
                out["store_time"] = iso_ms(row["store_timestamp"])
            writer.write(out)
    finally:
        writer.close()
    if not quiet:
        for s in rep.stores:
            diag(f"{s['broker']}: {s['hits']} hit(s) via {s['source']}"
                 + (f", {s['collisions']} hash collision(s)" if s["collisions"] else "")
                 + (" (more exist: --limit)" if s["truncated"] else ""))
            for line in s["reasons"] + s["warnings"]:
                diag(f"{s['broker']}: {line}", "yellow")
    if not rep.rows:
        raise SystemExit(1)
    return 0


@spark.command("verify")
@stores_argument
@verify_options
@report_output_options
@spark_options
@access_options
def verify_cmd(stores, keep_going, broker_version, commitlog_only, delay_levels, list_limit, max_findings, fmt, quiet,
               store_name, master, conf, no_mmap, max_message_size):
    """`rmqdump verify` of every STORE on Spark: the same report and findings, per store.

    Record checks run one task per segment, ConsumeQueue <-> commitlog is a DataFrame join,
    the store checks (recovery prediction, index, checkpoint, config) one task per store.
    Each document starts with the store's broker name (`broker`, see --store-name);
    json prints one document for one store and a list for several; jsonl one line per store.
    Exit 0 clean, 1 errors found in any store.
    """
    from rmqdump.cli.output import default_format, diag, emit_document, stdout_console
    from rmqdump.cli.verify import render_report

    fmt = default_format(fmt, report=True)
    if fmt == "csv":
        raise click.BadParameter("verify prints documents: use table, json or jsonl", param_hint="--format")
    names = _store_names(stores, store_name)
    session = _session(master, conf, quiet)
    from rmqdump.spark import jobs

    with _task_progress("verifying", not quiet) as progress:
        verdicts = jobs.verify(session, list(stores), keep_going=keep_going, use_mmap=not no_mmap,
                               max_record_size=record_size_limit(max_message_size),
                               version=broker_version, store_checks=not commitlog_only, delay_levels_ms=delay_levels,
                               list_limit=list_limit, max_findings_per_kind=max_findings, progress=progress,
                               brokers=names)
    docs = [{"broker": v.broker, **v.document} for v in verdicts]
    if fmt == "json" and len(docs) > 1:
        sys.stdout.write(json.dumps(docs, ensure_ascii=False, indent=2) + "\n")
    else:
        for doc in docs:
            if fmt == "table" and (len(docs) > 1 or names):
                stdout_console().rule(f"{doc['broker']}: {doc['store']}")
            emit_document(doc, fmt, render_report)
    if not quiet and fmt != "table":
        for doc in docs:
            s = doc["summary"]
            diag(f"{doc['broker']} ({doc['store']}): {s['status']}: {s['errors']} errors, {s['warnings']} warnings, {s['infos']} info; "
                 f"predicted commitlog end {s['predicted_max_offset']}", "red" if s["errors"] else None)
    code = max((v.exit_code for v in verdicts), default=0)
    if code:
        raise SystemExit(code)
    return 0
