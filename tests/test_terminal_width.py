"""Tables fit the terminal: the real CLI on a real pseudo-terminal 80, 120 and 200 columns wide.

Every command that prints a table runs on the bundled fixtures with stdout on a pty whose window
size (TIOCSWINSZ) and COLUMNS say the width, stderr in a file (the diagnostics). On every run: no
stdout line is wider than the terminal; no header is cut to ``…``; a column the width could not hold
is named (``hidden at N columns: ...``), never silently dropped; every record's full offset is
printed; and, where the table is a record stream, each cell sits under its own header (compared
with the same command's ``-f jsonl``), so a queue offset can never read as a queue id.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from ptyrun import run_on_pty
from rich.cells import cell_len

from conftest import REPO
from rmqdump.cli.output import escape_control

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="pty window sizes checked on Linux")

RMQDUMP = [sys.executable, "-c", "import sys; from rmqdump.cli import main; sys.argv[0] = 'rmqdump'; main()"]
STORE = "fixtures/store"
DAMAGED = "fixtures/oracle/498-flip-body-mid/store"
NOW = "2026-11-01T01:00:00Z"
WIDTHS = (80, 120, 200)
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)")
HIDDEN = re.compile(r"hidden at (\d+) columns: (.*?) \(a wider terminal or (-f jsonl|-f json) shows them\)")


def on_terminal(args: list[str], width: int, timeout: float = 120.0) -> tuple[int | None, list[str], str]:
    """Run ``rmqdump ARGS`` from the repository root with stdout on a ``width``-column pty:
    (exit code, stdout lines without colour codes, stderr)."""
    rc, out, stderr = run_on_pty([*RMQDUMP, *args], width=width, timeout=timeout, cwd=REPO, stderr_on_pty=False)
    text = ANSI.sub("", out).replace("\r\n", "\n")
    return rc, text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"), stderr


def piped_jsonl(args: list[str]) -> list[dict]:
    r = subprocess.run([*RMQDUMP, *args, "-f", "jsonl"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode in (0, 1), r.stderr
    return [json.loads(x) for x in r.stdout.splitlines()]


def hidden_columns(lines: list[str], stderr: str, width: int) -> list[str]:
    found = HIDDEN.findall("\n".join(lines) + "\n" + stderr)
    assert len(found) <= 1, found
    if not found:
        return []
    assert int(found[0][0]) == width
    return found[0][1].split(", ")


def header_line(lines: list[str], first: str) -> int:
    idx = [n for n, line in enumerate(lines) if line.startswith(first + " ") or line == first]
    assert idx, f"no header starting with {first!r}:\n" + "\n".join(lines[:20])
    return idx[0]


def check_fits(lines: list[str], width: int) -> None:
    wide = [(cell_len(line), line) for line in lines if cell_len(line) > width]
    assert not wide, f"{len(wide)} lines wider than {width} columns, e.g. {wide[0]}"


def check_headers(lines: list[str], at: int, headers: list[str], hidden: list[str]) -> list[str]:
    """Every header is whole on the header line or named as hidden; returns the shown ones in order."""
    head = lines[at]
    assert "…" not in head, f"a header was cut: {head!r}"
    shown = [h for h in headers if re.search(rf"(^|  ){re.escape(h)}(  |$)", head)]
    under = []  # columns whose cells go on their own indented line under the row
    for line in lines[at + 1:]:
        if not (line.startswith("    ") and line.strip() in headers):
            break
        under.append(line.strip())
    assert sorted(shown + under + hidden) == sorted(headers), (head, under, hidden)
    return shown


def _slice(line: str, a: int, b: int | None) -> str:
    """The characters of ``line`` starting in terminal cells [a, b) (wide characters take two)."""
    out, col = [], 0
    for ch in line:
        if col >= a and (b is None or col < b):
            out.append(ch)
        col += cell_len(ch)
    return "".join(out)


def cells(line: str, head: str, shown: list[str]) -> dict[str, str]:
    """A left-aligned row cut at its header's column starts."""
    starts = [cell_len(head[:re.search(rf"(?:^|(?<=  )){re.escape(h)}(?=  |$)", head).start()]) for h in shown]
    assert starts == sorted(starts)
    bounds = list(zip(starts, starts[1:] + [None], strict=True))
    return {h: _slice(line, a, b).strip() for h, (a, b) in zip(shown, bounds, strict=True)}


