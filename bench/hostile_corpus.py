"""Issue 16's hostile corpus, measured: every read command on crafted and sparse stores vs a clean one.

Inputs (one geometry: 64 MiB segments, so the compiled engine is the default path):

* ``clean``         - two segments of records written by :class:`StoreWriter` (ConsumeQueue, index,
  config with consumer offsets): the baseline;
* ``crafted``       - the clean store with an 8 MiB window of overlapping, structurally valid candidate
  records (V1 magic, PHYSICALOFFSET = position, 4 MiB TOTALSIZE, consistent lengths, wrong BODYCRC)
  in the middle of its first segment;
* ``sparse-segment`` - the clean store with its last segment extended to a 4 GiB sparse file;
* ``sparse-config`` - the clean store with ``config/topics.json`` extended to a 600 MiB sparse file.

Each command runs as a fresh process under ``/usr/bin/time``: wall time (best of ``--repeat``) and peak
RSS. The ratio is time per byte of data (allocated bytes, not apparent size) relative to the clean
store. Run: ``python -m bench.hostile_corpus [--dir DIR] [--repeat 2]``; prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from rmqdump.codec.layout import MESSAGE_MAGIC_CODE, RECORD_FIXED_V4V4
from rmqdump.write.writer import MessageSpec, StoreWriter

SEGMENT = 64 << 20
RECORDS = 52_000
WINDOW = (16 << 20, 8 << 20)  # crafted candidates: start, length (inside the first segment)
TOPIC = "H"
COMMANDS = {
    "verify": ["verify", "{s}", "-f", "json"],
    "scan": ["scan", "{s}", "-f", "jsonl"],
    "stats": ["stats", "{s}", "-f", "json"],
    "pending": ["pending", "{s}", "-f", "json"],
    "lookup --key": ["lookup", "{s}", "--key", "k-4242", "--topic", TOPIC, "-f", "jsonl"],
    "consumers": ["consumers", "{s}", "-f", "json"],
    "info": ["info", "{s}", "-f", "json"],
    "repair (dry run)": ["repair", "{s}", "-f", "json"],
    "export": ["export", "{s}", "--to", "{out}", "--format", "jsonl", "--overwrite"],
    "verify --keep-going": ["verify", "{s}", "--keep-going", "-f", "json"],
    "scan --keep-going": ["scan", "{s}", "--keep-going", "-f", "jsonl"],
}


def build_clean(root: Path) -> None:
    with StoreWriter(root, commitlog_file_size=SEGMENT, cq_file_size=300_000 * 20, index_slots=50_000,
                     index_entries=200_000) as w:
        for i in range(RECORDS):
            body = (b"hostile corpus baseline %d " % i) * (1 + i % 100)
            w.append(MessageSpec(TOPIC, body[:2000], queue_id=i % 4, tags=f"t{i % 7}", keys=f"k-{i}"))
        w.sync()
    cfg = root / "config"
    cfg.mkdir()
    (cfg / "topics.json").write_text('{"topicConfigTable":{"H":{"topicName":"H","readQueueNums":4,'
                                     '"writeQueueNums":4,"perm":6}},"dataVersion":{"counter":1,"timestamp":0}}')
    (cfg / "consumerOffset.json").write_text('{"offsetTable":{"H@g1":{0:100,1:2000,2:9000,3:12000}}}')
    (cfg / "subscriptionGroup.json").write_text('{"subscriptionGroupTable":{"g1":{"groupName":"g1"}}}')


def craft(store: Path, start: int, length: int, spacing: int = 128, claimed: int = 4 << 20) -> None:
    """Overwrite [start, start + length) of the first segment with overlapping candidates."""
    seg = store / "commitlog" / f"{0:020d}"
    blen = claimed - RECORD_FIXED_V4V4.size - 1 - 2
    buf = bytearray(length)
    for pos in range(0, length - RECORD_FIXED_V4V4.size, spacing):
        RECORD_FIXED_V4V4.pack_into(buf, pos, claimed, MESSAGE_MAGIC_CODE, 12345, 0, 0, 0, start + pos, 0, 0,
                                    b"\x7f\0\0\1", 1, 0, b"\x7f\0\0\1", 2, 0, 0, blen)
    with open(seg, "r+b") as f:
        f.seek(start)
        f.write(buf)


def make_corpus(base: Path) -> dict[str, Path]:
    stores = {name: base / name for name in ("clean", "crafted", "sparse-segment", "sparse-config")}
    built = base / "built"
    if not (built / "commitlog").is_dir():
        shutil.rmtree(built, ignore_errors=True)
        build_clean(built)
    for name, path in stores.items():
        if path.exists():
            continue
        shutil.copytree(built, path)  # every input a copy: the same allocation as the baseline
        if name == "crafted":
            craft(path, *WINDOW)
        elif name == "sparse-segment":
            os.truncate(sorted((path / "commitlog").iterdir())[-1], 4 << 30)
        elif name == "sparse-config":
            os.truncate(path / "config" / "topics.json", 600 << 20)
    return stores


def data_bytes(root: Path) -> int:
    return sum(p.stat().st_blocks * 512 for p in root.rglob("*") if p.is_file())


def measure(argv: list[str], tmp: Path) -> tuple[float, int, int]:
    """(seconds, peak RSS KiB, exit code) of one fresh ``rmqdump`` process."""
    out = tmp / "time.txt"
    cmd = ["/usr/bin/time", "-o", str(out), "-f", "%e %M", sys.executable, "-m", "rmqdump.cli", *argv]
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=3600)
    sec, rss = out.read_text().split()[-2:]
    if "Traceback" in p.stderr.decode("utf-8", "replace"):
        raise SystemExit(f"traceback: rmqdump {' '.join(argv)}\n{p.stderr.decode()[-2000:]}")
    return float(sec), int(rss), p.returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=Path(__file__).resolve().parent / "data" / "hostile")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    stores = make_corpus(args.dir)
    sizes = {name: data_bytes(p) for name, p in stores.items()}
    print("| command | input | data MB | exit | seconds | s/byte vs clean | peak RSS MB |")
    print("|---|---|---|---|---|---|---|")
    worst = (0.0, 0)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for cmd, template in COMMANDS.items():
            clean_rate = None
            for name, path in stores.items():
                argv = [a.replace("{s}", str(path)).replace("{out}", str(tmp / "out.jsonl")) for a in template]
                runs = [measure(argv, tmp) for _ in range(args.repeat)]
                sec = min(r[0] for r in runs)
                rss = max(r[1] for r in runs) / 1024
                rate = sec / sizes[name]
                clean_rate = clean_rate or rate
                ratio = rate / clean_rate
                worst = (max(worst[0], ratio), max(worst[1], rss))
                print(f"| {cmd} | {name} | {sizes[name] / 1e6:.0f} | {runs[0][2]} | {sec:.2f} | {ratio:.2f} | "
                      f"{rss:.0f} |", flush=True)
    print(f"\nworst ratio {worst[0]:.2f} (bar: 3), worst peak RSS {worst[1]:.0f} MB (bar: 200)")


if __name__ == "__main__":
    main()
