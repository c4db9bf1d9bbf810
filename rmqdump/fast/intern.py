"""A walk's bounded topic table: with one, the compiled walk fills the derived columns
(``abi.DERIVED_COLUMNS``) while each record's bytes are in the cache, so that the verify checks and the
ConsumeQueue join that follow need not read the topic and property bytes again.

``walk_topic`` ids are ids in one :class:`TopicIntern`: equal ids mean byte-equal topics. A consumer maps
them to its own topic ids (:meth:`TopicIntern.new_map`), resolving an id it has not met through the bytes once.
The table is bounded (:data:`CAPACITY` topics, :data:`ARENA` bytes); past that, new topics get -1 and their
records take the consumers' byte path, so a store of a million topics costs speed, never memory.
"""

from __future__ import annotations

from typing import Any

from rmqdump.fast import abi
from rmqdump.fast.engine import _numpy

CAPACITY = 4096
ARENA = 256 * 1024


class TopicIntern:
    """The table's arrays (filled by the walk kernel); one per segment walked (or per walk thread)."""

    def __init__(self, capacity: int | None = None, arena: int | None = None):
        np = _numpy()
        capacity = CAPACITY if capacity is None else capacity
        arena = ARENA if arena is None else arena
        slots = 2
        while slots < 2 * capacity:
            slots *= 2
        self.capacity = capacity
        self.keys = np.zeros(slots, np.uint64)
        self.ids = np.full(slots, -1, np.int32)
        self.arena = np.zeros(max(arena, 1), np.uint8)
        self.off = np.zeros(capacity, np.int64)
        self.len = np.zeros(capacity, np.int64)
        self.state = np.zeros(2, np.int64)  # topics, arena bytes used

    def fill(self, block: Any) -> None:
        """Point a walk argument block at the table."""
        block[abi.A_DERIVE] = 1
        block[abi.A_IT_KEYS], block[abi.A_IT_IDS] = self.keys.ctypes.data, self.ids.ctypes.data
        block[abi.A_IT_MASK] = self.ids.size - 1
        block[abi.A_IT_ARENA], block[abi.A_IT_ARENA_SIZE] = self.arena.ctypes.data, self.arena.size
        block[abi.A_IT_OFF], block[abi.A_IT_LEN] = self.off.ctypes.data, self.len.ctypes.data
        block[abi.A_IT_CAP], block[abi.A_IT_STATE] = self.capacity, self.state.ctypes.data

    def new_map(self) -> Any:
        """A consumer's map from this table's ids to its own (-1: not met yet)."""
        return _numpy().full(self.capacity, -1, _numpy().int32)

    @property
    def topics(self) -> list[bytes]:
        """The interned topics, by id."""
        return [self.arena[o:o + n].tobytes() for o, n in zip(self.off[:self.state[0]].tolist(),
                                                               self.len[:self.state[0]].tolist(), strict=True)]

