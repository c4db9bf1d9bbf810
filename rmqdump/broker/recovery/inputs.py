"""What the broker's startup recovery starts from: the model versions, the checkpoint as the broker maps
it, why ``load()`` would refuse the commitlog directory, and the file the walk starts from (normal:
third-from-last or the file holding the consume-queue maximum; abnormal: by the checkpoint's min time)."""

from __future__ import annotations

import os

from rmqdump.codec.layout import (
    CHECKPOINT,
    HOST_V6_LENGTH,
    INT64,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    RECORD_PREFIX,
    STORE_COMMITLOG_DIR,
    STORE_TIMESTAMP_BASE,
    host_lengths,
)
from rmqdump.disk.fileio import read_regular
from rmqdump.disk.segment import Segment, java_parses_name
from rmqdump.errors import StoreError
from rmqdump.store.checkpoint import Checkpoint, decode_checkpoint
from rmqdump.store.commitlog import CommitLog
from rmqdump.store.root import Store

VERSION_49 = "4.9"
VERSION_53 = "5.3"
VERSIONS = (VERSION_49, VERSION_53)
VERSION_AUTO = "auto"  # verify: 4.9 unless the store holds records only 5.x writes


def read_checkpoint_for_recovery(store: Store) -> tuple[Checkpoint, str | None]:
    """The checkpoint as the broker maps it: a missing file or missing bytes read as zeros.

    Returns the checkpoint and a note when it is not a plain 4096-byte file.
    """
    path = store.path("checkpoint")
    if path is None:
        return Checkpoint(file_size=0), "checkpoint missing: the broker creates a zero-filled one"
    try:
        data = read_regular(path, CHECKPOINT.size)
        size = os.stat(path).st_size
    except StoreError as e:
        return Checkpoint(file_size=0), f"checkpoint unreadable ({e.message}); treated as zeros"
    except OSError as e:
        return Checkpoint(file_size=0), f"checkpoint unreadable ({e.strerror}); treated as zeros"
    cp = decode_checkpoint(data.ljust(CHECKPOINT.size, b"\0"), path)
    cp = Checkpoint(*cp.fields(), file_size=size)
    note = None if size == 4096 else f"checkpoint is {size} bytes (expected 4096); missing bytes read as zeros"
    return cp, note


def load_problems(store: Store, version: str = VERSION_49, repairable_ok: bool = False) -> list[str]:
    """Why the broker's ``load()`` would fail on this store's files (empty: it loads). ``repairable_ok``: files
    repair deletes are not problems (a zero-length last commitlog file, which 5.x deletes too; a ``.delete``
    file a compaction pass left)."""
    cl = store.commitlog
    out: list[str] = []
    d = cl.location
    if not d.is_dir():  # a single segment file was given
        return out
    try:
        names = sorted(os.listdir(d))
    except OSError as e:
        return [f"cannot list {d}: {e.strerror}"]
    last = names[-1] if names else None
    for name in names:
        p = d / name
        try:
            if p.is_dir():
                if version == VERSION_49:
                    out.append(f"{STORE_COMMITLOG_DIR}/{name} is a directory (4.9 loads it as a mapped file)")
                continue
            size = p.stat().st_size
        except OSError as e:
            out.append(f"{STORE_COMMITLOG_DIR}/{name}: {e.strerror}")
            continue
        if size != cl.file_size:
            if size == 0 and (version == VERSION_53 or repairable_ok) and name == last:
                continue  # 5.x deletes a zero-length last file
            out.append(f"{STORE_COMMITLOG_DIR}/{name} is {size} bytes, not the store's file size "
                       f"{cl.file_size} (\"length not matched message store config value\")")
        elif not java_parses_name(name):
            out.append(f"{STORE_COMMITLOG_DIR}/{name}: not a numeric file name up to Long.MAX_VALUE "
                       "(Long.parseLong throws at load)")
    if version == VERSION_53 and store.root is not None:
        from rmqdump.broker.compaction_load import compaction_load
        from rmqdump.store.compaction import left_for_deletion

        for rel, why in compaction_load(store.root, skip_leftovers=repairable_ok).refusals:
            hint = ("; a compaction pass left it for deletion: rmqdump repair deletes it"
                    if left_for_deletion(store.root / rel) else "")
            out.append(f"{rel}: {why}: the compaction store's load fails{hint}")
    return out


# --- start file ---------------------------------------------------------------------------------


def normal_start_index(cl: CommitLog, version: str = VERSION_49, max_phy_cq: int = -1) -> int:
    """``recoverNormally`` start file: 4.9/5.0–5.3.1 third-from-last; 5.3.2+ the file holding the CQ max."""
    n = len(cl.segments)
    if version == VERSION_53:
        for i in range(n - 1, -1, -1):
            if cl.segments[i].start <= max_phy_cq:
                return i
        return 0
    return max(0, n - 3)


def first_record_store_timestamp(seg: Segment, version: str = VERSION_49) -> int | None:
    """``isMappedFileMatchedRecover`` inputs: the first record's store time, None if its magic is not accepted."""
    try:
        head = read_regular(seg.path, STORE_TIMESTAMP_BASE + HOST_V6_LENGTH + INT64.size)
    except StoreError:
        return None
    if len(head) < RECORD_PREFIX.size:
        return None
    fields = RECORD_PREFIX.unpack_from(head, 0)
    magic, sysflag = fields[1], fields[7]
    if magic != MESSAGE_MAGIC_CODE and not (version == VERSION_53 and magic == MESSAGE_MAGIC_CODE_V2):
        return None
    pos = STORE_TIMESTAMP_BASE + host_lengths(sysflag)[0]
    if len(head) < pos + INT64.size:
        return None
    return INT64.unpack_from(head, pos)[0]


def abnormal_start_index(cl: CommitLog, min_timestamp: int, version: str = VERSION_49) -> tuple[int, list[str]]:
    """``recoverAbnormally`` start file: newest file whose first record qualifies, else 0."""
    notes = []
    for i in range(len(cl.segments) - 1, -1, -1):
        seg = cl.segments[i]
        ts = first_record_store_timestamp(seg, version)
        if ts is None:
            notes.append(f"{seg.name}: first record has no accepted magic")
            continue
        if ts == 0:
            notes.append(f"{seg.name}: first record store time is 0")
            continue
        if ts <= min_timestamp:
            return i, notes
        notes.append(f"{seg.name}: first record stored at {ts} > checkpoint min timestamp {min_timestamp}")
    return 0, notes
