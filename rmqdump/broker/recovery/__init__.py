"""Predict what a RocketMQ broker's startup recovery would do to a store (spec §8.1, §9.8, §11).

Pure functions over the store as it is on disk; nothing is written. The default model is
the 4.9.x broker (checked against 4.9.8: ``DefaultMessageStore.load/recover``,
``CommitLog.recoverNormally/recoverAbnormally/checkMessageAndReturnSize``,
``MappedFileQueue.truncateDirtyFiles``, ``ConsumeQueue.recover/truncateDirtyLogicFiles``,
``IndexService.load``). ``version="5.3"`` models 5.3.2–5.3.3 where they differ: normal
recovery starts at the file holding the consume-queue maximum, the V2 magic is accepted, a
BLANK whose TOTALSIZE runs past the end of the file fails, a zero-length last file is deleted
at load and sub-directories are skipped.

Steps of :func:`predict_recovery`:

1. load: every commitlog file must have the store's file size and a numeric name, every
   consume-queue file its queue's size — otherwise the broker refuses to start;
2. mode: ``abnormal`` when the ``abort`` file exists, else ``normal``;
3. consume-queue recovery (third-from-last file, stop at the first invalid entry) →
   ``maxPhyOffsetOfConsumeQueue``;
4. start file: normal → third-from-last (4.9) or the file holding the CQ maximum (5.3);
   abnormal → newest file whose first record has the V1 magic and a store time ≠ 0 and
   ≤ checkpoint ``getMinTimestamp()`` (file 0 if none);
5. the walk with CRC checks: records advance, a BLANK moves to the next file, anything else
   stops → ``processOffset`` (the new commitlog end);
6. truncation: the file holding ``processOffset`` ends there, later files are deleted, and
   if ``maxPhyOffsetOfConsumeQueue >= processOffset`` every consume queue loses its entries
   at or after it;
7. re-dispatch (:mod:`rmqdump.broker.redispatch`): abnormal recovery hands every walked record to the
   consume queues (5.3.3's normal recovery those after ``maxPhyOffsetOfConsumeQueue``); queues
   gain the entries they lack;
8. abnormal only: index files whose endTimestamp > checkpoint indexMsgTimestamp are
   deleted, and the re-dispatch from the start file rebuilds entries only from there.

The inputs (model versions, checkpoint, load problems, start file) are in
:mod:`~rmqdump.broker.recovery.inputs`, the consume queues as recovery leaves them in
:mod:`~rmqdump.broker.recovery.queues`, the walk in :mod:`~rmqdump.broker.recovery.walk`, what the
truncation removes in :mod:`~rmqdump.broker.recovery.consequences`, the prediction put together in
:mod:`~rmqdump.broker.recovery.prediction`; their names are re-exported here.
"""

from __future__ import annotations

from rmqdump.broker.recovery.consequences import (
    DEFAULT_LIST_LIMIT,
    DroppedRecords,
    commitlog_truncation,
    dropped_records,
    index_deletions,
)
from rmqdump.broker.recovery.inputs import (
    VERSION_49,
    VERSION_53,
    VERSION_AUTO,
    VERSIONS,
    abnormal_start_index,
    first_record_store_timestamp,
    load_problems,
    normal_start_index,
    read_checkpoint_for_recovery,
)
from rmqdump.broker.recovery.prediction import (
    MODE_ABNORMAL,
    MODE_EMPTY,
    MODE_NORMAL,
    MODE_REFUSES,
    RecoveryPrediction,
    predict_recovery,
    predict_recovery_auto,
)
from rmqdump.broker.recovery.queues import (
    CqProblem,
    QueueState,
    QueueTruncation,
    consume_queue_states,
    cq_truncation,
    max_phy_offset_of_consume_queue,
)
from rmqdump.broker.recovery.walk import (
    BROKER_MAX_RECORD_SIZE,
    STOP_LAST_BLANK,
    STOP_NO_BLANK,
    STOP_V2_ON_49,
    BrokerWalk,
    broker_verdict,
    broker_walk,
    cut_short,
)
from rmqdump.codec.record import BAD_BLANK  # read as ``recovery.BAD_BLANK`` by the compiled walk's twin

__all__ = ["BAD_BLANK", "BROKER_MAX_RECORD_SIZE", "DEFAULT_LIST_LIMIT", "MODE_ABNORMAL", "MODE_EMPTY", "MODE_NORMAL",
           "MODE_REFUSES", "STOP_LAST_BLANK", "STOP_NO_BLANK", "STOP_V2_ON_49", "VERSIONS", "VERSION_49",
           "VERSION_53", "VERSION_AUTO", "BrokerWalk", "CqProblem", "DroppedRecords", "QueueState", "QueueTruncation",
           "RecoveryPrediction", "abnormal_start_index", "broker_verdict", "broker_walk", "commitlog_truncation",
           "consume_queue_states", "cq_truncation", "cut_short", "dropped_records", "first_record_store_timestamp",
           "index_deletions", "load_problems", "max_phy_offset_of_consume_queue", "normal_start_index",
           "predict_recovery", "predict_recovery_auto", "read_checkpoint_for_recovery"]
