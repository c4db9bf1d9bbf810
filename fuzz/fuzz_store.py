#!/usr/bin/env python3
"""atheris (libFuzzer) harness for rmqdump's readers: only :class:`RmqdumpError` may escape.

The first input byte picks a target, the rest is its payload:

* ``decode``      - :func:`rmqdump.codec.record.decode_record` on arbitrary bytes, then every derived
  field (topic, properties, keys, ids, tagsCode, decompressed body, the JSONL row);
* ``walk_raw``    - the payload as one or two commitlog segments, walked with mmap and pread,
  stopping and ``keep_going``;
* ``walk_patch``  - a real segment (fixtures, real store) with payload-driven byte patches;
* ``cq``          - the payload as ConsumeQueue / BatchConsumeQueue files;
* ``index_raw`` / ``index_patch`` - IndexFile header, slots, chains and queries;
* ``config``      - the fastjson parser and the typed config decoders;
* ``props``       - the properties parser and keys splitter;
* ``ids``         - offsetMsgId / UNIQ_KEY / host decoders;
* ``names``       - untrusted names -> directory names (invariants, not just exceptions);
* ``checkpoint``  - checkpoint decoder;
* ``walk_sparse`` - the payload inside a sparse segment of 64 MiB to 4 GiB apparent size, alone or after a
  small segment (an oversized segment): work must follow the data, not the claimed size.

Seeds include crafted resync traps (overlapping, structurally valid candidates with wrong BODYCRCs)
and sparse segments, the shapes of issue 16's hostile corpus.

Run: ``python fuzz/fuzz_store.py -max_total_time=60 fuzz/corpus`` (see fuzz/README.md);
``python fuzz/fuzz_store.py --make-seeds DIR`` writes the seed corpus, ``--replay FILE...``
runs inputs once without libFuzzer (what the regression test does).
"""

from __future__ import annotations

import os
import shutil
import struct
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
REAL = REPO.parent / "shared" / "real-store" / "broker498"
FIXTURE_STORE = REPO / "fixtures" / "store"
SEG0 = "00000000000000000000"

try:
    import atheris
except ImportError:  # --replay and --make-seeds work without it
    atheris = None

if atheris is not None and __name__ == "__main__" and "--replay" not in sys.argv and "--make-seeds" not in sys.argv:
    with atheris.instrument_imports(include=["rmqdump"]):
        import rmqdump.codec.msgid  # noqa: F401
        import rmqdump.codec.properties  # noqa: F401
        import rmqdump.codec.record  # noqa: F401
        import rmqdump.disk.paths  # noqa: F401
        import rmqdump.rows.schema  # noqa: F401
        import rmqdump.store.checkpoint  # noqa: F401
        import rmqdump.store.commitlog  # noqa: F401
        import rmqdump.store.config  # noqa: F401
        import rmqdump.store.consumequeue  # noqa: F401
        import rmqdump.store.indexfile  # noqa: F401

from rmqdump.codec.encoder import encode_fields  # noqa: E402
from rmqdump.codec.layout import BLANK_MAGIC_CODE, MESSAGE_MAGIC_CODE, RECORD_FIXED_V4V4, TOTALSIZE_MAGIC  # noqa: E402
from rmqdump.codec.msgid import decode_offset_msg_id, decode_uniq_key, parse_host  # noqa: E402
from rmqdump.codec.properties import decode_properties_text, parse_properties, split_keys  # noqa: E402
from rmqdump.codec.record import Blank, Invalid, Message, decode_record, record_extent  # noqa: E402
from rmqdump.disk.paths import decode_component, encode_component, is_safe_component  # noqa: E402
from rmqdump.errors import RmqdumpError  # noqa: E402
from rmqdump.rows.schema import BODY_MODES, message_to_dict  # noqa: E402
from rmqdump.store.checkpoint import decode_checkpoint  # noqa: E402
from rmqdump.store.commitlog import CommitLog, Skipped  # noqa: E402
from rmqdump.store.config import (  # noqa: E402
    decode_consumer_offsets,
    decode_delay_offsets,
    decode_subscription_groups,
    decode_topics,
    parse_fastjson,
)
from rmqdump.store.consumequeue import BatchConsumeQueue, ConsumeQueue  # noqa: E402
from rmqdump.store.indexfile import IndexFile  # noqa: E402

