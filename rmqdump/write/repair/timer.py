"""What a repair leaves the 5.x timer store pointing at: it does not rewrite ``timerlog`` yet, so it says so."""

from __future__ import annotations

from pathlib import Path

from rmqdump.codec.layout import STORE_TIMERLOG_DIR
from rmqdump.errors import RmqdumpError


def timer_warnings(root: Path, end: int, neutralised: list[tuple[int, int]]) -> list[str]:
    """A warning when timerlog units point at records past the repaired end or at bytes the repair replaces
    (apache/rocketmq #10668: the broker's timer cannot deliver those; ``rmqdump timer`` lists the pending ones)."""
    from rmqdump.store.timer.log import TimerLog

    d = root / STORE_TIMERLOG_DIR
    if not d.is_dir():
        return []
    past = replaced = 0
    try:
        for _f, units, _stop in TimerLog.open(d).walk():
            for u in units:
                if u.delete:
                    continue
                if u.offset_py >= end:
                    past += 1
                elif any(a <= u.offset_py < b for a, b in neutralised):
                    replaced += 1
    except RmqdumpError as e:
        return [f"timerlog: unreadable ({e.message}); the timer store is not checked against this repair"]
    if not past and not replaced:
        return []
    what = " and ".join(x for x in (f"{past} past the repaired end {end}" if past else "",
                                     f"{replaced} at records this repair replaces" if replaced else "") if x)
    return [f"timerlog: {what} ({past + replaced} unit(s), delivered or not): rmqdump repair does not rewrite the "
            "timer store, and the broker's timer cannot deliver those still pending (apache/rocketmq #10668); "
            "`rmqdump timer` lists them after the repair"]
