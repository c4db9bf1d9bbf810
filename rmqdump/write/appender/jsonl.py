"""Records in the scan JSONL schema as :class:`~rmqdump.write.message.MessageSpec` objects
(:func:`record_to_spec`, :func:`read_jsonl`): bodies decoded, compression bits kept or the body compressed
again, a new store's fields left to the writer."""

from __future__ import annotations

import base64
import binascii
import json
import zlib
from collections.abc import Iterable, Iterator

from rmqdump.codec.layout import (
    COMPRESSED_FLAG,
    COMPRESSION_TYPE_BY_NAME,
    COMPRESSION_TYPE_COMPARATOR,
    INNER_BATCH_FLAG,
    MULTI_TAGS_FLAG,
    NEED_UNWRAP_FLAG,
    PROPERTY_CRC32,
    PROPERTY_KEYS,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    TRANSACTION_BY_NAME,
)
from rmqdump.errors import FormatError, RmqdumpError, UnsupportedError
from rmqdump.write.message import MessageSpec, _month_start_ms


def decode_body(value, encoding: str) -> bytes:
    """A JSONL body field in ``base64`` (scan's default), ``text`` or ``hex``."""
    if value is None:
        raise FormatError("record has no body (scan with --body base64 to copy bodies)")
    if not isinstance(value, str):
        raise FormatError(f"body must be a string, not {type(value).__name__}")
    try:
        if encoding == "base64":
            return base64.b64decode(value, validate=True)
        if encoding == "hex":
            return bytes.fromhex(value)
        if encoding == "text":
            return value.encode("utf-8")
    except (binascii.Error, ValueError) as e:
        raise FormatError(f"body is not valid {encoding}: {e}") from None
    raise FormatError(f"unknown body encoding {encoding!r}")


def _looks_compressed(body: bytes, kind: int) -> bool:
    try:
        if kind in (0, 3):
            zlib.decompress(body)
        elif kind == 1:
            import lz4.frame

            lz4.frame.decompress(body)
        elif kind == 2:
            import zstandard

            zstandard.ZstdDecompressor().decompress(body, max_output_size=1 << 30)
        else:
            return False
    except Exception:  # any codec error: not a compressed stream of this kind
        return False
    return True


def _int(row: dict, name: str, default: int = 0) -> int:
    v = row.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise FormatError(f"{name} must be an integer")
    return v