# --- scratch space -------------------------------------------------------------------------

_shm = Path("/dev/shm")
_TMP = _shm if _shm.is_dir() and os.access(_shm, os.W_OK) else Path(tempfile.gettempdir())


def _reap_stale() -> None:
    """Remove scratch dirs of harness processes that are gone (libFuzzer exits without cleanup)."""
    for d in _TMP.glob("rmqdump-fuzz-*"):
        try:
            pid = int(d.name.rsplit("-", 1)[1])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(d, ignore_errors=True)
        except (ValueError, PermissionError, IndexError):
            pass


_reap_stale()
WORK = _TMP / f"rmqdump-fuzz-{os.getpid()}"
shutil.rmtree(WORK, ignore_errors=True)
STORE = WORK / "store"
CL_DIR = STORE / "commitlog"
CQ_DIR = STORE / "consumequeue" / "T" / "0"
BCQ_DIR = STORE / "batchconsumequeue" / "T" / "0"
IDX_DIR = STORE / "index"
for _d in (CL_DIR, CQ_DIR, BCQ_DIR, IDX_DIR):
    _d.mkdir(parents=True, exist_ok=True)


def _clear(d: Path) -> None:
    for p in d.iterdir():
        p.unlink()


def _write(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


# --- base files for patching (loaded once) --------------------------------------------------


def _load_bases() -> tuple[list[bytes], list[bytes]]:
    segs, idx = [], []
    for store in (FIXTURE_STORE, REAL / "clean", REAL / "crash_kill9"):
        cl = store / "commitlog"
        if cl.is_dir():
            for p in sorted(cl.iterdir())[:2]:
                data = p.read_bytes()
                if any(data[:8]):
                    segs.append(data[:16384])  # the first 16 KiB keep fuzzing fast
        ix = store / "index"
        if ix.is_dir():
            idx.extend(p.read_bytes() for p in sorted(ix.iterdir())[:1])
    return segs or [bytes(4096)], idx or [bytes(40 + 84 * 4)]


BASE_SEGMENTS, BASE_INDEXES = _load_bases()


def _patched(base: bytes, payload: bytes) -> bytes:
    """Apply patches ``(pos u24, len u8, bytes)`` from ``payload``; a leading byte may truncate."""
    data = bytearray(base)
    i = 0
    if payload and payload[0] & 0x80:  # truncate first (live-store / torn-write shapes)
        if len(payload) >= 4:
            cut = int.from_bytes(payload[1:4], "big") % (len(data) + 1)
            del data[cut:]
            i = 4
    else:
        i = 1
    while i + 4 <= len(payload) and data:
        pos = int.from_bytes(payload[i:i + 3], "big") % len(data)
        n = payload[i + 3]
        chunk = payload[i + 4:i + 4 + n]
        data[pos:pos + len(chunk)] = chunk
        i += 4 + n
    return bytes(data)


# --- exercising decoded values ---------------------------------------------------------------


def _exercise(msg: Message) -> None:
    """Touch every derived field of a decoded message."""
    _ = (msg.topic, msg.properties, msg.tags, msg.keys, msg.uniq_key, msg.born_host, msg.store_host, msg.msg_id,
         msg.transaction, msg.compression, msg.magic_name, msg.properties_text, repr(msg))
    try:
        msg.tags_code()
    except RmqdumpError:
        pass
    if msg.body is not None and msg.compression != "none":
        try:
            msg.decompressed_body()
        except RmqdumpError:
            pass
    for mode in BODY_MODES:
        try:
            message_to_dict(msg, mode, decompress=mode == "text")
        except RmqdumpError:
            pass


def _walk_all(check_crc_flags=(True,)) -> None:
    cl = CommitLog.open(CL_DIR)
    _ = cl.problems
    total = sum(s.size for s in cl.segments)
    for use_mmap in (True, False):
        for keep_going in (False, True):
            for check_crc in check_crc_flags:
                walk = cl.walk(check_crc=check_crc, keep_going=keep_going, use_mmap=use_mmap)
                last = -1
                n = 0
                for rec in walk:
                    n += 1
                    # progress: every yielded item starts after the previous one
                    start = rec.start if isinstance(rec, Skipped) else rec.offset
                    if start <= last:
                        raise AssertionError(f"walk did not advance: {start} after {last}")
                    last = start
                    if n > total + 2:
                        raise AssertionError("walk yielded more items than bytes")
                    if isinstance(rec, Message) and n <= 3 and use_mmap and not keep_going:
                        _exercise(rec)  # the decode target covers derived fields in depth
                if walk.stop is None:
                    raise AssertionError("walk ended without a stop reason")
    for seg in cl.segments:
        try:
            cl.decode_at(seg.start + seg.size // 2)
        except RmqdumpError:
            pass


# --- targets ---------------------------------------------------------------------------------


def t_decode(data: bytes) -> None:
    if len(data) < 2:
        return
    flags, buf = data[0], data[1:]
    extra = (flags >> 2) * 16
    for check_crc in (bool(flags & 1), not flags & 1):
        rec = decode_record(buf, 0, len(buf), 0, 0, "fuzz", to_end=len(buf) + extra, check_crc=check_crc,
                            read_body=bool(flags & 2))
        assert isinstance(rec, (Message, Blank, Invalid)), rec
        if isinstance(rec, Message):
            assert 0 < rec.size <= len(buf)
            _exercise(rec)
    record_extent(buf, 0, len(buf), len(buf) + extra)


def t_walk_raw(data: bytes) -> None:
    _clear(CL_DIR)
    if len(data) > 1 and data[0] & 1:
        cut = (data[0] >> 1) * len(data) // 128
        _write(CL_DIR / SEG0, data[1:1 + cut])
        _write(CL_DIR / f"{max(cut, 1):020d}", data[1 + cut:])
    else:
        _write(CL_DIR / SEG0, data[1:])
    _walk_all((True, False))


def t_walk_patch(data: bytes) -> None:
    if not data:
        return
    base = BASE_SEGMENTS[data[0] % len(BASE_SEGMENTS)]
    _clear(CL_DIR)
    _write(CL_DIR / SEG0, _patched(base, data[1:]))
    _walk_all()


def t_cq(data: bytes) -> None:
    if len(data) < 2:
        return
    mode = data[0]
    body = data[1:]
    for d in (CQ_DIR, BCQ_DIR):
        _clear(d)
    unit = 46 if mode & 1 else 20
    size = unit * (1 + (mode >> 1) % 8)
    qdir = BCQ_DIR if mode & 1 else CQ_DIR
    for k in range(0, min(len(body), size * 4), size):
        _write(qdir / f"{k:020d}", body[k:k + size])
    cls = BatchConsumeQueue if mode & 1 else ConsumeQueue
    for strict in (False, True):
        try:
            q = cls(qdir, "T", 0, None, strict)
        except RmqdumpError:
            continue
        _ = q.missing_files()
        if isinstance(q, ConsumeQueue):
            _ = (q.max_offset, q.max_physic_offset, q.truncated_files, q.min_offset(0), q.min_offset(1 << 40))
            n = 0
            for e in q.iter_entries():
                _ = (e.is_valid, e.is_pre_blank, e.is_ext_addr, e.ext_real_offset)
                n += 1
            assert n <= q.max_offset + 1
            for _e in q.iter_raw():
                pass
            for off in (0, 1, q.max_offset - 1, q.max_offset, -1):
                try:
                    q.entry_at(off)
                except RmqdumpError:
                    pass
        else:
            _ = (q.unit_count_end, q.max_offset)
            for u in q.iter_units(include_invalid=True):
                _ = (u.is_valid, u.next_offset)
            for off in (0, 1, q.max_offset - 1, q.max_offset):
                try:
                    q.find(off)
                except RmqdumpError:
                    pass


def _exercise_index(path: Path, geometry: tuple[int | None, int | None] = (None, None)) -> None:
    for strict in (False, True):
        try:
            f = IndexFile(path, geometry[0], geometry[1], strict=strict)
        except RmqdumpError:
            continue
        with f:
            h = f.header
            _ = (h.entry_count, h.is_time_matched(0, 1 << 62), f.index_count)
            n = 0
            for _e in f.iter_entries():
                n += 1
            assert n <= f.geometry.index_num
            slots = range(f.geometry.hash_slot_num) if not strict else range(0, f.geometry.hash_slot_num, 17)
            for slot in slots[:600]:
                try:
                    steps = 0
                    for _e in f.walk(slot, strict=strict):
                        steps += 1
                        assert steps <= f.index_count + 1, "chain walk longer than indexCount"
                except RmqdumpError:
                    pass
            for key in ("TopicTest#key-1", "T#k", "TopicTest#FD000000000000000000000000000002"):
                try:
                    f.select_phy_offsets(key, max_num=64, strict=strict)
                except RmqdumpError:
                    pass


def t_index_raw(data: bytes) -> None:
    if len(data) < 2:
        return
    slots = 1 + data[0] % 16
    entries = slots * 4
    size = 40 + slots * 4 + entries * 20
    body = data[1:1 + size].ljust(size, b"\0")
    _clear(IDX_DIR)
    p = IDX_DIR / "20261101000000000"
    _write(p, body)
    _exercise_index(p)
    _write(p, data[1:])  # arbitrary size: geometry inference must refuse cleanly
    _exercise_index(p)
    _exercise_index(p, (slots, None))


def t_index_patch(data: bytes) -> None:
    if not data:
        return
    base = BASE_INDEXES[data[0] % len(BASE_INDEXES)]
    _clear(IDX_DIR)
    p = IDX_DIR / "20261101000000000"
    _write(p, _patched(base, data[1:]))
    _exercise_index(p)


def t_config(data: bytes) -> None:
    value = parse_fastjson(data, "fuzz.json")
    for decode in (decode_consumer_offsets, decode_delay_offsets, decode_topics, decode_subscription_groups):
        try:
            decode(value, Path("fuzz.json"))
        except RmqdumpError:
            pass


def t_props(data: bytes) -> None:
    text = decode_properties_text(data)
    props = parse_properties(text)
    for k, v in props.items():
        assert isinstance(k, str) and isinstance(v, str)
    split_keys(props.get("KEYS"))
    split_keys(text)


def t_ids(data: bytes) -> None:
    text = data.decode("utf-8", "replace")
    for fn in (decode_offset_msg_id, lambda s: decode_uniq_key(s, 1795297000000), decode_uniq_key, parse_host):
        try:
            fn(text)
        except RmqdumpError:
            pass


def t_names(data: bytes) -> None:
    name = data.decode("utf-8", "surrogateescape")
    enc = encode_component(name)
    raw = enc.encode("utf-8")
    assert enc not in ("", ".", ".."), enc
    assert "/" not in enc and "\0" not in enc and "\\" not in enc, enc
    assert len(raw) <= 255, len(raw)
    assert is_safe_component(enc), enc
    dec = decode_component(enc)
    assert dec is None or dec == name, (name, enc, dec)
    if is_safe_component(name):
        assert os.path.basename(name) == name and name not in (".", "..")
    try:
        from rmqdump.rows.export import partition_dir_name
    except Exception:  # pyarrow missing: the export encoder is not available
        return
    d = partition_dir_name("topic", name)
    assert "/" not in d and "\0" not in d and d not in (".", "..") and len(d.encode("utf-8")) <= 255, d


def t_checkpoint(data: bytes) -> None:
    cp = decode_checkpoint(data, "checkpoint")
    cp.as_dict()


SPARSE_SIZES = (64 << 20, 1 << 30, 4 << 30)
SMALL_SEGMENT = 1 << 16


def _write_sparse(path: Path, data: bytes, apparent: int, pos: int) -> None:
    with open(path, "wb") as f:
        f.truncate(apparent)
        f.seek(pos)
        f.write(data)


def t_walk_sparse(data: bytes) -> None:
    """byte 0: bits 0-1 the apparent size, bit 2 a small full segment first (then the sparse one is an
    oversized segment), bit 3 the payload at the end of the file (after a hole), bits 4-7 its 4 KiB
    page otherwise."""
    if not data:
        return
    flags, payload = data[0], data[1:]
    apparent = SPARSE_SIZES[(flags & 3) % len(SPARSE_SIZES)]
    _clear(CL_DIR)
    name = SEG0
    if flags & 4:  # a 64 KiB segment: some payload, then the end-of-file blank that leads to the next one
        head = payload[:SMALL_SEGMENT // 2]
        blank = TOTALSIZE_MAGIC.pack(SMALL_SEGMENT - len(head), BLANK_MAGIC_CODE)
        _write_sparse(CL_DIR / SEG0, head + blank, SMALL_SEGMENT, 0)
        name = f"{SMALL_SEGMENT:020d}"
    pos = apparent - len(payload) if flags & 8 else (flags >> 4) * 4096
    _write_sparse(CL_DIR / name, payload, apparent, max(0, pos))
    _walk_all()


TARGETS = [t_decode, t_walk_raw, t_walk_patch, t_cq, t_index_raw, t_index_patch, t_config, t_props, t_ids, t_names,
           t_checkpoint]
TARGET_IDS = {f.__name__[2:]: i for i, f in enumerate(TARGETS)}
#: targets added later: picked by byte 0 >= 0xF0, so every recorded input keeps the target it had
EXTRA_TARGETS = [t_walk_sparse]
EXTRA_BASE = 0xF0
TARGET_IDS.update({f.__name__[2:]: EXTRA_BASE + i for i, f in enumerate(EXTRA_TARGETS)})


def target_of(byte0: int):
    if byte0 >= EXTRA_BASE:
        return EXTRA_TARGETS[(byte0 - EXTRA_BASE) % len(EXTRA_TARGETS)]
    return TARGETS[byte0 % len(TARGETS)]


#: Open bugs already reported, each with a fixture under fixtures/bugs/fuzz-open/ and a strict
#: xfail test (tests/test_fuzz.py): (exception type name, file suffix, function) of the raising
#: frame. They are not re-reported unless RMQDUMP_FUZZ_STRICT=1; remove an entry once fixed.
KNOWN_OPEN: list[tuple[str, str, str]] = []
STRICT = os.environ.get("RMQDUMP_FUZZ_STRICT") == "1"


def known_open(exc: BaseException) -> bool:
    """Whether ``exc`` is one of :data:`KNOWN_OPEN` (matched on its innermost rmqdump frame)."""
    tb, frame = exc.__traceback__, None
    while tb is not None:
        if "rmqdump" in tb.tb_frame.f_code.co_filename:
            frame = tb.tb_frame
        tb = tb.tb_next
    if frame is None:
        return False
    where = frame.f_code.co_filename.replace(os.sep, "/")
    return any(type(exc).__name__ == t and where.endswith(f) and frame.f_code.co_name == fn for t, f, fn in KNOWN_OPEN)


def TestOneInput(data: bytes) -> None:  # noqa: N802 (libFuzzer's name)
    """One fuzz input: byte 0 selects the target; only RmqdumpError may escape a target."""
    if not data:
        return
    target = target_of(data[0])
    try:
        target(data[1:])
    except RmqdumpError:
        pass
    except Exception as e:
        if STRICT or not known_open(e):
            raise


# --- seeds -----------------------------------------------------------------------------------


def crafted_candidates(size: int = 6000, spacing: int = 128, claimed: int = 2048, first: int = 0) -> bytes:
    """A resync trap: one good record, a damaged byte, then overlapping candidates every ``spacing`` bytes,
    each structurally valid (V1 magic, PHYSICALOFFSET equal to its position + ``first``, TOTALSIZE
    ``claimed`` with a consistent BODYLEN) but with a wrong BODYCRC (as tests/secutil.py builds them).
    ``claimed`` a multiple of ``spacing`` >= 96 keeps each candidate consistent: its topic and properties
    lengths fall in the zeros between two headers."""
    buf = bytearray(size)
    good = encode_fields(topic=b"T", body=b"ok", properties=b"", physical_offset=first,
                         store_timestamp=1_700_000_000_000)
    buf[:len(good)] = good
    buf[len(good)] = 0x55
    blen = claimed - RECORD_FIXED_V4V4.size - 1 - 2
    for pos in range(len(good) + spacing, size - RECORD_FIXED_V4V4.size, spacing):
        RECORD_FIXED_V4V4.pack_into(buf, pos, claimed, MESSAGE_MAGIC_CODE, 12345, 0, 0, 0, first + pos, 0, 0,
                                    b"\x7f\0\0\1", 1, 0, b"\x7f\0\0\1", 2, 0, 0, blen)
    return bytes(buf)



def make_seeds(out: Path) -> int:
    """Write the seed corpus (real stores + fixtures) into ``out``; returns the number of seeds."""
    out.mkdir(parents=True, exist_ok=True)
    n = 0

    def put(target: str, payload: bytes) -> None:
        nonlocal n
        (out / f"seed-{target}-{n:05d}").write_bytes(bytes([TARGET_IDS[target]]) + payload)
        n += 1

    stores = [FIXTURE_STORE] + ([REAL / s for s in ("clean", "crash_kill9", "crash_torn", "crash_torn_props",
                                                    "corrupt_crc")] if REAL.is_dir() else [])
    for store in stores:
        for seg in sorted((store / "commitlog").iterdir())[:1]:
            data = seg.read_bytes()
            cl = CommitLog.open(seg)
            recs = []
            for rec in cl.walk(check_crc=False):
                if isinstance(rec, Message):
                    recs.append(data[rec.file_pos:rec.file_pos + rec.size])
                if len(recs) >= 40:
                    break
            for r in recs:
                if len(r) <= 4096:
                    put("decode", b"\x02" + r)
            put("walk_raw", b"\x00" + data[:3000])
            put("walk_raw", b"\x41" + data[:3000])
        cq_root = store / "consumequeue"
        if cq_root.is_dir():
            for qfile in sorted(cq_root.rglob("0000*"))[:20]:
                put("cq", b"\x0e" + qfile.read_bytes()[:2400])
        for name in ("topics.json", "consumerOffset.json", "delayOffset.json", "subscriptionGroup.json"):
            p = store / "config" / name
            if p.is_file():
                put("config", p.read_bytes()[:4096])
        cp = store / "checkpoint"
        if cp.is_file():
            put("checkpoint", cp.read_bytes()[:40])
    for i in range(len(BASE_SEGMENTS)):
        put("walk_patch", bytes([i]) + b"\x00")
        put("walk_patch", bytes([i]) + b"\x00" + struct.pack(">I", 239)[1:] + b"\x04" + struct.pack(">i", -1))
        put("walk_patch", bytes([i]) + b"\x80" + (2000).to_bytes(3, "big"))
    for i in range(len(BASE_INDEXES)):
        put("index_patch", bytes([i]) + b"\x00")
        put("index_patch", bytes([i]) + b"\x00" + (36).to_bytes(3, "big") + b"\x04" + struct.pack(">i", 2**31 - 1))
    put("index_raw", b"\x03" + bytes(40 + 4 * 4 + 16 * 20))
    crafted = [crafted_candidates(), crafted_candidates(7000, 96, 4032), crafted_candidates(3000, 128, 640)]
    for c in crafted:  # resync traps: in a segment of their own, after a hole in a sparse file, or oversized
        put("walk_raw", b"\x00" + c)
        put("walk_sparse", bytes([0]) + c)
        put("walk_sparse", bytes([0x08 | 2]) + c)
        put("walk_sparse", bytes([0x04 | 2]) + c)
    for i, seg in enumerate(BASE_SEGMENTS[:3]):  # real records in sparse files of each apparent size
        put("walk_sparse", bytes([i % 3]) + seg[:4000])
        put("walk_sparse", bytes([0x04 | 0x08 | i % 3]) + seg[:4000])
        put("walk_sparse", bytes([0x30 | 2]) + seg[:4000])
    for text in (b"KEYS\x01a b  c\x02TAGS\x01t\x02UNIQ_KEY\x01FD00", b"\x01\x02\x01", "用户\x01值 ✓".encode()):
        put("props", text)
    for text in (b"7F00000100002A9F0000000000000000", b"FD0000000000000000000000000000020001B3B5D9C1FE4F2A0000",
                 b"127.0.0.1:10911", b"[::1]:1"):
        put("ids", text)
    for text in (b"../../x", b"/abs/path", b"a\x00b", b"x" * 300, b".", b"..", b"\xff\xfe", b"\x1b[31m"):
        put("names", text)
    return n


def replay(paths: list[str]) -> int:
    """Run inputs once (no libFuzzer); exceptions propagate. Returns how many ran."""
    for p in paths:
        TestOneInput(Path(p).read_bytes())
    return len(paths)


def main(argv: list[str]) -> None:
    if len(argv) > 2 and argv[1] == "--make-seeds":
        print(f"{make_seeds(Path(argv[2]))} seeds written to {argv[2]}")
        return
    if len(argv) > 1 and argv[1] == "--replay":
        print(f"replayed {replay(argv[2:])} inputs")
        return
    if atheris is None:
        raise SystemExit("atheris is not installed (pip install atheris)")
    atheris.Setup(argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    try:
        main(sys.argv)
    finally:
        shutil.rmtree(WORK, ignore_errors=True)
