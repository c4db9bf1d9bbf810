"""`rmqdump append`: write messages into a stopped broker's store (under the broker's lock)."""

from __future__ import annotations

import sys

import click

from rmqdump.cli.options import output_options
from rmqdump.cli.output import RecordWriter, default_format, diag
from rmqdump.codec.layout import TRANSACTION_BY_NAME
from rmqdump.errors import FormatError

ACK_FIELDS = ("offset", "msg_id", "topic", "queue_id", "queue_offset", "uniq_key", "size", "store_timestamp",
              "blank_at")
TABLE_COLUMNS = [("offset", "OFFSET", 12), ("msg_id", "MSGID (offsetMsgId)", 34), ("topic", "TOPIC", 24),
                 ("queue_id", "Q", 3), ("queue_offset", "QOFF", 6), ("uniq_key", "UNIQ_KEY", 34),
                 ("size", "SIZE", 7)]


def _ack_row(a) -> dict:
    return {"offset": a.offset, "msg_id": a.msg_id, "topic": a.topic, "queue_id": a.queue_id,
            "queue_offset": a.queue_offset, "uniq_key": a.uniq_key, "size": a.size,
            "store_timestamp": a.store_timestamp, "blank_at": a.blank_at}


def _parse_property(text: str) -> tuple[str, str]:
    k, sep, v = text.partition("=")
    if not sep or not k.strip() or not v.strip():
        # the client refuses blank names and values (Message.putUserProperty); the broker would drop them
        raise click.BadParameter(f"{text!r} is not KEY=VALUE with a non-blank key and value",
                                 param_hint="--property")
    if "\x01" in text or "\x02" in text:
        raise click.BadParameter("property names and values cannot hold \\x01 or \\x02", param_hint="--property")
    return k, v


