"""Repair a damaged store before the broker's recovery throws data away (spec §8.1, §9, §10, §11).

:func:`plan_repair` reads the store (nothing is written) and says what to change so the
store ends where the broker's own recovery would end it (:mod:`rmqdump.broker.recovery`), with
the same consume queues and a consistent index — minus the losses the broker would cause:
intact records after damage in the middle can be kept (``salvage="filler"``: a damaged record
a ConsumeQueue entry points at becomes a tombstone of its own topic, queue and queue offset; other
damaged bytes become ROLLBACK filler records or an end-of-file BLANK), index entries are rebuilt
from the commitlog instead of deleting the index file, and records the dispatch had not
caught up with get their ConsumeQueue and index entries.

Every change is a per-file final state (:class:`Change`: ``write`` byte ranges,
``create`` a file, ``delete`` a file); changes never overlap. :func:`apply_plan` copies
every byte range and file it will change into a backup directory with a manifest (sha256
before/after) *before* changing anything, holds the broker's lock and the ``abort``
marker while writing, and fsyncs data, then metadata, then directories.
:func:`undo_backup` restores the store byte for byte and verifies the sha256s.
"""

from rmqdump.write.repair.apply import (  # noqa: F401
    ApplyResult,
    _apply_change,
    _backup_changes,
    _guard,
    _missing_dirs,
    _safe_target,
    _set_abort,
    _write_blob,
    _write_manifest,
    apply_plan,
    default_backup_dir,
    read_manifest,
)
from rmqdump.write.repair.files import (  # noqa: F401
    _blank,
    _copy_extents,
    _merge_units,
    _nonzero_pieces,
    _open,
    _pread_all,
    _pwrite_all,
    _size,
    _writes_from_overlay,
    _zero_sha,
    diff_files,
    sha256_file,
    sha256_range,
)
from rmqdump.write.repair.index import (  # noqa: F401
    _entries_at_phy,
    _fix_first_time_diff,
    _full_index_end_ts,
    _index_changes,
    _index_consistent,
    _index_keys_of,
    _rebuild_index_changes,
    _record_start_at_or_after,
    build_index_files,
)
from rmqdump.write.repair.model import (  # noqa: F401
    _CHUNK,
    MANIFEST,
    MANIFEST_FORMAT,
    MIN_FILLER,
    SALVAGE_CHOICES,
    Change,
    RepairPlan,
)
from rmqdump.write.repair.plan import (  # noqa: F401
    _checkpoint_change,
    plan_repair,
    rebuild_to,
)
from rmqdump.write.repair.queues import (  # noqa: F401
    _cq_changes,
    _cq_extent,
    _QueueEdit,
    _rebuild_cq_changes,
    _topic_alive,
    _unloaded_files,
    dispatch_targets,
    rebuild_consume_queues,
)
from rmqdump.write.repair.salvage import (  # noqa: F401
    TailItem,
    _entries_into,
    _filler_outcome,
    _recrc,
    _regrow_plan,
    _salvage_choices,
    _span_pieces,
    _store_ts_before,
    _tombstone_properties,
    analyse_tail,
    filler_record,
    tombstone_record,
)
from rmqdump.write.repair.undo import UndoResult, undo_backup  # noqa: F401

__all__ = ["Change", "RepairPlan", "plan_repair", "apply_plan", "undo_backup", "read_manifest", "rebuild_to",
           "rebuild_consume_queues", "build_index_files", "filler_record", "analyse_tail", "SALVAGE_CHOICES",
           "MIN_FILLER", "ApplyResult", "UndoResult"]
