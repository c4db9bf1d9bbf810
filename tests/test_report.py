"""`rmqdump report`: one self-contained HTML page whose numbers are verify's, stats' and consumers' own.

(a) without a browser: no external reference, hostile store strings escaped, the embedded documents and
every number shown (``data-key``/``data-value``) equal ``verify -f json``, ``stats -f json`` and
``consumers -f json`` on ``fixtures/store``, the damaged ``fixtures/oracle/498-flip-body-mid`` and a copy of
``fixtures/store`` whose first segment is gone (messages deleted before consumption); refusal inside the
store; atomic write. (b) in Debian's Chromium (skipped without it): the page loads without a console
message, its script ran (``data-check="ok"``) and the DOM shows the same numbers; a tampered number is caught.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from click.testing import CliRunner
from secutil import build_store, props

from conftest import FIXTURES
from rmqdump.analysis.report import collect, render
from rmqdump.cli import cli

STORE = FIXTURES / "store"
FLIPPED = FIXTURES / "oracle" / "498-flip-body-mid" / "store"  # bad_magic at 1862, body_crc at 2298
HOSTILE = "<script>alert(1)</script>"
HOSTILE_GROUP = "<img src=x onerror=alert(2)>"
CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                                             "(apt-get install -y chromium)")


class Page(HTMLParser):
    """The parts of a report page the tests read: the data block, numbers, findings rows, references."""

    def __init__(self, text: str):
        super().__init__()
        self.numbers: list[tuple[str, str, str]] = []  # (data-key, data-value, text shown)
        self.refs: list[str] = []
        self.findings: list[list[str]] = []
        self.html_attrs: dict = {}
        self.elements: list[str] = []
        self.data_text = ""
        self._open: list = []  # [key, value, text, tag] of numbers being read
        self._row: list[str] | None = None
        self._cell: str | None = None
        self._in_data = False
        self.feed(text)
        self.data = json.loads(self.data_text) if self.data_text else None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.elements.append(tag)
        if tag == "html":
            self.html_attrs = a
        for k in ("src", "href", "action", "xlink:href", "srcset", "poster", "data"):
            if k in a and tag != "span":
                self.refs.append(a[k] or "")
        if "data-key" in a:
            self._open.append([a["data-key"], a.get("data-value"), "", tag])
            if tag == "rect":  # SVG bars: the value is their attribute
                self.numbers.append(tuple(self._open.pop()[:2]) + (a.get("data-value"),))
        if tag == "script" and a.get("id") == "rmqdump-data":
            self._in_data = True
        if tag == "tr" and "finding" in (a.get("class") or ""):
            self._row = []
        if tag == "td" and self._row is not None:
            self._cell = ""

    def handle_endtag(self, tag):
        if tag == "span" and self._open and self._open[-1][3] == "span":
            k, v, t, _ = self._open.pop()
            self.numbers.append((k, v, t))
        if tag == "script":
            self._in_data = False
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row.append(self._cell)
            self._cell = None
        if tag == "tr" and self._row is not None:
            self.findings.append(self._row)
            self._row = None

    def handle_data(self, data):
        if self._in_data:
            self.data_text += data
        for o in self._open:
            o[2] += data
        if self._cell is not None:
            self._cell += data


def run_json(*args) -> tuple[int, object]:
    res = CliRunner().invoke(cli, [*args, "-f", "json", "-q"])
    assert res.exit_code in (0, 1), res.output
    return res.exit_code, json.loads(res.stdout)


def write(store: Path, to: Path) -> str:
    res = CliRunner().invoke(cli, ["report", str(store), "--to", str(to), "-q"])
    assert res.exit_code == 0, res.output
    return to.read_text(encoding="utf-8")


def resolve(docs: dict, key: str):
    cur = docs
    parts = key.split(".")
    for i, p in enumerate(parts):
        if p == "length" and isinstance(cur, list) and i == len(parts) - 1:
            return len(cur)
        cur = cur[int(p)] if isinstance(cur, list) else cur[p]
    return cur


def cli_docs(store: Path) -> dict:
    """What the three commands print, in the report's data layout."""
    vcode, v = run_json("verify", str(store))
    _, s = run_json("stats", str(store))
    res = CliRunner().invoke(cli, ["consumers", str(store), "-f", "json", "-q"])
    rows = json.loads(res.stdout) if res.exit_code == 0 else None
    return {"verify": v, "verify_exit_code": vcode, "stats": s, "consumers": {"rows": rows}}


def check_numbers(page: Page, docs: dict) -> int:
    """Every number shown equals the commands' documents (group sums: the rows' sums); returns how many."""
    assert page.numbers
    for key, value, shown in page.numbers:
        if key.startswith("consumers.groups."):
            _, _, i, field = key.split(".")
            g = page.data["consumers"]["groups"][int(i)]
            rows = [r for r in docs["consumers"]["rows"] if r["group"] == g["group"]]
            want = sum(max(r[field] or 0, 0) for r in rows)
        else:
            want = resolve(docs, key)
        want_s = "" if want is None else str(want)
        assert value == want_s, key
        assert shown.replace(",", "") in (want_s, "-" if want is None else want_s), key
    return len(page.numbers)


