"""References the bench measures beside rmqdump in the same run, from outside the project.

* ISA-L's ``crc32`` (``pip install isal``) over the same mapped bytes: the hardware's CRC pace;
* ``orjson`` encoding the rows ``scan -f jsonl`` prints (parsed back from its own output);
* pyarrow's ``write_table`` of the columns ``export`` wrote (read back from its Parquet file);
* RocketMQ 4.9.8's own ``DefaultMessageStore.load()`` (recovery, CRC on) over a copy of the store,
  through ``../shared/oracle/498``'s classpath and ``bench/java/LoadTime.java``.

Each returns ``None`` when its tool is missing, so a machine without them still runs the bench.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

ORACLE_498 = Path(__file__).resolve().parents[2] / "shared" / "oracle" / "498"
JAVA_SRC = Path(__file__).resolve().parent / "java" / "LoadTime.java"


def _best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(max(1, repeat)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def isal_crc_seconds(mm: mmap.mmap, repeat: int) -> float | None:
    """Best time of ISA-L's crc32 over ``mm`` (no copy), or None without the ``isal`` package."""
    try:
        from isal import isal_zlib
    except ImportError:
        return None
    return _best(lambda: isal_zlib.crc32(mm), repeat)


def orjson_rows_per_second(jsonl: bytes, repeat: int) -> tuple[float, int] | None:
    """Rows per second orjson encodes the rows of ``jsonl`` at (one line each, joined), and the row count."""
    try:
        import orjson
    except ImportError:
        return None
    rows = [json.loads(line) for line in jsonl.splitlines() if line]
    if not rows:
        return None
    dumps = orjson.dumps
    t = _best(lambda: b"\n".join([dumps(r) for r in rows]), repeat)
    return len(rows) / t, len(rows)


def write_table_rows_per_second(parquet: Path, out: Path, repeat: int) -> tuple[float, int] | None:
    """Rows per second pyarrow's ``write_table`` writes the table in ``parquet`` at (to ``out``)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        return None
    table = pq.read_table(parquet)
    t = _best(lambda: pq.write_table(table, out), repeat)
    out.unlink(missing_ok=True)
    return table.num_rows / t, table.num_rows


def _oracle_env() -> dict[str, str] | None:
    """CP and JOPTS as ``run_env.sh`` sets them, or None without the oracle or a JDK."""
    env_sh = ORACLE_498 / "run_env.sh"
    if not env_sh.is_file() or shutil.which("javac") is None or shutil.which("java") is None:
        return None
    out = subprocess.run(["bash", "-c", f'source "{env_sh}" && printf "%s\\n%s\\n%s" "$CP" "$JOPTS" '
                          '"${LD_LIBRARY_PATH:-}"'], capture_output=True, text=True, check=True).stdout
    cp, jopts, ld = out.split("\n")
    return {"CP": cp, "JOPTS": jopts, "LD_LIBRARY_PATH": ld}


def rocketmq_load_seconds(store: Path, work: Path, commitlog_file_size: int, cq_file_size: int,
                          repeat: int, log: Callable[[str], None] = print) -> tuple[float, float] | None:
    """RocketMQ 4.9.8's ``load()`` over a copy of ``store``: (best in-JVM seconds, best process wall seconds).

    The copy lives in ``work`` (made once per bench run: ``load()`` writes the checkpoint and lock).
    """
    env = _oracle_env()
    if env is None:
        return None
    classes = work / "java-classes"
    classes.mkdir(parents=True, exist_ok=True)
    subprocess.run(["javac", "-d", str(classes), "-cp", env["CP"], str(JAVA_SRC)], check=True,
                   capture_output=True)
    copy = work / f"rocketmq-load-{store.name}"
    if copy.exists():
        shutil.rmtree(copy)
    log(f"copying {store.name} for RocketMQ's load() ...")
    shutil.copytree(store, copy)
    run_env = dict(os.environ, LD_LIBRARY_PATH=env["LD_LIBRARY_PATH"], LC_ALL=os.environ.get("LC_ALL", "C.UTF-8"))
    cmd = ["java", *env["JOPTS"].split(), "-cp", f"{env['CP']}:{classes}", "LoadTime", str(copy),
           str(commitlog_file_size), str(cq_file_size)]
    best_load, best_wall = float("inf"), float("inf")
    try:
        for _ in range(max(1, repeat)):
            t0 = time.perf_counter()
            res = subprocess.run(cmd, capture_output=True, text=True, env=run_env, timeout=3600)
            wall = time.perf_counter() - t0
            m = re.search(r"load_ok=true load_ms=([0-9.]+)", res.stdout)
            if res.returncode != 0 or m is None:
                raise RuntimeError(f"LoadTime exited {res.returncode}: {res.stderr.strip()[-200:]}")
            best_load, best_wall = min(best_load, float(m.group(1)) / 1e3), min(best_wall, wall)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    return best_load, best_wall
