"""The broker's small files: the checkpoint (:func:`check_checkpoint`), ``config/*.json``
(:func:`check_config`), committed consumer offsets (:func:`check_consumer_offsets`), ``abort`` and the lock
(:func:`check_abort_lock`).

The store checks (:mod:`rmqdump.analysis.verify.queue_checks`, :mod:`~rmqdump.analysis.verify.index_checks`,
:mod:`~rmqdump.analysis.verify.meta_checks`) append :class:`~rmqdump.findings.Finding` objects to a list;
file names are relative to the store root, offsets are byte positions in that file (for the commitlog: the
commitlog offset).
"""

from __future__ import annotations

import os
from pathlib import Path

from rmqdump.broker.recovery import QueueState
from rmqdump.disk.fileio import read_regular
from rmqdump.errors import RmqdumpError, StoreError
from rmqdump.findings import ERROR, INFO, WARNING, Finding
from rmqdump.store.config import read_config_bytes


def check_checkpoint(store, checkpoint, *, max_store_ts: int | None, has_data: bool,
                     index_infos: list[dict]) -> list[Finding]:
    out: list[Finding] = []
    path = store.path("checkpoint")
    if path is None:
        out.append(Finding(WARNING, "checkpoint_missing", "checkpoint", None,
                           "no checkpoint file: abnormal recovery would start at the first commitlog file"))
        return out
    if checkpoint.file_size != 4096:
        out.append(Finding(WARNING, "checkpoint_size", "checkpoint", None,
                           f"checkpoint is {checkpoint.file_size} bytes, expected 4096"))
    cp = checkpoint
    if has_data and cp.physic_msg_timestamp == 0 and cp.logics_msg_timestamp == 0:
        out.append(Finding(INFO, "checkpoint_zero", "checkpoint", 0,
                           "checkpoint timestamps are 0 (never flushed): abnormal recovery starts at the first file"))
    if max_store_ts is not None:
        for name, pos, v in (("physicMsgTimestamp", 0, cp.physic_msg_timestamp),
                             ("logicsMsgTimestamp", 8, cp.logics_msg_timestamp)):
            if v > max_store_ts:
                out.append(Finding(WARNING, "checkpoint_ahead", "checkpoint", pos,
                                   f"{name} {v} is later than the newest valid record ({max_store_ts}): records "
                                   "that were flushed are no longer readable"))
    if cp.index_msg_timestamp and index_infos:
        if not any(i["end_timestamp"] == cp.index_msg_timestamp for i in index_infos):
            out.append(Finding(INFO, "checkpoint_index", "checkpoint", 16,
                               f"indexMsgTimestamp {cp.index_msg_timestamp} is no index file's endTimestamp"))
    return out


