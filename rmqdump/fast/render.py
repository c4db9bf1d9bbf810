"""Compiled rendering of :class:`rmqdump.fast.walk.RecordBatch` columns: scan's JSONL lines and
the derived Arrow columns of :mod:`rmqdump.rows.arrow`, without one Python call per record.

Results are identical to the pure path (``tests/test_scan_fast.py`` compares them on every
fixture and real store): the kernels (:mod:`rmqdump.fast._jsonkernels`) render only records they
can render byte for byte and hand the others back (IPv6 hosts, text that is not valid UTF-8,
the delay topic, bodies to decompress); :class:`JsonlRenderer` renders those with the pure
path's ``render`` callback in their place.

Like :mod:`rmqdump.fast.walk`, importing this module is cheap; the kernels are compiled once per
machine into a shared library in :func:`rmqdump.fast.walk.cache_dir` (in a child process, 10-30 s)
and loaded with ctypes, so runs never import numba. ``RMQDUMP_FAST_LIBRARY=0`` uses numba's
JIT instead; ``RMQDUMP_FAST=0`` disables the fast path (see :func:`rmqdump.fast.walk.use_fast`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqdump.fast.abi import (
    B_BUF,
    B_COLS,
    B_DECOMPRESS,
    B_FILE,
    B_FILE_LEN,
    B_I0,
    B_LIMIT,
    B_MODE,
    B_N,
    B_OUT,
    B_OUT_CAP,
    B_OUT_CODE,
    B_OUT_EMITTED,
    B_OUT_LEN,
    B_OUT_NEXT,
    B_SCRATCH,
    B_SCRATCH_CAP,
    B_SEG_START,
    B_SELECT,
    B_SIZE,
    B_TAIL,
    B_TAIL_LEN,
    BLOCK_SIZE,
    BODY_MODES,
    C_BORN_H,
    C_ENTRIES,
    C_FLAGS,
    C_KEY_DATA,
    C_KEY_OFF,
    C_KEYS,
    C_MSGID,
    C_N,
    C_NAME_DATA,
    C_NAME_OFF,
    C_OUT_ENTRIES,
    C_OUT_KEYS,
    C_STORE_H,
    C_TAGCODE,
    C_TAGS,
    C_TOPIC,
    C_UNIQ,
    C_VALID,
    C_VALUE_DATA,
    C_VALUE_OFF,
    CODE_DONE,
    CODE_FALLBACK,
    CODE_FULL,
    MODE_BASE64,
    MODE_HEX,
    MODE_NONE,
    MODE_TEXT,
)

if TYPE_CHECKING:
    import numpy as np

    from rmqdump.codec.record import Message
    from rmqdump.fast.walk import RecordBatch

SCRATCH_PAIRS = 16384  # property pairs per record (a 32 KiB properties string has at most ~8200)
OUT_BUFFER = 8 * 1024 * 1024
MIN_RANGE_ROWS = 256  # rows a worker thread renders at a time (at least)

_backend: Any = None
_lock = threading.Lock()


def _abi() -> bytes:
    from rmqdump.fast.abi import COLUMNS

    return repr((BODY_MODES, CODE_DONE, CODE_FULL, CODE_FALLBACK, B_COLS, B_OUT_LEN, B_OUT_NEXT, B_OUT_CODE,
                 B_OUT_EMITTED, C_N, C_FLAGS, C_ENTRIES, C_NAME_OFF, C_NAME_DATA, C_VALUE_OFF, C_VALUE_DATA, C_KEYS,
                 C_KEY_OFF, C_KEY_DATA, C_TAGS, C_UNIQ, C_TAGCODE, C_TOPIC, C_BORN_H, C_STORE_H, C_MSGID, C_VALID,
                 C_OUT_ENTRIES, C_OUT_KEYS, B_TAIL, B_TAIL_LEN, BLOCK_SIZE, COLUMNS)).encode()


def library_path() -> Path:
    """The shared library for this machine, kernel source, numba and Python (may not exist yet)."""
    from rmqdump.fast.engine import kernel_library_path

    return kernel_library_path("render", "_jsonkernels.py", _abi())


def library_ready() -> bool:
    """Whether the shared library is built (else the first use builds it once, 10-30 s)."""
    try:
        return _backend is not None or library_path().exists()
    except OSError:
        return False


class _Backend:
    def __init__(self, kind: str, jsonl, columns, info, keep=None):
        self.kind = kind
        self.jsonl = jsonl
        self.columns = columns
        self._keep = keep
        block = (ctypes.c_int64 * 2)()
        info(ctypes.addressof(block))
        if block[0] != BLOCK_SIZE:
            raise RuntimeError(f"render kernel argument block {block[0]} != {BLOCK_SIZE}")


def backend() -> _Backend:
    """Load the kernels once per process (building the shared library the first time)."""
    global _backend
    if _backend is not None:
        return _backend
    with _lock:
        if _backend is None:
            from rmqdump.fast.engine import load_kernels

            _backend = load_kernels(
                "rmqdump.fast._jsonkernels", library_path, ("rmqdump_jsonl", "rmqdump_columns", "rmqdump_render_info"),
                ("jsonl_c", "columns_c", "info_c"), _Backend)
        return _backend


def _block(rb: RecordBatch, scratch: np.ndarray) -> np.ndarray:
    """The argument block with the batch's segment buffer and column pointers."""
    import numpy as np

    from rmqdump.fast.abi import COLUMN_NAMES

    a = np.zeros(BLOCK_SIZE, dtype=np.int64)
    a[B_BUF] = rb.buf.ctypes.data if rb.buf.size else 0
    a[B_SIZE] = rb.buf.size
    a[B_N] = rb.n
    a[B_SEG_START] = rb.seg_start
    a[B_SCRATCH] = scratch.ctypes.data
    a[B_SCRATCH_CAP] = scratch.shape[0]
    for k, name in enumerate(COLUMN_NAMES):
        col = rb.columns[name]
        if not col.flags.c_contiguous:
            raise ValueError(f"column {name} is not contiguous")
        a[B_COLS + k] = col.ctypes.data
    return a


