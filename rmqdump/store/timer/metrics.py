"""``config/timermetrics`` (``TimerMetrics``, a ``ConfigManager``: fastjson, ``.bak`` fallback):
``timingCount``, per real topic the number of timer messages the broker counts as waiting."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rmqdump.codec.layout import STORE_CONFIG_DIR, TIMER_METRICS_FILE
from rmqdump.errors import FormatError
from rmqdump.store.config import load_config_file, load_fails


@dataclass
class TimerMetrics:
    """``timingCount``: topic -> (count, timeStamp); ``path`` the file that was used."""

    counts: dict[str, int] = field(default_factory=dict)
    stamps: dict[str, int] = field(default_factory=dict)
    path: Path | None = None
    used_backup: bool = False


def _decode(value: Any, file: Path) -> TimerMetrics:
    if not isinstance(value, dict):
        raise FormatError("timer metrics is not a JSON object", file)
    tc = value.get("timingCount") or {}
    if not isinstance(tc, dict):
        raise FormatError("timingCount is not an object", file)
    m = TimerMetrics()
    for topic, metric in tc.items():
        if not isinstance(metric, dict) or not isinstance(metric.get("count", 0), int):
            raise FormatError(f"timingCount[{topic!r}] is not {{count, timeStamp}}", file)
        m.counts[str(topic)] = int(metric.get("count", 0))
        stamp = metric.get("timeStamp", 0)
        m.stamps[str(topic)] = stamp if isinstance(stamp, int) else 0
    return m


def load_timer_metrics(store_root: str | os.PathLike) -> TimerMetrics | None:
    """``TimerMetrics.load``: the main file, else its ``.bak``; None when neither exists."""
    loaded = load_config_file(Path(store_root) / STORE_CONFIG_DIR / TIMER_METRICS_FILE, _decode)
    if loaded.data is None:
        return None
    loaded.data.path, loaded.data.used_backup = loaded.path, loaded.used_backup
    return loaded.data


def timer_metrics_load_fails(store_root: str | os.PathLike) -> bool:
    """Whether ``TimerMetrics.load`` (a ``ConfigManager``) returns false: the broker does not start."""
    return load_fails(Path(store_root) / STORE_CONFIG_DIR / TIMER_METRICS_FILE, _decode)


__all__ = ["TimerMetrics", "load_timer_metrics", "timer_metrics_load_fails"]
