"""The benchmark suite in its tiny mode: it runs end to end and prints every row (no timing checks)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REPO


def test_bench_quick_produces_every_row(tmp_path):
    sys.path.insert(0, str(REPO))
    try:
        from bench.run import ROWS
    finally:
        sys.path.remove(str(REPO))
    out = tmp_path / "rows.json"
    res = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--silent", "--data", str(tmp_path / "data"),
         "--out", str(tmp_path / "out"), "--skip", "spark", "--json", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert res.returncode == 0, res.stderr[-3000:]
    table = [line for line in res.stdout.splitlines() if line.startswith("| ")]
    assert len(table) == 1 + len(ROWS)  # header + one line per benchmark
    doc = json.loads(out.read_text())
    rows = {r["key"]: r for r in doc["rows"]}
    assert list(rows) == [k for k, _, _ in ROWS]
    for key, row in rows.items():
        assert row["result"], key
        assert not row["result"].startswith("error"), (key, row["result"])
        if row["result"] in ("pass", "FAIL", "info"):
            assert row["figure"], key  # a measured row shows its figure
    assert rows["spark_per_core"]["result"] == "skipped"
    # the stores were generated with the encoder and walk cleanly to their BLANKs
    from rmqdump.codec.record import Blank
    from rmqdump.store.commitlog import CommitLog

    w = CommitLog.open(tmp_path / "data" / "rec128").walk()
    recs = list(w)
    assert isinstance(recs[-1], Blank) and w.stop.kind == "end_of_data" and w.records > 1000
    assert doc["facts"]["cpu"]
