"""Many records under one lock (:func:`bulk_append`): placed in batches of ``batch_bytes``, each committed
(fsync) before its records are acknowledged."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from rmqdump.codec.msgid import create_offset_msg_id
from rmqdump.write.appender.jsonl import record_to_spec
from rmqdump.write.appender.locked import LockedAppender
from rmqdump.write.message import Appended, MessageSpec

DEFAULT_BATCH_BYTES = 4 << 20


@dataclass
class BulkResult:
    """What :func:`bulk_append` did."""

    records: int = 0
    bytes: int = 0
    first_offset: int | None = None
    end_offset: int = 0
    commits: int = 0
    seconds: float = 0.0

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds > 0 else 0.0


def bulk_append(store: str | os.PathLike, records: Iterable[MessageSpec | dict], batch_bytes: int = DEFAULT_BATCH_BYTES,
                *, on_ack: Callable[[Appended], None] | None = None, body_encoding: str = "base64",
                keep_store_time: bool = False, **appender_kwargs) -> BulkResult:
    """Append many records under one lock, committing (fsync) every ``batch_bytes`` bytes.

    ``records`` are :class:`MessageSpec` objects or dicts in the scan JSONL schema.
    ``on_ack`` is called for each record once it is durable. Keyword arguments go to
    :class:`LockedAppender` (``force``, ``geometry``, ``clock``, ``broker_version`` ...); a missing store is
    created (``create=True`` by default here, with ``geometry`` or the broker defaults). When the store's
    broker is 4.x, every record is checked before anything is written (an iterator is read fully first):
    one it cannot read (V2 magic) refuses the whole call.
    """
    appender_kwargs.setdefault("create", True)
    res = BulkResult()
    t0 = time.perf_counter()
    rows: list[tuple] = []  # placed, not yet reported (in commitlog order)
    app = LockedAppender(store, **appender_kwargs)
    callback_failed = False

    def report() -> None:
        """Report the records the appender has acknowledged (made durable) since the last call."""
        nonlocal callback_failed
        n = app.acknowledged - res.records
        if n <= 0:
            return
        acked = rows[:n]
        del rows[:n]
        if res.first_offset is None:
            res.first_offset = acked[0][0]
        res.end_offset = acked[-1][0] + acked[-1][1]
        res.records += n
        res.bytes += sum(row[1] for row in acked)
        if on_ack is not None:
            callback_failed = True
            for phys, size, qoff, uniq, store_ts, blank_at, host, topic, queue_id in acked:
                on_ack(Appended(phys, size, qoff, create_offset_msg_id(host[0], host[1], phys), uniq, topic,
                                queue_id, store_ts, blank_at))
            callback_failed = False

    try:
        with app:
            if not app.broker.reads_v2:  # refuse what the store's 4.x broker cannot read before writing anything
                if not isinstance(records, (list, tuple)):
                    records = list(records)
                app.check_rows(records)
            it = iter(records)

            def convert(row: object) -> MessageSpec:
                return record_to_spec(row, body_encoding=body_encoding, keep_store_time=keep_store_time)

            while app.place_batch(it, batch_bytes, rows, convert):
                app.commit()
                res.commits += 1
                report()
            app.close()
            res.commits += 1
    finally:
        if not callback_failed:
            report()  # also after an error: what the appender made durable is acknowledged
    res.seconds = time.perf_counter() - t0
    return res
