"""The 5.x timer store (spec §13): ``timerlog/`` units, the ``timerwheel`` slots, ``config/timercheck`` and
``config/timermetrics``. Readers only; what the broker makes of them is :mod:`rmqdump.analysis.timer`."""

from rmqdump.store.timer.checkpoint import TimerCheckpoint, read_timer_checkpoint
from rmqdump.store.timer.log import LogStop, TimerLog, TimerLogFile, TimerUnit, decode_unit
from rmqdump.store.timer.metrics import TimerMetrics, load_timer_metrics, timer_metrics_load_fails
from rmqdump.store.timer.wheel import Slot, TimerWheelFile, decode_slot, read_wheel, slot_index

__all__ = ["LogStop", "Slot", "TimerCheckpoint", "TimerLog", "TimerLogFile", "TimerMetrics", "TimerUnit",
           "TimerWheelFile", "decode_slot", "decode_unit", "load_timer_metrics", "read_timer_checkpoint",
           "read_wheel", "slot_index", "timer_metrics_load_fails"]
