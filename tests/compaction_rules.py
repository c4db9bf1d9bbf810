"""RocketMQ 5.3.3's compaction judged from outside: what ``CompactionLog.shouldRetainMsg`` keeps, and which queues'
passes RocketMQ's own log shows failing (shared by the bundled-fixture and the oracle compaction tests)."""

from __future__ import annotations

import re

#: a pass RocketMQ 5.3.3 itself logs as failed: ``replaceCqFiles`` renaming one sparse CQ file twice
#: (``NoSuchFileException`` ... ``.delete``) or ``replaceFiles`` failing to move a log file in, a pass racing
#: the dispatch into the same queue
_REPLACE_FAILED = re.compile(r"ERROR .*move file \S*/compaction(?:Cq|Log)/(\S+/\d+)/\d{20} failed")


def kept_offsets(messages: list[dict], last: int) -> list[int]:
    """Queue offsets a pass up to queue offset ``last`` keeps of one queue's ``messages`` (RocketMQ's read-back
    manifest lines, in queue order): every keyed record after ``last``; up to it, per KEYS, the latest with a body."""
    keyed = [m for m in messages if (m["properties"].get("KEYS") or "").strip()]
    latest = {m["properties"]["KEYS"]: m["queueOffset"] for m in keyed if m["queueOffset"] <= last}
    return [m["queueOffset"] for m in keyed
            if m["queueOffset"] > last or (latest[m["properties"]["KEYS"]] == m["queueOffset"] and m["bodyLength"])]


def failed_passes(log_text: str) -> set[str]:
    """Queues ("KV/0") whose compaction pass RocketMQ's log shows failing."""
    return set(_REPLACE_FAILED.findall(log_text))