def _checked_jsonl(app, jsonl, topic: str | None):
    """The --jsonl input, checked against what the store's broker can read before anything is written.

    For a 4.x broker every record's topic is looked at first (a V2-magic record refuses the whole
    input); a stream that cannot seek is spooled to a temporary file for that pass. The check stops
    at the first line that does not parse: the main pass refuses that line and writes nothing after it.
    """
    import json
    import tempfile

    if app.broker.reads_v2:
        return jsonl
    if topic is not None:  # --topic overrides every record's
        app.check_topic(topic)
        return jsonl
    try:
        start = jsonl.tell() if jsonl.seekable() else None
    except OSError:
        start = None
    if start is None:
        import shutil

        spool = tempfile.SpooledTemporaryFile(max_size=16 << 20)
        shutil.copyfileobj(jsonl, spool, 1 << 20)
        src, start = spool, 0
    else:
        src = jsonl
    src.seek(start)
    for n, line in enumerate(src, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            break
        if isinstance(row, dict) and isinstance(row.get("topic"), str):
            app.check_topic(row["topic"], f"JSONL line {n}: ")
    src.seek(start)
    return src


@click.command()
@click.argument("store", type=click.Path(path_type=str), metavar="STORE")
@click.option("--topic", "-t", help="Topic of the message (overrides the records' topic with --jsonl).")
@click.option("--queue", "queue_id", type=click.IntRange(0, 2**31 - 1), default=None,
              help="Queue id (default 0; overrides the records' queue with --jsonl).")
@click.option("--tags", help="TAGS property.")
@click.option("--keys", multiple=True, help="KEYS (space separated; repeatable).")
@click.option("--property", "properties", multiple=True, metavar="K=V", help="User property (repeatable).")
@click.option("--body", "body_text", help="Message body (UTF-8 text).")
@click.option("--body-file", type=click.File("rb"), help="Read the body from this file.")
@click.option("--jsonl", type=click.File("rb"), help="Bulk: records in the scan JSONL schema ('-' = stdin).")
@click.option("--body-encoding", type=click.Choice(("base64", "text", "hex")), default="base64", show_default=True,
              help="How bodies are spelled in --jsonl records (scan --body ...).")
@click.option("--keep-store-time", is_flag=True, help="--jsonl: keep the records' store timestamps.")
@click.option("--keep-store-host", is_flag=True, help="--jsonl: keep the records' store hosts.")
@click.option("--flag", "user_flag", type=int, default=0, show_default=True, help="User FLAG field.")
@click.option("--transaction", type=click.Choice(tuple(TRANSACTION_BY_NAME)), default="none", show_default=True,
              help="Transaction type bits (prepared/rollback records get no ConsumeQueue entry).")
@click.option("--compression", type=click.Choice(("none", "zlib", "lz4", "zstd")), default="none", show_default=True,
              help="Compress the body like a producer does.")
@click.option("--born-host", default=None, help="Born host ip:port (default 127.0.0.1:34732).")
@click.option("--store-host", default=None, help="Store host ip:port (default: the store's, from its last record).")
@click.option("--uniq-key", default=None, help="UNIQ_KEY to use (default: generated in the client's format).")
@click.option("--no-uniq-key", is_flag=True, help="Do not generate a UNIQ_KEY.")
@click.option("--record-crc", is_flag=True, help="Add the 5.2+ __CRC32# whole-record CRC property.")
@click.option("--batch-bytes", type=click.IntRange(1), default=4 << 20, show_default=True,
              help="--jsonl: commit (fsync) after this many bytes; acknowledgements follow each commit.")
@click.option("--max-message-size", type=click.IntRange(1, 1 << 30), default=4 * 1024 * 1024, show_default=True,
              help="Broker maxMessageSize (body limit).")
@click.option("--force", is_flag=True, help="Append even if the store has abort or a dirty tail.")
@click.option("--broker-version", type=click.Choice(("auto", "4.9", "5", "5.3")), default="auto", show_default=True,
              help="Broker that must read the store: V2-magic records (topics over 127 chars) are refused unless it "
                   "is 5.x. auto: 5.x only when the store already holds a V2 record or a file only 5.x creates "
                   "(batchconsumequeue/, timerwheel, compaction/ ...).")
@click.option("--dry-run", is_flag=True, help="Show where the records would go; write nothing.")
@click.option("--init", "create", is_flag=True, help="Create STORE if it has no commitlog yet.")
@click.option("--commitlog-file-size", type=click.IntRange(64), default=None,
              help="--init: segment size (default: the store's, else 1 GiB).")
@click.option("--cq-file-size", type=click.IntRange(20), default=None,
              help="ConsumeQueue file size (multiple of 20): for --init (default 6,000,000), or a store none of "
                   "whose ConsumeQueue files tells it.")
@click.option("--index-slots", type=click.IntRange(1), default=None, help="IndexFile hash slots (maxHashSlotNum).")
@click.option("--index-entries", type=click.IntRange(2), default=None, help="IndexFile entries (maxIndexNum).")
@output_options
def append(store, topic, queue_id, tags, keys, properties, body_text, body_file, jsonl, body_encoding,
           keep_store_time, keep_store_host, user_flag, transaction, compression, born_host, store_host, uniq_key,
           no_uniq_key, record_crc, batch_bytes, max_message_size, force, broker_version, dry_run, create,
           commitlog_file_size, cq_file_size, index_slots, index_entries, fmt, quiet):
    """Append messages to STORE (the broker must be stopped).

    One message from --topic and --body / --body-file / stdin, or many from --jsonl (the
    scan JSONL schema, so `rmqdump scan A -f jsonl | rmqdump append B --jsonl -` copies
    messages). Takes the broker's lock; refuses a store with abort or a dirty tail unless
    --force. Prints each record's offset and msgId once it is durable. A record the store's
    broker cannot read (a V2-magic record for a 4.x broker, see --broker-version) is refused
    before anything is written (exit 2).
    """
    from rmqdump.write.appender import LockedAppender, read_jsonl, require_cq_file_size, store_geometry
    from rmqdump.write.writer import MessageSpec

    fmt = default_format(fmt)
    if jsonl is not None:
        if body_text is not None or body_file is not None:
            raise click.UsageError("--jsonl cannot be combined with --body/--body-file")
        specs = None  # read once the store's broker version is known (a 4.x store: after a check pass)
    else:
        if not topic:
            raise click.UsageError("--topic is required (or use --jsonl)")
        if body_text is not None and body_file is not None:
            raise click.UsageError("give either --body or --body-file")
        if body_text is not None:
            body = body_text.encode("utf-8")
        elif body_file is not None:
            body = body_file.read()
        else:
            if sys.stdin.isatty():
                raise click.UsageError("no body: give --body, --body-file or pipe it on stdin")
            body = sys.stdin.buffer.read()
        spec = MessageSpec(topic=topic, body=body, queue_id=queue_id or 0, tags=tags or None,
                           keys=" ".join(keys) or None, properties=dict(_parse_property(p) for p in properties),
                           flag=user_flag, transaction=TRANSACTION_BY_NAME[transaction],
                           compression=None if compression == "none" else compression, uniq_key=uniq_key,
                           auto_uniq_key=not no_uniq_key, record_crc=record_crc)
        if born_host:
            spec.born_host = born_host
        specs_list = [spec]
        specs = iter(specs_list)
    geometry = None
    if any(v is not None for v in (commitlog_file_size, cq_file_size, index_slots, index_entries)):
        if cq_file_size is not None and cq_file_size % 20:
            raise click.BadParameter("must be a multiple of 20", param_hint="--cq-file-size")
        if cq_file_size is None and not create:
            require_cq_file_size(store)
        geometry = store_geometry(store, commitlog_file_size=commitlog_file_size, cq_file_size=cq_file_size,
                                  index_slots=index_slots, index_entries=index_entries)
    writer = RecordWriter(fmt, ACK_FIELDS, TABLE_COLUMNS)
    app = LockedAppender(store, force=force, dry_run=dry_run, create=create, geometry=geometry, store_host=store_host,
                         max_message_size=max_message_size, broker_version=broker_version)

    def emit(batch) -> None:
        for a in batch:
            writer.write(_ack_row(a))
        sys.stdout.flush()

    end = None
    try:
        with app:
            st = app.state
            end = st.end
            if jsonl is not None:
                src = _checked_jsonl(app, jsonl, topic)
                specs = read_jsonl(src, body_encoding=body_encoding, keep_store_time=keep_store_time,
                                   keep_store_host=keep_store_host, topic=topic, queue_id=queue_id)
            else:
                app.check_spec(specs_list[0])
            if not quiet:
                verb = "would append" if dry_run else "appending"
                diag(f"{verb} at offset {st.end}" + (" (new store)" if st.new_store else "")
                     + (f"; warnings: {'; '.join(st.warnings)}" if st.warnings else "")
                     + (f"; forced past: {'; '.join(st.dirty)}" if st.dirty else ""))
            try:
                for spec in specs:
                    if jsonl is not None and born_host:
                        spec.born_host = born_host
                    a = app.append(spec)
                    end = a.offset + a.size
                    if dry_run:
                        if a.blank_at is not None and not quiet:
                            diag(f"end-of-file blank at {a.blank_at}; next segment starts at {a.offset}")
                        emit([a])
                    elif app.pending_bytes >= batch_bytes:
                        emit(app.commit())
            except (FormatError, UnicodeDecodeError) as e:
                if not dry_run:
                    emit(app.commit())  # the records before the bad one are valid: keep them
                if isinstance(e, UnicodeDecodeError):
                    raise FormatError(f"input is not UTF-8: {e.reason}") from None
                raise
            if not dry_run:
                emit(app.commit())
    finally:
        writer.close()
    if not quiet:
        diag(f"{'would append' if dry_run else 'appended'} {writer.count} records; store end "
             f"{'would be' if dry_run else 'now'} {end}")