def no_external_reference(text: str, page: Page) -> None:
    assert not re.search(r"https?://", text, re.IGNORECASE)
    assert not re.search(r"""(?:src|href)\s*=\s*["']?\s*//""", text, re.IGNORECASE)
    assert not re.search(r"url\s*\(|@import", text, re.IGNORECASE)
    assert page.refs == []  # no src/href at all: nothing to fetch
    assert "<link" not in text and "<iframe" not in text


@pytest.mark.parametrize("store", [STORE, FLIPPED], ids=["store", "498-flip-body-mid"])
def test_report_equals_verify_and_stats_json(tmp_path, store):
    text = write(store, tmp_path / "r.html")
    page = Page(text)
    no_external_reference(text, page)
    docs = cli_docs(store)
    assert page.data["verify"] == docs["verify"]
    assert page.data["verify_exit_code"] == docs["verify_exit_code"]
    assert page.data["stats"] == docs["stats"]
    assert page.data["consumers"]["rows"] == docs["consumers"]["rows"]
    check_numbers(page, docs)
    keys = {k for k, _, _ in page.numbers}
    v, s = docs["verify"], docs["stats"]
    assert {"verify.summary.errors", "verify.summary.warnings", "verify.summary.infos", "verify.summary.records",
            "verify.findings.length", "stats.totals.records"} <= keys
    assert {f"stats.topics.{i}.records" for i in range(len(s["topics"]))} <= keys
    assert {f"stats.hours.{i}.records" for i in range(len(s["hours"]))} <= keys
    # the findings table: every finding of verify with its file and offset, in order
    assert [r[:4] for r in page.findings] == [
        [f["severity"], f["kind"], f["file"] or "-", "-" if f["offset"] is None else str(f["offset"])]
        for f in v["findings"]]
    rec = v["recovery"]
    assert f"recovery cut {rec['max_offset']}" in text
    for r in rec["dropped_records"]["damaged_ranges"]:
        assert f"{r['kind']} [{r['start']}, {r['end']})" in text
    if store == FLIPPED:
        assert v["summary"]["errors"] == 3 and len(rec["dropped_records"]["damaged_ranges"]) == 2
        assert "dropped by recovery: [1862, 4646)" in text  # the cut to the end stats' walk found
        assert 'data-check="pending"' in text and "DAMAGED" in text


def test_report_deleted_before_consumption(tmp_path):
    """A store whose oldest segment is gone: the group's deleted and at-risk counts are consumers'."""
    store = tmp_path / "store"
    shutil.copytree(STORE, store)
    (store / "commitlog" / "00000000000000000000").unlink()
    page = Page(write(store, tmp_path / "r.html"))
    docs = cli_docs(store)
    assert page.data["consumers"]["rows"] == docs["consumers"]["rows"]
    check_numbers(page, docs)
    g = page.data["consumers"]["groups"]
    assert [x["group"] for x in g] == ["cg-test"]
    assert g[0]["deleted"] == sum(r["deleted"] or 0 for r in docs["consumers"]["rows"]) == 8
    assert {"consumers.groups.0.deleted", "consumers.groups.0.lag", "consumers.groups.0.at_risk"} <= \
        {k for k, _, _ in page.numbers}


def hostile_store(root: Path) -> Path:
    build_store(root, [(HOSTILE.encode(), b"x", props(KEYS=HOSTILE, TAGS="</script><b>t")),
                       (b"T&amp;\"'", b"y", props(KEYS="k\x1b[31m"))])
    (root / "config" / "consumerOffset.json").write_text(json.dumps(
        {"offsetTable": {f"{HOSTILE}@{HOSTILE_GROUP}": {"0": 0}}}))
    return root


def test_hostile_strings_are_escaped(tmp_path):
    store = hostile_store(tmp_path / "store")
    text = write(store, tmp_path / "r.html")
    page = Page(text)
    assert HOSTILE not in text and HOSTILE_GROUP not in text and "<b>" not in text and "\x1b" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text  # shown, as text
    assert "&lt;img src=x onerror=alert(2)&gt;" in text
    assert text.lower().count("<script") == 2  # the data block and the page's own script, nothing else
    assert page.elements.count("img") == 0 and page.elements.count("b") == 0
    assert HOSTILE in {t["topic"] for t in page.data["stats"]["topics"]}  # the data block keeps the bytes
    assert page.data["consumers"]["rows"][0]["group"] == HOSTILE_GROUP
    no_external_reference(text, page)


