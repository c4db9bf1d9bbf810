"""Record filters shared by scan, export and the Spark source."""

from __future__ import annotations

from dataclasses import dataclass, field

from rmqdump.codec.record import Message


@dataclass
class RecordFilter:
    """Which records to keep; every given criterion must match. Times are store time, epoch ms."""

    topics: tuple[str, ...] = ()
    queue_id: int | None = None
    tags: tuple[str, ...] = ()
    keys: tuple[str, ...] = ()
    since: int | None = None
    until: int | None = None
    _topic_raw: frozenset = field(default=frozenset(), init=False, repr=False)

    def __post_init__(self):
        self._topic_raw = frozenset(t.encode("utf-8") for t in self.topics)

    @property
    def empty(self) -> bool:
        return not (self.topics or self.tags or self.keys) and self.queue_id is None and \
            self.since is None and self.until is None

    def match(self, m: Message) -> bool:
        if self._topic_raw and m.topic_raw not in self._topic_raw:
            return False
        if self.queue_id is not None and m.queue_id != self.queue_id:
            return False
        if self.since is not None and m.store_timestamp < self.since:
            return False
        if self.until is not None and m.store_timestamp > self.until:
            return False
        if self.tags and m.tags not in self.tags:
            return False
        if self.keys:
            have = set(m.keys)
            if m.uniq_key:
                have.add(m.uniq_key)
            if not have.intersection(self.keys):
                return False
        return True
