"""Controller-mode epoch checks (5.x ``epochFileCheckpoint`` + ``.bak``, :mod:`rmqdump.store.epoch`): the
count and CRC32 lines as ``CheckpointFile.read`` checks them, which file the broker loads, epoch order, and an
epoch starting past the commitlog's end. The file gives no end for the last epoch; the confirmed end is the
checkpoint's ``confirmPhyOffset`` (bytes 32..40): 5.3.3's ``CommitLog.setConfirmOffset`` stores it there, a
slave's truncation to the consistent point lowers it (``CommitLog.truncateDirtyFiles``) while the bytes after
that point stay in the file (``MappedFileQueue.truncateDirtyFiles`` only moves positions; apache/rocketmq
#10666), and ``loadCheckPoint`` reads it back. Records between it and the commitlog's valid end are reported."""

from __future__ import annotations

from rmqdump.codec.record import Message
from rmqdump.errors import RmqdumpError
from rmqdump.findings import ERROR, INFO, WARNING, Finding
from rmqdump.store.checkpoint import checkpoint_path, read_checkpoint
from rmqdump.store.epoch import EPOCH_FILE, EpochFile, read_epochs

_LISTED = 10  # record offsets named in the finding


def _file_problem(f: EpochFile) -> str | None:
    return f.fatal or f.io_error


def check_epochs(store, end_offset: int | None) -> list[Finding]:
    """Findings on the store's epoch files; ``end_offset``: where the commitlog's valid data ends (None: unknown)."""
    if store.root is None:
        return []
    ep = read_epochs(store.root)
    if ep is None:
        return []
    out: list[Finding] = []
    main, bak = ep.main, ep.bak
    if main is not None and _file_problem(main):
        if ep.load_error is None and ep.used is bak and bak is not None:
            out.append(Finding(WARNING, "epoch_file_bad", str(main.path), None,
                               f"{_file_problem(main)}; the broker falls back to {EPOCH_FILE}.bak "
                               f"({len(bak.entries)} epochs, the previous write)"))
        else:
            why = _file_problem(main)
            if ep.load_error is None and ep.used is None:  # CheckpointFile.read: a missing .bak reads as empty
                why += f"; no {EPOCH_FILE}.bak to fall back to: the broker loads no epoch at all"
            out.append(Finding(ERROR, "epoch_file_bad", str(main.path), None, why))
    if ep.load_error is not None:
        out.append(Finding(ERROR, "epoch_load_fails", str(store.root / EPOCH_FILE), None,
                           f"the broker cannot load its epochs (EpochFileCache.initCacheFromFile fails): "
                           f"{ep.load_error}"))
    if bak is not None and _file_problem(bak) and ep.used is not bak and ep.load_error is None:
        out.append(Finding(INFO, "epoch_bak_bad", str(bak.path), None,
                           f"{_file_problem(bak)} (not used: {EPOCH_FILE} itself loads)"))
    if main is not None and bak is not None and main.ok and bak.ok and main.entries and bak.entries:
        now = {e.epoch: e.start_offset for e in main.entries}
        moved = [e for e in bak.entries if e.epoch in now and now[e.epoch] != e.start_offset]
        if moved:
            out.append(Finding(INFO, "epoch_bak_differs", str(bak.path), None,
                               f"epoch {moved[0].epoch} started at {moved[0].start_offset} in the previous write, "
                               f"{now[moved[0].epoch]} now"))
    if ep.used is not None:
        ents = ep.used.entries
        for a, b in zip(ents, ents[1:], strict=False):
            if not (a.epoch < b.epoch and a.start_offset < b.start_offset):
                out.append(Finding(WARNING, "epoch_order", str(ep.used.path), None,
                                   f"epoch {a.epoch}-{a.start_offset} is followed by {b.epoch}-{b.start_offset}: "
                                   "the broker only appends larger epochs with larger start offsets"))
                break
    if end_offset is not None and ep.epochs and ep.epochs[-1].start_offset > end_offset:
        last = ep.epochs[-1]
        out.append(Finding(WARNING, "epoch_past_end", str(ep.used.path if ep.used else store.root), None,
                           f"epoch {last.epoch} starts at {last.start_offset}, past the commitlog's end "
                           f"{end_offset}: records written in earlier epochs were lost or cut after it began"))
    if end_offset is not None:
        out += _unconfirmed(store, end_offset)
    return out


def _unconfirmed(store, end_offset: int) -> list[Finding]:
    """Records after the checkpoint's confirmPhyOffset (0: never stored, nothing judged)."""
    try:
        confirm = read_checkpoint(checkpoint_path(store.root)).confirm_phy_offset
    except RmqdumpError:
        return []
    cl = store.commitlog
    if confirm <= 0 or confirm >= end_offset or not cl.segments or confirm < cl.min_offset:
        return []
    walk = cl.walk(start=confirm, end=end_offset, check_crc=False, read_body=False)
    offsets = [r.offset for r in walk if isinstance(r, Message)]
    where = "checkpoint"
    if not offsets and walk.stop is not None and walk.stop.offset == confirm:
        return [Finding(WARNING, "epoch_unconfirmed_records", where, confirm,
                        f"the checkpoint's confirmPhyOffset {confirm} is not at a record boundary "
                        f"({walk.stop.kind}); {end_offset - confirm} bytes of records follow it")]
    shown = ", ".join(map(str, offsets[:_LISTED])) + (" ..." if len(offsets) > _LISTED else "")
    return [Finding(WARNING, "epoch_unconfirmed_records", where, confirm,
                    f"{len(offsets)} record(s), {end_offset - confirm} bytes ({shown}) lie after the confirm offset "
                    f"{confirm} (checkpoint confirmPhyOffset) up to the commitlog's valid end {end_offset}: not "
                    "confirmed by the in-sync replicas; on a slave that truncated to the consistent point these are "
                    "stale bytes the truncation left (apache/rocketmq #10666), which the broker's recovery accepts")]