def same_value(cell: str, value) -> bool:
    text = escape_control("-" if value is None else " ".join(map(str, value)) if isinstance(value, list) else str(value))
    return cell == text or (cell.endswith("…") and len(cell) > 1 and text.startswith(cell[:-1].rstrip()))


#: record tables: (id, args, headers in order, {header: jsonl field} checked cell by cell)
RECORD_RUNS = [
    ("scan", ["scan", STORE, "--body", "text"],
     ["OFFSET", "TOPIC", "Q", "QOFF", "STORE TIME (UTC)", "TAGS", "KEYS", "SIZE", "BODY"],
     {"OFFSET": "offset", "TOPIC": "topic", "Q": "queue_id", "QOFF": "queue_offset", "SIZE": "size",
      "TAGS": "tags", "KEYS": "keys", "BODY": "body"}),
    ("scan-default", ["scan", STORE],
     ["OFFSET", "TOPIC", "Q", "QOFF", "STORE TIME (UTC)", "TAGS", "KEYS", "SIZE"],
     {"OFFSET": "offset", "TOPIC": "topic", "Q": "queue_id", "QOFF": "queue_offset", "SIZE": "size"}),
    ("scan-resolve", ["scan", STORE, "--resolve", "--topic", "TopicDelay", "--topic", "TopicTx", "--body", "text"],
     ["OFFSET", "TOPIC", "Q", "QOFF", "STORE TIME (UTC)", "TAGS", "KEYS", "SIZE", "BODY", "RESOLVED DESTINATION"],
     {"OFFSET": "offset", "TOPIC": "topic", "Q": "queue_id", "QOFF": "queue_offset", "SIZE": "size"}),
    ("lookup", ["lookup", STORE, "--key", "v6-key", "--body", "text"],
     ["OFFSET", "TOPIC", "Q", "QOFF", "STORE TIME (UTC)", "TAGS", "KEYS", "SIZE", "BODY"],
     {"OFFSET": "offset", "TOPIC": "topic", "Q": "queue_id", "QOFF": "queue_offset", "SIZE": "size"}),
    ("unconsumed", ["consumers", STORE, "--unconsumed", "--body", "text"],
     ["GROUP", "TOPIC", "Q", "QOFF", "OFFSET", "STORE TIME (UTC)", "TAGS", "KEYS", "BODY"],
     {"GROUP": "group", "OFFSET": "offset", "TOPIC": "topic", "Q": "queue_id", "QOFF": "queue_offset"}),
    ("cq-entries", ["cq", STORE, "--topic", "TopicTest", "--queue", "1"],
     ["TOPIC", "Q", "QOFF", "OFFSET", "SIZE", "TAGSCODE", "STATUS", "FILE"],
     {"QOFF": "queue_offset", "OFFSET": "commit_log_offset", "SIZE": "size", "TAGSCODE": "tags_code",
      "STATUS": "status", "FILE": "file", "Q": "queue_id"}),
    ("index-entries", ["index", STORE, "--entries"],
     ["FILE", "ENTRY", "KEYHASH", "SLOT", "PHY OFFSET", "TIMEDIFF", "TIME", "PREV"],
     {"FILE": "file", "ENTRY": "number", "KEYHASH": "key_hash", "SLOT": "slot", "PHY OFFSET": "phy_offset",
      "TIMEDIFF": "time_diff", "TIME": "time", "PREV": "prev_index"}),
    ("pending", ["pending", STORE, "--all", "--now", NOW],
     ["KIND", "STATE", "TOPIC", "Q", "QOFF", "OFFSET", "REAL TOPIC/Q", "LVL", "DUE (UTC)", "KEYS", "DETAIL"],
     {"KIND": "kind", "STATE": "state", "OFFSET": "offset", "Q": "queue_id", "QOFF": "queue_offset",
      "LVL": "level", "TOPIC": "topic"}),
    ("consumers", ["consumers", STORE],
     ["GROUP", "TOPIC", "Q", "COMMITTED", "MIN", "MAX", "LAG", "DELETED", "AT RISK", "NOTE"],
     {"GROUP": "group", "TOPIC": "topic", "Q": "queue_id", "COMMITTED": "committed", "MIN": "min_offset",
      "MAX": "max_offset", "LAG": "lag", "DELETED": "deleted", "AT RISK": "at_risk"}),
]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("name,args,headers,fields", RECORD_RUNS, ids=[r[0] for r in RECORD_RUNS])
def test_record_tables_fit_and_keep_every_value_under_its_header(name, args, headers, fields, width):
    expected = piped_jsonl(args)
    assert expected, "the run must print records"
    rc, lines, stderr = on_terminal(args, width)
    assert rc in (0, 1) and "Traceback" not in stderr, stderr
    check_fits(lines, width)
    hidden = hidden_columns(lines, stderr, width)
    at = header_line(lines, headers[0])
    shown = check_headers(lines, at, headers, hidden)
    assert {"OFFSET", "PHY OFFSET"} & set(headers) <= set(shown), f"the offset column was hidden: {hidden}"
    if width == 200:
        assert not hidden, f"a 200-column terminal hid {hidden}"
    rows = [line for line in lines[at + 1:] if line and not line.startswith(" ") and not HIDDEN.search(line)]
    assert len(rows) == len(expected), "\n".join(lines[:40])
    for line, rec in zip(rows, expected, strict=True):
        got = cells(line, lines[at], shown)
        for header, key in fields.items():
            if header in got:
                assert same_value(got[header], rec[key]), f"{header} shows {got[header]!r}, record has {rec[key]!r}"
    for off in (r.get("offset", r.get("commit_log_offset", r.get("phy_offset"))) for r in expected):
        if off is not None:
            assert re.search(rf"(?<![\d.]){off}(?![\d.])", "\n".join(rows)), f"offset {off} not printed whole"


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("store", [DAMAGED, "fixtures/oracle/498-cq-hole/store"])
def test_verify_findings_stay_readable(store, width):
    r = subprocess.run([*RMQDUMP, "verify", store, "-f", "json"], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    findings = json.loads(r.stdout)["findings"]
    assert findings
    rc, lines, stderr = on_terminal(["verify", store], width)
    assert rc == r.returncode and "Traceback" not in stderr, stderr
    check_fits(lines, width)
    assert not hidden_columns(lines, stderr, width)
    heads = [n for n, line in enumerate(lines) if line.startswith("LOCATION ")]
    assert heads, "\n".join(lines)
    for n in heads:
        assert "…" not in lines[n] and re.match(r"LOCATION +KIND( +DETAIL)?$", lines[n]), lines[n]
        if "DETAIL" not in lines[n]:  # the detail goes on its own line under its row
            assert lines[n + 1].strip() == "DETAIL" and lines[n + 1].startswith("    ")
    text = _words("\n".join(lines))
    for f in findings:
        where = (f["file"] or "-") + (f":{f['offset']}" if f["offset"] is not None else "")
        assert re.search(rf"^{re.escape(where)}  +{re.escape(f['kind'])}( |$)", "\n".join(lines), re.M), where
        assert _words(f["detail"]) in text, f"detail not shown whole: {f['detail']!r}"
    if width == 80 and store == DAMAGED:
        assert len(lines) <= 60, f"{len(lines)} lines at 80 columns"


REPORT_HEADERS = {
    "stats": ["topic", "records", "share", "bytes", "body bytes"],
    "cq": ["topic", "queue", "files", "min offset", "max offset", "entries", "max physic offset"],
    "index": ["chain length", "slots"],
}


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("cmd", sorted(REPORT_HEADERS))
def test_report_tables_fit(cmd, width):
    rc, lines, stderr = on_terminal([cmd, STORE], width)
    assert rc in (0, 1) and "Traceback" not in stderr, stderr
    check_fits(lines, width)
    assert not hidden_columns(lines, stderr, width)
    headers = REPORT_HEADERS[cmd]
    head = [line for line in lines if re.match(rf" *{headers[0]}  ", line)]
    assert head, "\n".join(lines[:20])
    assert all(re.search(rf"(^| ){re.escape(h)}( |$)", head[0]) for h in headers), head[0]  # whole, one line
    assert not any("…" in line for line in head), head
    text = "\n".join(lines)
    if cmd == "cq":
        doc = json.loads(subprocess.run([*RMQDUMP, "cq", STORE, "-f", "json"], cwd=REPO, capture_output=True,
                                        text=True, timeout=60).stdout)
        for q in doc["queues"]:
            assert re.search(rf" {q['max_physic_offset']}(\s|$)", text), q
    if cmd == "stats":
        doc = json.loads(subprocess.run([*RMQDUMP, "stats", STORE, "-f", "json"], cwd=REPO, capture_output=True,
                                        text=True, timeout=60).stdout)
        for t in doc["topics"]:
            assert re.search(rf"^{re.escape(t['topic'])}  ", text, re.M), t["topic"]


def test_a_streamed_table_widens_for_longer_offsets(monkeypatch, capsys):
    """Rows arrive in chunks of 200: an offset longer than any in the first chunk is still printed whole,
    the free text gives way, the header stays once and the lines still fit."""
    import io

    from rich.console import Console

    from rmqdump.cli import output
    from rmqdump.cli.scan import TABLE_COLUMNS

    buf = io.StringIO()
    monkeypatch.setattr(output, "stdout_console", lambda: Console(file=buf, width=80, highlight=False))
    offsets = [i * 192 for i in range(200)] + [10**15 + i for i in range(250)]
    w = output.RecordWriter("table", ["offset"], TABLE_COLUMNS)
    for n, off in enumerate(offsets):
        w.write({"offset": off, "topic": "T" * 40, "queue_id": n % 4, "queue_offset": n, "size": 192,
                 "store_time": "2026-11-01T00:00:02.037Z", "tags": "TagA", "keys": "k" * 50})
    w.close()
    lines = buf.getvalue().splitlines()
    check_fits(lines, 80)
    heads = [n for n, line in enumerate(lines) if line.startswith("OFFSET ")]
    assert heads[0] == 0 and heads[1:] in ([], [201])  # again only where the columns change
    rows = [line for n, line in enumerate(lines) if n not in heads]
    assert [line.split()[0] for line in rows] == list(map(str, offsets))
    hidden = hidden_columns([], capsys.readouterr().err, 80)
    headers = [c.header for c in TABLE_COLUMNS]
    for n in heads:  # every column is shown or named as hidden
        assert "…" not in lines[n]
        shown = [h for h in headers if re.search(rf"(^|  ){re.escape(h)}(  |$)", lines[n])]
        assert set(shown) | set(hidden) == set(headers), (lines[n], hidden)


@pytest.mark.parametrize("width", WIDTHS)
def test_info_tables_fit(width):
    """info's consume-queue and index tables: within the width, headers whole on one line, every queue's
    numbers in full; what the width leaves out is named."""
    rc, lines, stderr = on_terminal(["info", STORE], width)
    assert rc == 0 and "Traceback" not in stderr, stderr
    check_fits(lines, width)
    text = "\n".join(lines)
    head = lines[header_line(lines, "topic")]
    assert all(re.search(rf"(^| ){re.escape(h)}( |$)", head) for h in REPORT_HEADERS["cq"]), head
    doc = json.loads(subprocess.run([*RMQDUMP, "info", STORE, "-f", "json"], cwd=REPO, capture_output=True,
                                    text=True, timeout=60).stdout)
    for q in doc["consume_queues"]["queues"]:
        assert re.search(rf" {q['max_physic_offset']}(\s|$)", text), q
    index_head = lines[header_line(lines, "file")]
    shown = {"begin", "end"} - set(hidden_columns(lines, stderr, width))
    assert all(h in index_head for h in ["file", "slots/entries", "phy offsets", "used slots", "entries", *shown])
    assert not any("…" in line for line in (head, index_head))