def record_to_spec(row: dict, *, body_encoding: str = "base64", keep_store_time: bool = False,
                   keep_store_host: bool = False, topic: str | None = None, queue_id: int | None = None
                   ) -> MessageSpec:
    """One record in the scan JSONL schema as a :class:`MessageSpec`.

    Kept: topic, queue_id, flag, properties (exactly; KEYS/TAGS/UNIQ_KEY inside them win
    over the top-level keys/tags/uniq_key fields), body (as stored, with its compression
    bits; a body that was decompressed by ``scan --decompress`` is compressed again),
    transaction type, born host/timestamp, reconsume times, prepared-transaction offset.
    New: QUEUEOFFSET, PHYSICALOFFSET, store timestamp (unless ``keep_store_time``), store
    host (the target store's unless ``keep_store_host``), body CRC and a 5.2+ ``__CRC32#``
    property if the record had one. A record with no ``properties`` field gets a generated
    UNIQ_KEY like a client would.
    """
    if not isinstance(row, dict):
        raise FormatError("a JSONL record must be an object")
    t = topic if topic is not None else row.get("topic")
    if not isinstance(t, str) or not t:
        raise FormatError("record has no topic")
    body = decode_body(row.get("body"), body_encoding)
    props_in = row.get("properties")
    props: dict[str, str] = {}
    if props_in is not None:
        if not isinstance(props_in, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                     for k, v in props_in.items()):
            raise FormatError("properties must be an object of strings")
        props = dict(props_in)
    record_crc = props.pop(PROPERTY_CRC32, None) is not None
    keys = row.get("keys")
    if keys and PROPERTY_KEYS not in props:
        if isinstance(keys, list) and all(isinstance(k, str) for k in keys):
            props[PROPERTY_KEYS] = " ".join(keys)
        elif isinstance(keys, str):
            props[PROPERTY_KEYS] = keys
        else:
            raise FormatError("keys must be a string or a list of strings")
    tags = row.get("tags")
    if tags and PROPERTY_TAGS not in props:
        if not isinstance(tags, str):
            raise FormatError("tags must be a string")
        props[PROPERTY_TAGS] = tags
    uniq = row.get("uniq_key")
    if uniq and PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX not in props:
        if not isinstance(uniq, str):
            raise FormatError("uniq_key must be a string")
        props[PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX] = uniq
    tran_name = row.get("transaction") or "none"
    if tran_name not in TRANSACTION_BY_NAME:
        raise FormatError(f"unknown transaction type {tran_name!r}")
    sys_flag = _int(row, "sys_flag", -1)
    compression = row.get("compression") or "none"
    if sys_flag >= 0:
        if sys_flag & (INNER_BATCH_FLAG | NEED_UNWRAP_FLAG):
            raise UnsupportedError("inner-batch records (BatchConsumeQueue topics) cannot be appended")
        comp_flags = sys_flag & (COMPRESSED_FLAG | COMPRESSION_TYPE_COMPARATOR)
        extra = sys_flag & MULTI_TAGS_FLAG
    else:
        if compression not in ("none", *COMPRESSION_TYPE_BY_NAME):
            raise FormatError(f"unknown compression {compression!r}")
        comp_flags = 0 if compression == "none" else COMPRESSED_FLAG | COMPRESSION_TYPE_BY_NAME[compression]
        extra = 0
    spec = MessageSpec(
        topic=t, body=body, queue_id=queue_id if queue_id is not None else _int(row, "queue_id"),
        properties=props, flag=_int(row, "flag"), transaction=TRANSACTION_BY_NAME[tran_name],
        born_timestamp=row.get("born_timestamp") if isinstance(row.get("born_timestamp"), int) else None,
        reconsume_times=_int(row, "reconsume_times"),
        prepared_transaction_offset=_int(row, "prepared_transaction_offset"),
        auto_uniq_key=props_in is None, record_crc=record_crc, extra_sys_flag=extra,
        source_offset=row.get("offset") if isinstance(row.get("offset"), int) else None,
    )
    if isinstance(row.get("born_host"), str):
        spec.born_host = row["born_host"]
    if keep_store_time and isinstance(row.get("store_timestamp"), int):
        spec.store_timestamp = row["store_timestamp"]
    if keep_store_host and isinstance(row.get("store_host"), str):
        spec.store_host = row["store_host"]
    if comp_flags:
        kind = (comp_flags & COMPRESSION_TYPE_COMPARATOR) >> 8
        if _looks_compressed(body, kind):
            spec.compressed_flags = comp_flags
        else:  # the body was printed decompressed: compress it again with the record's codec
            spec.compression = {0: "legacy-zlib", 1: "lz4", 2: "zstd", 3: "zlib"}.get(kind)
            if spec.compression is None:
                raise FormatError(f"unknown compression type {kind}")
    born = spec.born_timestamp if spec.born_timestamp is not None else spec.store_timestamp
    if spec.auto_uniq_key and born is not None:
        _month_start_ms(born // 86_400_000)  # the client id the writer makes needs its month (FormatError)
    return spec


def read_jsonl(lines: Iterable[str | bytes], **kwargs) -> Iterator[MessageSpec]:
    """MessageSpecs from JSONL lines (blank lines skipped); errors name the line number."""
    for n, line in enumerate(lines, 1):
        if isinstance(line, bytes):
            line = line.decode("utf-8")
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            yield record_to_spec(row, **kwargs)
        except json.JSONDecodeError as e:
            raise FormatError(f"JSONL line {n}: {e.msg}") from None
        except RmqdumpError as e:
            raise type(e)(f"JSONL line {n}: {e.message}", e.file, e.offset) from None
