"""The timer fixture's wheel (``fixtures/oracle/533-timer``): a ``timerwheel`` file is 38,707,200 bytes
whatever the settings and almost all zeros, so the fixture keeps only its non-zero 32-byte slots
(``timerwheel.slots.jsonl``: ``{"index": i, "hex": "..."}`` per slot) and tests rebuild the file (sparse).

Usage: ``python scripts/timer_wheel_fixture.py strip STORE SLOTS.jsonl`` (after ``make_oracle_fixtures.py
533-timer``: writes the slots, deletes STORE/timerwheel) or ``rebuild SLOTS.jsonl WHEEL`` (writes the file).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

WHEEL_SIZE = 2 * 7 * 86400 * 32  # TimerWheel: slotsTotal * 2 * Slot.SIZE
SLOT = 32


def strip(store: Path, slots: Path) -> int:
    """Write the non-zero slots of ``store/timerwheel`` to ``slots`` and delete the wheel; returns the count."""
    wheel = store / "timerwheel"
    data = wheel.read_bytes()
    assert len(data) == WHEEL_SIZE, f"{wheel}: {len(data)} bytes"
    lines = [json.dumps({"index": i // SLOT, "hex": data[i:i + SLOT].hex()})
             for i in range(0, len(data), SLOT) if data[i:i + SLOT] != bytes(SLOT)]
    slots.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    wheel.unlink()
    return len(lines)


def rebuild(slots: Path, wheel: Path) -> Path:
    """The wheel file from ``slots``: 38,707,200 bytes, sparse where the file system allows."""
    with open(wheel, "wb") as f:
        f.truncate(WHEEL_SIZE)
        for line in slots.read_text(encoding="utf-8").splitlines():
            if line.strip():
                s = json.loads(line)
                f.seek(s["index"] * SLOT)
                f.write(bytes.fromhex(s["hex"]))
    return wheel


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "strip":
        print(f"{strip(Path(argv[1]), Path(argv[2]))} non-zero slots kept")
        return 0
    if len(argv) == 3 and argv[0] == "rebuild":
        rebuild(Path(argv[1]), Path(argv[2]))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
