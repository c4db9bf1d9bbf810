"""DLedger commitlog entries (format note §12; DLedger 0.3.1.2 ``DLedgerEntry``, ``DLedgerEntryCoder``,
``DLedgerMmapFileStore``, ``MmapFileList``): the 48-byte entry header, the 32-byte index unit, the data file's
end blank and the ``checkpoint``/``currterm`` properties text. Bytes to values only; never opens a file."""

from __future__ import annotations

from typing import NamedTuple

#: ``DLedgerMmapFileStore.MAGIC_1`` = ``CURRENT_MAGIC``
DLEDGER_MAGIC = 1
#: ``DLedgerEntry.HEADER_SIZE`` (recovery needs an entry size above it) and ``BODY_OFFSET`` (the record)
DLEDGER_HEADER_SIZE = 44
DLEDGER_BODY_OFFSET = 48
#: ``MmapFileList.BLANK_MAGIC_CODE`` and ``MIN_BLANK_LEN``: a data file's end: int -1, int bytes left
DLEDGER_BLANK_MAGIC = -1
DLEDGER_MIN_BLANK_LEN = 8
#: ``DLedgerMmapFileStore.INDEX_NUIT_SIZE`` and the index file size ``DLedgerConfig`` gives (32 * 5 Mi units)
DLEDGER_INDEX_UNIT = 32
DLEDGER_INDEX_FILE_SIZE = DLEDGER_INDEX_UNIT * 5 * 1024 * 1024
#: field positions in the entry header
E_MAGIC, E_SIZE, E_INDEX, E_TERM, E_POS, E_CHANNEL, E_CHAIN_CRC, E_BODY_CRC, E_BODY_LEN = 0, 4, 8, 16, 24, 32, 36, 40, 44
#: field positions in an index unit: magic int | pos long | size int | index long | term long
I_MAGIC, I_POS, I_SIZE, I_INDEX, I_TERM = 0, 4, 12, 16, 24
#: ``dledger-<selfId>/`` files and folders
DLEDGER_DIR_PREFIX = "dledger-"
DLEDGER_DATA_DIR = "data"
DLEDGER_INDEX_DIR = "index"
DLEDGER_CHECKPOINT = "checkpoint"
DLEDGER_CURRTERM = "currterm"


def _i32(buf, i: int) -> int:
    return int.from_bytes(buf[i:i + 4], "big", signed=True)


def _i64(buf, i: int) -> int:
    return int.from_bytes(buf[i:i + 8], "big", signed=True)


class EntryHeader(NamedTuple):
    """One entry's header as stored (``channel``/``chain_crc``/``body_crc`` are 0 in DLedger 0.3.1.2)."""

    magic: int
    size: int
    index: int
    term: int
    pos: int
    channel: int
    chain_crc: int
    body_crc: int
    body_length: int


class IndexUnit(NamedTuple):
    """One 32-byte unit of ``dledger-<id>/index/``."""

    magic: int
    pos: int
    size: int
    index: int
    term: int


def decode_entry_header(buf, i: int = 0) -> EntryHeader:
    """The 48-byte header at ``buf[i:]`` (the caller makes sure 48 bytes are there)."""
    b = bytes(buf[i:i + DLEDGER_BODY_OFFSET])
    return EntryHeader(_i32(b, E_MAGIC), _i32(b, E_SIZE), _i64(b, E_INDEX), _i64(b, E_TERM), _i64(b, E_POS),
                       _i32(b, E_CHANNEL), _i32(b, E_CHAIN_CRC), _i32(b, E_BODY_CRC), _i32(b, E_BODY_LEN))


def decode_index_unit(buf, i: int = 0) -> IndexUnit:
    b = bytes(buf[i:i + DLEDGER_INDEX_UNIT])
    return IndexUnit(_i32(b, I_MAGIC), _i64(b, I_POS), _i32(b, I_SIZE), _i64(b, I_INDEX), _i64(b, I_TERM))


def entry_header_problem(h: EntryHeader, at: int) -> str | None:
    """Why DLedger's recovery would stop at this header (the checks of ``DLedgerMmapFileStore.recover``
    that do not need the neighbours), or None. ``at``: the entry's absolute offset."""
    if h.pos != at:
        return f"entry pos field {h.pos} is not its offset {at}"
    if h.body_length + DLEDGER_BODY_OFFSET != h.size:
        return f"entry size {h.size} is not 48 + body length {h.body_length}"
    if h.magic != DLEDGER_MAGIC:
        return f"entry magic {h.magic} is not {DLEDGER_MAGIC}"
    if h.size <= DLEDGER_HEADER_SIZE:
        return f"entry size {h.size} is not above the header size {DLEDGER_HEADER_SIZE}"
    return None


def looks_like_entry(buf, i: int, at: int, avail: int) -> bool:
    """Whether a sound entry header starts at ``buf[i:]`` (absolute offset ``at``): magic 1, pos = ``at``,
    size = 48 + body length, the entry inside ``avail`` bytes."""
    if avail < DLEDGER_BODY_OFFSET:
        return False
    h = decode_entry_header(buf, i)
    return entry_header_problem(h, at) is None and h.size <= avail


def parse_properties_text(text: str) -> dict[str, str]:
    """``IOUtils.string2Properties`` for DLedger's one-``key=value``-a-line files (``#`` comments)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        s = line.strip()
        if not s or s[0] in "#!":
            continue
        for sep in ("=", ":"):
            if sep in s:
                k, v = s.split(sep, 1)
                out[k.strip()] = v.strip()
                break
        else:
            out[s] = ""
    return out
