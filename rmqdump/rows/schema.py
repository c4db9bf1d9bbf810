"""The stable JSONL record schema shared by scan, lookup, export and append."""

from __future__ import annotations

import base64

from rmqdump.codec.javahash import DEFAULT_DELAY_LEVELS_MS
from rmqdump.codec.record import Message
from rmqdump.errors import FormatError

FIELDS = (
    "offset", "file", "file_pos", "size", "magic", "body_crc", "queue_id", "flag", "queue_offset",
    "physical_offset", "sys_flag", "transaction", "compression", "born_timestamp", "born_host",
    "store_timestamp", "store_host", "reconsume_times", "prepared_transaction_offset", "topic",
    "properties", "keys", "tags", "uniq_key", "msg_id", "tags_code", "body_length", "body",
)
BODY_MODES = ("none", "text", "hex", "base64")


class BodyErrors:
    """Bodies that would not decompress: counted, the first few kept as ``(offset, detail)``."""

    LIMIT = 5

    def __init__(self) -> None:
        self.count = 0
        self.first: list[tuple[int, str]] = []

    def add(self, offset: int, detail: str) -> None:
        self.count += 1
        if len(self.first) < self.LIMIT:
            self.first.append((offset, detail))


def output_body(msg: Message, decompress: bool, errors: BodyErrors | None = None) -> bytes | None:
    """The body to print or export: decompressed when asked and compressed. A body that does not
    decompress (damaged, or a bomb) is returned as stored and noted in ``errors``: one bad record is a
    finding on its row, never the end of the job. A codec that is not installed still raises."""
    body = msg.body
    if not decompress or body is None or msg.compression == "none":
        return body
    try:
        return msg.decompressed_body()
    except FormatError as e:
        if errors is not None:
            errors.add(msg.offset, e.message)
        return body


def render_body(body: bytes | None, mode: str) -> str | None:
    """Body as text for output: none -> null, text (UTF-8, invalid bytes replaced), hex, base64."""
    if body is None or mode == "none":
        return None
    if mode == "base64":
        return base64.b64encode(body).decode("ascii")
    if mode == "hex":
        return body.hex()
    if mode == "text":
        return body.decode("utf-8", "replace")
    raise ValueError(f"unknown body mode {mode!r}")


def message_to_dict(msg: Message, body_mode: str = "base64", decompress: bool = False,
                    delay_levels_ms: list[int] = DEFAULT_DELAY_LEVELS_MS) -> dict:
    """One record in the JSONL schema (``FIELDS`` order)."""
    try:
        tags_code = msg.tags_code(delay_levels_ms)
    except Exception:  # a malformed DELAY: the broker would not dispatch it either
        tags_code = None
    body = output_body(msg, decompress)
    return {
        "offset": msg.offset,
        "file": msg.file,
        "file_pos": msg.file_pos,
        "size": msg.size,
        "magic": msg.magic_name,
        "body_crc": msg.body_crc,
        "queue_id": msg.queue_id,
        "flag": msg.flag,
        "queue_offset": msg.queue_offset,
        "physical_offset": msg.physical_offset,
        "sys_flag": msg.sys_flag,
        "transaction": msg.transaction,
        "compression": msg.compression,
        "born_timestamp": msg.born_timestamp,
        "born_host": msg.born_host,
        "store_timestamp": msg.store_timestamp,
        "store_host": msg.store_host,
        "reconsume_times": msg.reconsume_times,
        "prepared_transaction_offset": msg.prepared_transaction_offset,
        "topic": msg.topic,
        "properties": msg.properties,
        "keys": msg.keys,
        "tags": msg.tags,
        "uniq_key": msg.uniq_key,
        "msg_id": msg.msg_id,
        "tags_code": tags_code,
        "body_length": msg.body_length,
        "body": render_body(body, body_mode),
    }