def test_next_start_shown_only_when_verify_has_it(tmp_path):
    data = collect(STORE)
    assert "next-start" not in render({**data, "verify": {k: v for k, v in data["verify"].items()
                                                          if k != "next_start"}})
    ns = {"estimated": True, "why_not": None, "mode": "normal", "starts": True, "start_file": "0" * 20,
          "start_offset": 0, "end_offset": 13848, "start_reason": "normal: from the third-last file",
          "commitlog_files": 4, "commitlog_files_total": 4, "commitlog_bytes": 13848, "commitlog_bytes_total": 16384,
          "records": 69, "exact": True, "crc_checked": True, "crc_note": "", "estimated_seconds": 0.001,
          "rate": {"bytes_per_second": 104857600, "source": "default", "detail": ""}, "shorter": []}
    data["verify"]["next_start"] = ns
    page = Page(render(data))
    assert ("verify.next_start.commitlog_bytes", "13848", "13,848") in page.numbers
    assert 'id="next-start"' in render(data)


def test_refuses_a_path_inside_the_store_and_writes_atomically(tmp_path):
    store = tmp_path / "store"
    shutil.copytree(STORE, store)
    before = sorted(p.relative_to(store) for p in store.rglob("*"))
    for to in (store / "r.html", store / "config" / "r.html", store / "commitlog" / "r.html"):
        res = CliRunner().invoke(cli, ["report", str(store / "commitlog"), "--to", str(to)])
        assert res.exit_code == 2 and "must not be inside the store" in res.output
    assert sorted(p.relative_to(store) for p in store.rglob("*")) == before
    out = tmp_path / "out"
    out.mkdir()
    (out / "r.html").write_text("old")
    write(store, out / "r.html")
    assert [p.name for p in out.iterdir()] == ["r.html"]  # replaced, no temporary file left
    assert (out / "r.html").read_text().startswith("<!DOCTYPE html>")


# ---------------------------------------------------------------- (b) in a real headless browser


def chromium(tmp_path: Path, page: Path, *args: str) -> tuple[str, list[str]]:
    """(stdout, console lines about ``page``) of Debian's chromium run headless on ``page``."""
    r = subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
                        f"--user-data-dir={tmp_path / 'chromium-profile'}", "--enable-logging=stderr", "--v=0",
                        *args, page.as_uri()], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    console = [line for line in r.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    return r.stdout, console


@needs_chromium
@pytest.mark.parametrize("store", [STORE, FLIPPED], ids=["store", "498-flip-body-mid"])
def test_browser_loads_without_console_error_and_shows_the_counts(tmp_path, store):
    html_path = tmp_path / "r.html"
    write(store, html_path)
    dom, console = chromium(tmp_path, html_path, "--dump-dom")
    assert console == []
    page = Page(dom)
    assert page.html_attrs.get("data-check") == "ok"  # the page's script ran and found every number agreeing
    assert int(page.html_attrs["data-checked"]) == check_numbers(page, cli_docs(store))
    assert "numbers agree with the data" in dom


@needs_chromium
def test_browser_catches_a_number_that_differs_from_the_data(tmp_path):
    text = write(FLIPPED, tmp_path / "r.html")
    tampered = re.sub(r'(data-key="verify\.summary\.errors" data-value=")3(">)3<', r"\g<1>4\g<2>4<", text)
    assert tampered != text
    (tmp_path / "bad.html").write_text(tampered, encoding="utf-8")
    dom, console = chromium(tmp_path, tmp_path / "bad.html", "--dump-dom")
    assert Page(dom).html_attrs.get("data-check") == "mismatch"
    assert any("verify.summary.errors shows 4, the data says 3" in line for line in console)


@needs_chromium
def test_browser_runs_no_injected_script(tmp_path):
    store = hostile_store(tmp_path / "store")
    write(store, tmp_path / "r.html")
    dom, console = chromium(tmp_path, tmp_path / "r.html", "--dump-dom")
    assert console == []
    page = Page(dom)
    assert page.html_attrs.get("data-check") == "ok"
    assert page.elements.count("img") == 0 and page.elements.count("script") == 2
    assert HOSTILE in dom.replace("&lt;", "<").replace("&gt;", ">")  # shown as text


def test_a_failed_write_keeps_the_old_page(tmp_path, monkeypatch):
    """The page goes to a temporary file, fsynced, then renamed: a failure before the rename leaves the old
    page whole and no temporary file behind."""
    from rmqdump.analysis import report as mod
    from rmqdump.disk import durable
    from rmqdump.errors import StoreError

    out = tmp_path / "r.html"
    out.write_text("old page")

    def fail(fd, what):
        raise StoreError("fsync failed (test)", what)

    monkeypatch.setattr(durable, "fsync_fd", fail)
    with pytest.raises(StoreError):
        mod.write_report(STORE, out)
    assert out.read_text() == "old page"
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]