def check_config(root: Path) -> tuple[list[Finding], dict]:
    """Every ``config/*.json`` parses (fastjson rules); known files decode. Returns loaded topics too."""
    from rmqdump.broker.recovery.start import loaded_at_start
    from rmqdump.store.config import (
        BAK_SUFFIX,
        decode_config,
        decode_consumer_offsets,
        decode_delay_offsets,
        decode_subscription_groups,
        decode_topics,
        keep,
        load_config_file,
        load_fails,
    )

    out: list[Finding] = []
    loaded: dict = {}
    cdir = root / "config"
    if not cdir.is_dir():
        # the store module never writes config/ (the broker's managers do): a store without it starts fine
        out.append(Finding(INFO, "config_missing", "config", None, "no config/ directory"))
        return out, loaded
    decoders = {"topics.json": decode_topics, "consumerOffset.json": decode_consumer_offsets,
                "delayOffset.json": decode_delay_offsets, "subscriptionGroup.json": decode_subscription_groups}
    try:
        names = sorted(n for n in os.listdir(cdir) if n.endswith(".json") or n.endswith(".json" + BAK_SUFFIX))
    except OSError as e:
        return [Finding(ERROR, "config_unreadable", "config", None, e.strerror or str(e))], loaded
    for name in names:
        if name.endswith(BAK_SUFFIX):
            continue
        label = f"config/{name}"
        dec = decoders.get(name, keep)
        try:
            data = read_config_bytes(cdir / name) or b""
        except StoreError as e:
            out.append(Finding(ERROR, "config_unreadable", label, None, e.message))
            continue
        except OSError as e:
            out.append(Finding(ERROR, "config_unreadable", label, None, e.strerror or str(e)))
            continue
        try:
            if data.strip():
                loaded[name] = decode_config(data, cdir / name, dec)
                continue
            err: RmqdumpError | None = None
        except RmqdumpError as e:
            err = e
        try:
            res = load_config_file(cdir / name, dec)  # the broker's fallback to <name>.bak
            loaded[name] = res.data
            ok = res.used_backup
        except RmqdumpError:
            ok = False
        then = " — the broker falls back to .bak"
        severity = WARNING if ok else ERROR
        if not ok and not loaded_at_start(root, name):
            then = " and no .bak decodes; the broker's start does not load this file (whatever reads it gets nothing)"
            severity = WARNING
        elif not ok:
            then = (" and its .bak does not decode either: ConfigManager.load fails and the broker does not start"
                    if load_fails(cdir / name, dec) else
                    " and no .bak holds a copy: the broker starts with this table empty (what it held is lost)")
        if err is None:
            out.append(Finding(severity, "config_parse", label, None, "empty file" + then))
        else:
            out.append(Finding(severity, "config_parse", label, err.offset, err.message + then))
    return out, loaded


def check_consumer_offsets(offsets, states: list[QueueState], cq_ends: dict[str, int]) -> list[Finding]:
    """Committed consumer offsets beyond a queue's max offset (now, and after the predicted recovery)."""
    out: list[Finding] = []
    if offsets is None:
        return out
    max_now = {f"{s.topic}/{s.queue_id}": s.max_offset for s in states}
    for topic, group, qid, off in offsets.rows():
        key = f"{topic}/{qid}"
        now = max_now.get(key)
        if now is not None and off > now:
            out.append(Finding(WARNING, "consumer_offset_ahead", "config/consumerOffset.json", None,
                               f"{topic}@{group} queue {qid}: committed offset {off} > queue max offset {now}"))
        elif key in cq_ends and off > cq_ends[key]:
            out.append(Finding(INFO, "consumer_offset_ahead", "config/consumerOffset.json", None,
                               f"{topic}@{group} queue {qid}: committed offset {off} > {cq_ends[key]}, the queue's "
                               "max offset after the predicted recovery: the broker answers OFFSET_OVERFLOW_BADLY "
                               "and corrects the consumer's offset (messages re-delivered or skipped)"))
    return out


def check_abort_lock(store) -> list[Finding]:
    out: list[Finding] = []
    root = store.root
    if store.abort_present:
        p = store.path("abort")
        try:
            content = read_regular(p, 64).decode("ascii", "replace").strip()
        except (OSError, StoreError):
            content = ""
        who = f" (PID {content})" if content.isdigit() else ""
        out.append(Finding(WARNING, "abort_present", "abort", None,
                           f"abort file present{who}: the previous broker run did not shut down cleanly; the next "
                           "start runs abnormal recovery"))
    bak = root / "abort.bak"
    if bak.is_file():
        try:
            content = bak.read_bytes()[:64].decode("ascii", "replace").strip()
        except OSError:
            content = ""
        if content:
            out.append(Finding(INFO, "abort_bak", "abort.bak", None,
                               f"abort.bak holds PID {content}: a 5.x broker crashed before its last start"))
    if store.path("lock") is not None:
        from rmqdump.broker.lock import probe_lock

        try:
            pid = probe_lock(root)
        except RmqdumpError as e:
            out.append(Finding(WARNING, "lock_unreadable", "lock", None, e.message))
            pid = None
        if pid is not None:
            out.append(Finding(WARNING, "store_in_use", "lock", 0,
                               f"the broker lock is held by PID {pid}: the store is live and may change under us"))
    return out
