"""What a lookup answers (:class:`LookupResult`, :class:`Collision`) and the record helpers every lookup
shares: decoding the record at an offset with its body CRC judged, and describing what was found."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from rmqdump.codec.record import Blank, Invalid, Message
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.geometry import StoreGeometry
from rmqdump.store.root import Store


@dataclass
class Collision:
    """A record reached through the key's hash slot whose topic or keys do not match."""

    offset: int
    topic: str
    keys: list[str]
    uniq_key: str | None
    reason: str

    def to_dict(self) -> dict:
        return {"offset": self.offset, "topic": self.topic, "keys": self.keys, "uniq_key": self.uniq_key,
                "reason": self.reason}


@dataclass
class LookupResult:
    """Confirmed records (newest first) and everything the caller should be told about them.

    ``source``: ``index``, ``scan``, ``index+scan``, ``consumequeue``, ``msg-id`` or ``offset``.
    ``reasons``: why (part of) the commitlog was scanned. ``unreadable``: index entries
    pointing at no valid record, as (offset, why). ``warnings``: anything else worth a line
    (host mismatch, CRC failures, index anomalies). ``scanned``: commitlog ranges walked.
    """

    hits: list[Message] = field(default_factory=list)
    collisions: list[Collision] = field(default_factory=list)
    unreadable: list[tuple[int, str]] = field(default_factory=list)
    truncated: bool = False
    source: str = "index"
    reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    scanned: list[tuple[int, int]] = field(default_factory=list)
    topics_searched: int = 0
    geometry: StoreGeometry | None = None


def _open_store(store: Store | str | os.PathLike) -> Store:
    return store if isinstance(store, Store) else Store.open(store)



def read_message(cl: CommitLog, offset: int, *, use_mmap: bool = True, max_record_size: int | None = None
                 ) -> Message | Blank | Invalid:
    """Decode the record at ``offset`` with its body; ``crc_ok`` tells whether the body CRC holds.

    A body CRC mismatch does not hide the record (the broker's recovery would stop there,
    but the bytes are what the user is looking for).
    """
    kw = {"max_record_size": max_record_size} if max_record_size else {}
    rec = cl.decode_at(offset, use_mmap=use_mmap, check_crc=False, read_body=True, **kw)
    if isinstance(rec, Message) and rec.body_length > 0 and rec.body is not None:
        from rmqdump.codec.crc import body_crc

        rec.crc_ok = body_crc(rec.body) == rec.body_crc
    return rec


def _describe_invalid(rec: Blank | Invalid) -> str:
    if isinstance(rec, Blank):
        return f"end-of-file BLANK record ({rec.size} bytes)"
    return f"{rec.kind}: {rec.detail}"


def _crc_warning(msg: Message) -> str | None:
    if msg.crc_ok is False:
        return (f"record at {msg.offset} fails its body CRC (the broker's recovery stops there); shown as stored")
    return None


def _key_matches(msg: Message, key: str) -> bool:
    if key == msg.uniq_key:
        return True
    return key in msg.keys



def _iso(ms: int) -> str:
    from rmqdump.store.checkpoint import ms_to_iso

    return ms_to_iso(ms)