def jsonl_mode(decoder) -> int | None:
    """The kernel body mode for a :class:`rmqdump.rows.bodyfmt.BodyDecoder`, None if it has none."""
    if decoder.mode == "text":
        import codecs

        return MODE_TEXT if codecs.lookup(decoder.charset).name == "utf-8" else None
    return BODY_MODES.get(decoder.mode)


class JsonlRenderer:
    """Writes batches as scan's JSONL lines to ``write`` (a binary writer).

    ``render(msg)`` gives the bytes of one line (newline included) by the pure path, for the
    records the kernel hands back. ``mode`` is a ``MODE_*`` body mode. ``jobs`` > 1 renders
    ranges of a batch in that many threads (output order unchanged); :meth:`close` stops them.
    ``tail``: export's lines (:func:`rmqdump.rows.export.jsonl_lines`): the UTF-8 JSON of the
    lineage columns from ``, "broker": `` to ``, "crc_ok": `` included (:meth:`set_tail`); the
    kernel adds ``crc_ok`` (true or null) and ``store_time`` (ISO 8601 ms, UTC, or null).
    """

    def __init__(self, write: Callable[[Any], Any], render: Callable[[Message], bytes], mode: int,
                 decompress: bool = False, buffer_size: int = OUT_BUFFER, jobs: int = 1, tail: bytes = b""):
        import numpy as np

        self.tail = np.frombuffer(tail, dtype=np.uint8).copy()
        self.k = backend()
        self.write = write
        self.render = render
        self.mode = mode
        self.decompress = decompress
        self.out = np.empty(buffer_size, dtype=np.uint8)
        self.scratch = np.empty((SCRATCH_PAIRS, 4), dtype=np.int64)
        self.count = 0
        self.fallbacks = 0
        self.jobs = max(1, jobs)
        self._pool = None
        self._workers: list = []
        self._files: dict[str, np.ndarray] = {}

    def set_tail(self, tail: bytes) -> None:
        """The lineage JSON of the next batches (a new split: broker, store, segment)."""
        import numpy as np

        self.tail = np.frombuffer(tail, dtype=np.uint8).copy()

    def _file(self, name: str) -> np.ndarray:
        f = self._files.get(name)
        if f is None:
            import json

            import numpy as np

            text = json.dumps(name, ensure_ascii=False)
            f = self._files[name] = np.frombuffer(text.encode("utf-8", "surrogateescape"), dtype=np.uint8).copy()
        return f

    def write_batch(self, rb: RecordBatch, select: np.ndarray | None = None, limit: int | None = None) -> int:
        """Render the batch's records (those with ``select`` true); stop after ``limit`` lines.
        Returns the number of lines written."""
        import numpy as np

        if any("\ud800" <= c <= "\udfff" for c in rb.file):  # the pure path would write the line ASCII-escaped
            return self._pure(rb, 0, select, limit)
        a = _block(rb, self.scratch)
        fname = self._file(rb.file)
        a[B_FILE] = fname.ctypes.data
        a[B_FILE_LEN] = fname.size
        tail = self.tail  # held until the batch is written
        if tail.size:
            a[B_TAIL] = tail.ctypes.data
            a[B_TAIL_LEN] = tail.size
        if select is not None:
            select = np.ascontiguousarray(select, dtype=np.uint8)
            a[B_SELECT] = select.ctypes.data
        a[B_OUT] = self.out.ctypes.data
        a[B_OUT_CAP] = self.out.size
        a[B_MODE] = self.mode
        a[B_DECOMPRESS] = 1 if self.decompress else 0
        a[B_LIMIT] = -1
        if limit is None and self.jobs > 1 and rb.n >= 2 * MIN_RANGE_ROWS:
            written = self._parallel(rb, a)
        else:
            written = self._serial(rb, a, 0, rb.n, limit)
        self.count += written
        return written

    def _serial(self, rb: RecordBatch, a: np.ndarray, lo: int, hi: int, limit: int | None = None) -> int:
        """Rows ``lo..hi-1`` on this thread, records the kernel hands back through ``render``."""
        addr = a.ctypes.data
        fn = self.k.jsonl
        out = memoryview(self.out)
        written = 0
        i = lo
        a[B_N] = hi
        read_body = self.mode != MODE_NONE
        while i < hi:
            if limit is not None and written >= limit:
                break
            a[B_I0] = i
            a[B_LIMIT] = -1 if limit is None else limit - written
            fn(addr)
            o, i, code = int(a[B_OUT_LEN]), int(a[B_OUT_NEXT]), int(a[B_OUT_CODE])
            written += int(a[B_OUT_EMITTED])
            if o:
                self.write(out[:o])
            if code == CODE_DONE or (code == CODE_FULL and o):
                continue
            # a record for the pure path (or one too big for the buffer)
            self.write(self.render(rb.message(i, read_body)))
            self.fallbacks += 1
            written += 1
            i += 1
        a[B_N] = rb.n
        return written

    def _parallel(self, rb: RecordBatch, a: np.ndarray) -> int:
        """Ranges of rows rendered by ``jobs`` worker threads (the kernel releases the GIL), written
        in order; a range a worker could not finish (a record for the pure path, a full buffer) is
        finished here before the next range is written."""
        import numpy as np

        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.jobs, thread_name_prefix="rmqdump-jsonl")
            self._workers = [(np.empty(self.out.size, dtype=np.uint8), np.empty_like(self.scratch),
                              np.empty(BLOCK_SIZE, dtype=np.int64)) for _ in range(self.jobs)]
        n = rb.n
        avg = float(rb["size"].mean()) if n else 1.0
        per_byte = {MODE_NONE: 0.0, MODE_BASE64: 1.34, MODE_HEX: 2.0, MODE_TEXT: 1.2}[self.mode]
        rows = int(min(max(MIN_RANGE_ROWS, (self.out.size // 3) // (avg * per_byte + 900)), -(-n // self.jobs)))
        ranges = [(lo, min(lo + rows, n)) for lo in range(0, n, rows)]
        fn = self.k.jsonl
        template = a.copy()

        def fill(worker, lo: int, hi: int) -> tuple[int, int, int]:
            out, scratch, block = worker
            block[:] = template
            block[B_OUT], block[B_OUT_CAP] = out.ctypes.data, out.size
            block[B_SCRATCH] = scratch.ctypes.data
            block[B_I0], block[B_N] = lo, hi
            fn(block.ctypes.data)
            return int(block[B_OUT_LEN]), int(block[B_OUT_NEXT]), int(block[B_OUT_EMITTED])

        pending = []
        todo = iter(ranges)
        for w in self._workers:
            r = next(todo, None)
            if r is None:
                break
            pending.append((w, r, self._pool.submit(fill, w, *r)))
        written = 0
        k = 0
        while k < len(pending):
            w, (lo, hi), fut = pending[k]
            pending[k] = None  # type: ignore[call-overload]
            k += 1
            o, nxt, emitted = fut.result()
            if o:
                self.write(memoryview(w[0])[:o])
            written += emitted
            if nxt < hi:
                written += self._serial(rb, a, nxt, hi)
            r = next(todo, None)
            if r is not None:
                pending.append((w, r, self._pool.submit(fill, w, *r)))
        return written

    def close(self) -> None:
        """Stop the worker threads."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def _pure(self, rb: RecordBatch, i: int, select, limit) -> int:
        written = 0
        read_body = self.mode != MODE_NONE
        for j in range(i, rb.n):
            if limit is not None and written >= limit:
                break
            if select is not None and not select[j]:
                continue
            self.write(self.render(rb.message(j, read_body)))
            written += 1
        self.count += written
        self.fallbacks += written
        return written


_local = threading.local()


def _alloc(n: int, dtype) -> np.ndarray:
    """An output array of the kernel (handed to Arrow, so never reused)."""
    import numpy as np

    return np.empty(n, dtype=dtype)


class Derived:
    """The derived columns of one batch as Arrow-ready buffers (see :func:`derive`)."""

    __slots__ = ("n", "flags", "entries", "names", "values", "keys", "key_values", "tags", "uniq", "tags_code",
                 "topic", "born_host", "store_host", "msg_id")


def _strings(off: np.ndarray, data: np.ndarray, n: int, valid: np.ndarray | None = None):
    """A pyarrow string array over int32 offsets and UTF-8 data (``valid``: int8 per row, 0 = null)."""
    import numpy as np
    import pyarrow as pa

    bitmap = None
    if valid is not None and not valid.all():
        bitmap = pa.py_buffer(np.packbits(valid.astype(bool), bitorder="little"))
    return pa.Array.from_buffers(pa.string(), n, [bitmap, pa.py_buffer(_used(off, n + 1)),
                                                  pa.py_buffer(_used(data, int(off[n]) if n else 0))])


def _used(a: np.ndarray, m: int) -> np.ndarray:
    """``a[:m]``, copied when that is under half of ``a``: the kernel's output areas are sized for the worst
    case (a property area per column), and a view would keep all of it alive as long as the Arrow array."""
    return a[:m].copy() if 2 * m < a.shape[0] else a[:m]


def derive(rb: RecordBatch) -> Derived:
    """The derived columns of a batch (topic, properties map parts, keys, tags, uniq_key, tags_code
    of the TAGS hash, born/store host, msg_id) as pyarrow arrays. ``flags`` marks the records that
    need the pure path (IPv6 hosts, topic or properties that are not valid UTF-8); when any is set
    only ``flags`` is filled. ``tags_code`` is the TAGS hash for every row: the caller replaces it
    for records of the delay topic."""
    import numpy as np
    import pyarrow as pa

    k = backend()
    n = rb.n
    scratch = getattr(_local, "scratch", None)
    if scratch is None:
        scratch = _local.scratch = np.empty((SCRATCH_PAIRS, 4), dtype=np.int64)
    a = _block(rb, scratch)
    cap_p = int(np.maximum(rb["properties_length"], 0).sum()) + 1
    cap_t = int(np.maximum(rb["topic_length"], 0).sum()) + 1
    cap_e = cap_p // 2 + n + 1
    i32, u8 = np.int32, np.uint8
    flags = np.empty(n, dtype=np.int8)
    entries = _alloc(n + 1, i32)
    name_off, value_off, key_off = (_alloc(cap_e + 1, i32) for _ in range(3))
    name_data, value_data, key_data, tags_data, uniq_data = (_alloc(cap_p, u8) for _ in range(5))
    keys, tags_off, uniq_off, topic_off, bh_off, sh_off = (_alloc(n + 1, i32) for _ in range(6))
    topic_data = _alloc(cap_t, u8)
    bh_data, sh_data = _alloc(28 * n, u8), _alloc(28 * n, u8)
    tags_code = np.empty(n, dtype=np.int64)
    msgid = _alloc(32 * n, u8)
    valid = np.empty(2 * n, dtype=np.int8)
    a[C_N], a[C_N + 1], a[C_N + 2], a[C_N + 3] = n, cap_p, cap_t, cap_e
    for slot, arr in ((C_FLAGS, flags), (C_ENTRIES, entries), (C_NAME_OFF, name_off), (C_NAME_DATA, name_data),
                      (C_VALUE_OFF, value_off), (C_VALUE_DATA, value_data), (C_KEYS, keys), (C_KEY_OFF, key_off),
                      (C_KEY_DATA, key_data), (C_TAGS, tags_off), (C_TAGS + 1, tags_data), (C_UNIQ, uniq_off),
                      (C_UNIQ + 1, uniq_data), (C_TAGCODE, tags_code), (C_TOPIC, topic_off),
                      (C_TOPIC + 1, topic_data), (C_BORN_H, bh_off), (C_BORN_H + 1, bh_data), (C_STORE_H, sh_off),
                      (C_STORE_H + 1, sh_data), (C_MSGID, msgid), (C_VALID, valid)):
        a[slot] = arr.ctypes.data
    k.columns(a.ctypes.data)
    d = Derived()
    d.n = n
    d.flags = flags
    if flags.any():
        return d
    ne, nk = int(a[C_OUT_ENTRIES]), int(a[C_OUT_KEYS])
    d.entries = pa.py_buffer(entries)
    d.names = _strings(name_off, name_data, ne)
    d.values = _strings(value_off, value_data, ne)
    d.keys = pa.py_buffer(keys)
    d.key_values = _strings(key_off, key_data, nk)
    d.tags = _strings(tags_off, tags_data, n, valid[0::2])
    d.uniq = _strings(uniq_off, uniq_data, n, valid[1::2])
    d.tags_code = tags_code
    d.topic = _strings(topic_off, topic_data, n)
    d.born_host = _strings(bh_off, bh_data, n)
    d.store_host = _strings(sh_off, sh_data, n)
    d.msg_id = pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(np.arange(0, 32 * n + 1, 32, dtype=i32)),
                                                      pa.py_buffer(msgid)])
    return d
