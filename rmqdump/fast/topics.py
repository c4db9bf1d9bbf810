"""A batch's topics, grouped exactly: per row an index into the distinct topics, read in place from the segment
bytes as 8-byte words (a hash, then every group checked byte for byte), or through the walk's topic table."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rmqdump.fast.engine import _numpy
from rmqdump.fast.intern import TopicIntern

if TYPE_CHECKING:
    import numpy as np

    from rmqdump.fast.batch import RecordBatch

_MAX_WORDS = 32  # topics up to 256 bytes are hashed as words; longer ones go through a dict
_ALL = (1 << 64) - 1
_PRIME = 0x100000001B3
_SEED = 0xCBF29CE484222325


def _topic_groups(b: RecordBatch, rows: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
    """Per row an index into the distinct topic byte strings of ``rows`` (and those strings)."""
    np = _numpy()
    one = _single_topic(b, rows)
    if one is not None:
        return np.zeros(rows.size, np.int64), [one]
    return byte_groups(b.buf, b["topic_start"][rows], b["topic_length"][rows])


def byte_groups(buf: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
    """Per row an index into the distinct byte strings ``buf[starts[i]:starts[i] + lengths[i]]`` (negative
    lengths read as empty), and those strings: hashed as words read in place, every group then checked word for
    word (a collision, or strings longer than the words compared, take a dict of the bytes)."""
    np = _numpy()
    lens = np.maximum(lengths, 0).astype(np.int64)
    if not lens.size:
        return np.zeros(0, np.int64), []
    nwords = (int(lens.max()) + 7) // 8
    size = int(buf.size)
    if nwords <= _MAX_WORDS and size >= 8 and int(starts.max()) + 8 * nwords <= size:
        # the string as little-endian 8-byte words read in place (unaligned), bytes past its end masked off
        words = np.ndarray(shape=(size - 7,), dtype="<u8", buffer=buf, strides=(1,))
        key = lens.astype(np.uint64) ^ np.uint64(_SEED)
        cols = []
        for k in range(nwords):
            w = words[starts + 8 * k]
            left = np.clip(lens - 8 * k, 0, 8).astype(np.uint64)
            w &= np.where(left >= 8, np.uint64(_ALL), (np.uint64(1) << (left * np.uint64(8))) - np.uint64(1))
            cols.append(w)
            key = (key ^ w) * np.uint64(_PRIME)
        _, first, inv = np.unique(key, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        rep = first[inv]
        if bool((lens == lens[rep]).all()) and all(bool((w == w[rep]).all()) for w in cols):  # exact groups
            return inv, [buf[starts[f]:starts[f] + lens[f]].tobytes() for f in first]
    ids: dict[bytes, int] = {}
    tids = np.empty(lens.size, np.int64)
    for n, (s, ln) in enumerate(zip(starts.tolist(), lens.tolist(), strict=True)):
        tids[n] = ids.setdefault(buf[s:s + ln].tobytes(), len(ids))
    return tids, list(ids)


def _single_topic(b: RecordBatch, rows: np.ndarray) -> bytes | None:
    """The topic bytes of every row of ``rows`` when they are all the same, else None (not known to be).

    Lengths equal, then each row's topic compared in place with the first row's: as the aligned 8-byte words
    holding it (an aligned gather is several times cheaper than an unaligned one), against the first row's
    bytes placed at the row's offset within its word, the bytes outside the topic masked off."""
    np = _numpy()
    lens = b["topic_length"][rows]
    n = int(lens[0])
    if n < 0 or not bool((lens == n).all()):
        return None
    starts = b["topic_start"][rows]
    s0 = int(starts[0])
    topic = b.buf[s0:s0 + n].tobytes()
    if not n:
        return topic
    words = np.ndarray(shape=(b.buf.size // 8,), dtype="<u8", buffer=b.buf)
    q, r = starts >> 3, starts & 7
    r0, rmax = int(r[0]), int(r.max())
    nwords = (rmax + n + 7) // 8  # the words a topic starting at offset rmax of a word touches
    if n > 8 * _MAX_WORDS or int(starts.min()) < 0 or int(q.max()) + nwords > words.size:
        return None
    pattern, mask = _placed(np, topic, rmax, nwords)
    if bool((r == r0).all()):  # one offset within the word: the expected words are scalars
        pattern, mask, r = pattern[r0:r0 + 1], mask[r0:r0 + 1], 0
    for j in range(nwords):
        diff = words[q + j] ^ pattern[r, j]
        diff &= mask[r, j]
        if diff.any():
            return None
    return topic


def _placed(np, topic: bytes, rmax: int, nwords: int) -> tuple[np.ndarray, np.ndarray]:
    """``topic`` at each offset 0..``rmax`` of ``nwords`` little-endian words, and which of their bytes are the
    topic: two (rmax + 1, nwords) uint64 arrays."""
    n = len(topic)
    image = b"".join(bytes(r) + topic + bytes(8 * nwords - r - n) for r in range(rmax + 1))
    ones = b"".join(bytes(r) + b"\xff" * n + bytes(8 * nwords - r - n) for r in range(rmax + 1))
    return (np.frombuffer(image, "<u8").reshape(-1, nwords), np.frombuffer(ones, "<u8").reshape(-1, nwords))


class TopicNames:
    """A batch's topics as a per-row index and the decoded names (``utf-8``, errors replaced, as
    ``Message.topic``): the walk ids of ``intern`` when every row's topic is in its table, else the topic bytes
    grouped exactly."""

    def __init__(self, intern: TopicIntern):
        self.intern = intern
        self.names: list[str] = []  # the table's topics, decoded, by walk id

    def of(self, b: Any, rows: Any) -> tuple[Any, list[str]]:
        np = _numpy()
        wt = b["walk_topic"][rows]
        if wt.size and int(wt.min()) >= 0:
            if int(wt.max()) >= len(self.names):
                self.names = [t.decode("utf-8", "replace") for t in self.intern.topics]
            return wt.astype(np.int64), self.names
        tids, raws = _topic_groups(b, rows)
        return tids, [raw.decode("utf-8", "replace") for raw in raws]
