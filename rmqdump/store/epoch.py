"""Controller-mode HA metadata (5.x ``enableControllerMode``): ``epochFileCheckpoint`` (+ ``.bak``) and
``brokerIdentity``, at the store root.

``epochFileCheckpoint`` is RocketMQ 5.3.3's ``CheckpointFile`` of ``EpochFileCache`` entries, text: line 1 the
entry count, line 2 ``UtilAll.crc32`` (CRC-32 masked with 0x7FFFFFFF; 0 = not checked) of the entry lines, each
followed by a line separator, then one ``epoch-startOffset`` line per epoch in epoch order. An epoch ends where
the next starts; the file gives no end for the last one (the broker keeps it in memory). Writes go through
``MixAll.string2File``, which leaves the previous content in ``.bak``. ``CheckpointFile.read`` falls back to the
``.bak`` when the file yields no entry or throws an ``IOException`` (count or CRC mismatch); a count, CRC or
number that does not parse throws ``NumberFormatException``, which is not retried.

``brokerIdentity`` (``BrokerMetadata``, also via ``string2File``): ``clusterName#brokerName#brokerId``;
``brokerIdentity-temp`` (``TempBrokerMetadata``) adds ``#registerCheckCode``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.crc import body_crc
from rmqdump.disk.fileio import open_read

EPOCH_FILE = "epochFileCheckpoint"
BROKER_IDENTITY = "brokerIdentity"
_MAX_BYTES = 1 << 20  # a real epoch file holds a line per leader change


@dataclass
class Epoch:
    epoch: int
    start_offset: int
    end_offset: int | None  # the next epoch's start; None for the last (not in the file)


@dataclass
class EpochFile:
    """One epoch checkpoint file as ``CheckpointFile.read(path)`` sees it."""

    path: Path
    count: int | None = None  # line 1
    crc: int | None = None  # line 2 (0: not checked)
    crc_actual: int = 0  # over the entry lines, as the reader re-joins them
    entries: list[Epoch] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # lines fromLine turns into null (not "a-b")
    io_error: str | None = None  # an IOException: the broker then reads the .bak
    fatal: str | None = None  # a NumberFormatException: the broker's read fails, the .bak is not tried

    @property
    def ok(self) -> bool:
        return self.io_error is None and self.fatal is None


def _java_lines(text: str) -> list[str]:
    """``BufferedReader.readLine`` lines: \\n, \\r and \\r\\n end a line; no trailing empty line."""
    return text.replace("\r\n", "\n").replace("\r", "\n").split("\n")[:-1] if text else []


def _java_int(s: str | None, bits: int) -> int | None:
    """``Integer.parseInt``/``Long.parseLong``: optional sign and ASCII digits within range, else None."""
    if s is None or not s or not (s[1:] if s[0] in "+-" else s).isdigit() or not s.isascii() or s in "+-":
        return None
    v = int(s)
    return v if -(1 << (bits - 1)) <= v < (1 << (bits - 1)) else None


def parse_epoch_file(data: bytes, path: Path) -> EpochFile:
    """Decode an epoch checkpoint as RocketMQ's reader does (see the module docstring)."""
    f = EpochFile(path)
    text = data.decode("utf-8", errors="replace")
    lines = _java_lines(text + ("\n" if text and not text.endswith(("\n", "\r")) else ""))
    f.count = _java_int(lines[0] if lines else None, 32)
    if f.count is None:
        f.fatal = f"line 1 (entry count) {lines[0]!r} is not an int" if lines else "empty file: no entry count"
        return f
    f.crc = _java_int(lines[1] if len(lines) > 1 else None, 32)
    if f.crc is None:
        f.fatal = "line 2 (CRC32) is missing or not an int"
        return f
    body = lines[2:]
    f.crc_actual = body_crc("".join(line + "\n" for line in body).encode("utf-8"))
    for line in body:
        parts = line.split("-")
        while parts and parts[-1] == "":  # Java's split drops trailing empty strings
            parts.pop()
        if len(parts) != 2:
            f.skipped.append(line)
            continue
        epoch, start = _java_int(parts[0], 32), _java_int(parts[1], 64)
        if epoch is None or start is None:
            f.fatal = f"entry line {line!r} does not parse (NumberFormatException)"
            return f
        f.entries.append(Epoch(epoch, start, None))
    if len(f.entries) != f.count:
        f.io_error = f"expects {f.count} entries, holds {len(f.entries)}"
    elif f.crc != 0 and f.crc != f.crc_actual:
        f.io_error = f"CRC32 {f.crc} in the file, {f.crc_actual} computed over its entry lines"
    return f


def read_epoch_file(path: Path) -> EpochFile | None:
    """The file at ``path`` decoded, None when absent (an unreadable file is an ``io_error``)."""
    if not path.exists():
        return None
    try:
        fd = open_read(path)
    except OSError as e:
        return EpochFile(path, io_error=f"cannot open: {e.strerror}")
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(_MAX_BYTES + 1)
    if len(data) > _MAX_BYTES:
        return EpochFile(path, fatal=f"over {_MAX_BYTES} bytes: not an epoch checkpoint")
    return parse_epoch_file(data, path)


@dataclass
class Epochs:
    """The store's epoch files and the epochs the broker would load (``used``: which file, None if none)."""

    main: EpochFile | None
    bak: EpochFile | None
    used: EpochFile | None
    epochs: list[Epoch]
    load_error: str | None  # why the broker's initCacheFromFile fails (None: it loads)


def read_epochs(root: Path) -> Epochs | None:
    """``epochFileCheckpoint`` and its ``.bak`` under a store root, chosen as ``CheckpointFile.read`` chooses;
    None when neither exists."""
    main = read_epoch_file(root / EPOCH_FILE)
    bak = read_epoch_file(root / (EPOCH_FILE + ".bak"))
    if main is None and bak is None:
        return None
    used, error = main, None
    if main is not None and main.fatal:
        used, error = None, f"{EPOCH_FILE}: {main.fatal}"
    elif main is None or not main.ok or not main.entries:
        used = bak
        if bak is not None and bak.fatal:
            used, error = None, f"{EPOCH_FILE}.bak: {bak.fatal}"
        elif bak is not None and not bak.ok:
            used, error = None, f"{EPOCH_FILE}.bak: {bak.io_error}"
    entries = sorted(used.entries, key=lambda e: e.epoch) if used is not None else []  # a TreeMap by epoch
    epochs = [Epoch(e.epoch, e.start_offset, entries[i + 1].start_offset if i + 1 < len(entries) else None)
              for i, e in enumerate(entries)]
    return Epochs(main, bak, used, epochs, error)


def read_broker_identity(root: Path) -> dict | None:
    """``brokerIdentity`` (``clusterName#brokerName#brokerId``), None when absent."""
    p = root / BROKER_IDENTITY
    if not p.is_file():
        return None
    try:
        fd = open_read(p)
    except OSError as e:
        return {"file": str(p), "error": f"cannot open: {e.strerror}"}
    with os.fdopen(fd, "rb") as fh:
        text = fh.read(4096).decode("utf-8", errors="replace").strip()
    parts = text.split("#")
    if len(parts) < 3 or _java_int(parts[2], 64) is None:
        return {"file": str(p), "error": f"not clusterName#brokerName#brokerId: {text[:80]!r}"}
    return {"file": str(p), "cluster": parts[0], "broker_name": parts[1], "broker_id": int(parts[2])}
