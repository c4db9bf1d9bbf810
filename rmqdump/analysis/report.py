"""``report``: one self-contained HTML page about a store, for the incident channel and the post-mortem.

The page is built only from the library's own documents: :func:`~rmqdump.analysis.verify.verify_store`
(``verify -f json``), :func:`~rmqdump.analysis.stats.compute_stats` (``stats -f json``) and
:func:`~rmqdump.analysis.consumers.consumer_lag` (``consumers -f json``). Those documents are embedded
whole in a ``<script type="application/json" id="rmqdump-data">`` block; every number shown carries
``data-key`` (its path in that block) and ``data-value``, and the page's script checks the two agree
(``<html data-check="ok">``, a ``console.error`` otherwise). Sections: a store map (segments on an
offset axis: data, blank and unwritten tails, damaged ranges, the predicted recovery cut), records per
topic and per hour, consumer lag and messages deleted before consumption, the next-start estimate
(when verify's document has ``next_start``) and the findings with file and offset.

Nothing is fetched: inline CSS, SVG and script only. Store-derived strings (topics, keys, findings,
file names) are attacker-controlled bytes: all go through :func:`text` (HTML-escaped, control and
bidi characters shown as ``\\xNN``); the JSON block is ASCII with ``<``, ``>`` and ``&`` escaped.
The page is written outside the store only, to a temporary file beside the target, fsynced, renamed.
"""

from __future__ import annotations

import html
import json
import os
import re
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from rmqdump.broker.recovery.cost import next_start_after_walk
from rmqdump.broker.recovery.walk import ends_at_last_blank
from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.disk.durable import atomic_file
from rmqdump.disk.guard import protected_root, refuse_inside
from rmqdump.errors import RmqdumpError, StoreError

TOP_TOPICS = 30
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
W = 1100  # SVG width (viewBox units)


def text(s) -> str:
    """HTML-safe text of any value: control, bidi and lone-surrogate characters as ``\\xNN``/``\\uNNNN``."""
    s = _CONTROL.sub(lambda m: (f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100
                                else f"\\u{ord(m.group()):04x}"), str(s))
    return html.escape(s, quote=True)


def _iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    try:
        return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"
    except (OverflowError, OSError, ValueError):
        return str(ms)


def _bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def collect(path: str | os.PathLike, *, keep_going: bool = False, version: str = "auto", use_mmap: bool = True,
            max_record_size: int = MAX_RECORD_SIZE, progress: Callable[[int], None] | None = None) -> dict:
    """The report's data: ``{"store", "created", "verify", "verify_exit_code", "stats", "consumers"}``, each
    document exactly as its command's ``-f json`` prints it. ``progress(done)`` counts to twice the
    commitlog's size (verify's walk, then stats')."""
    from rmqdump.analysis.consumers import consumer_lag
    from rmqdump.analysis.stats import compute_stats
    from rmqdump.analysis.verify import verify_store
    from rmqdump.store.root import Store

    store = Store.open(path)
    total = sum(s.size for s in store.commitlog.segments)
    began = time.monotonic()
    vrep = verify_store(store, keep_going=keep_going, use_mmap=use_mmap, version=version,
                        max_record_size=max_record_size,
                        progress=(lambda done, _t: progress(done)) if progress else None)
    vdoc = vrep.to_dict()
    vdoc["next_start"] = next_start_after_walk(vrep.recovery, store, total, time.monotonic() - began)
    sdoc = compute_stats(path, use_mmap=use_mmap, max_record_size=max_record_size,
                         progress=(lambda done: progress(total + done)) if progress else None)
    cons: dict = {"rows": None, "why_not": None, "offsets_file": None, "problems": []}
    if store.root is None:
        cons["why_not"] = "not a store root (no config/ nor consumequeue/ given): no consumer offsets"
    else:
        try:
            rep = consumer_lag(store.root, (), (), store.commitlog.min_offset, commitlog=store.commitlog)
        except RmqdumpError as e:
            cons["why_not"] = str(e)
        else:
            if rep.offsets_file is None:
                cons["why_not"] = "no config/consumerOffset.json (nor .bak): no consumer offsets"
            else:
                cons.update(rows=[r.to_dict() for r in rep.rows], offsets_file=str(rep.offsets_file),
                            problems=list(rep.problems), groups=_groups(rep))
    return {"store": str(store.root if store.root is not None else store.commitlog.location),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "verify": vdoc, "verify_exit_code": vrep.exit_code, "stats": sdoc, "consumers": cons}


def _groups(rep) -> list[dict]:
    """Per group: queues, lag (:meth:`ConsumerReport.total_lag`), deleted before consumption, at risk next
    (the sums ``consumers`` prints under its table)."""
    out = []
    for g, lag in sorted(rep.total_lag().items()):
        rows = [r for r in rep.rows if r.group == g]
        out.append({"group": g, "queues": len(rows), "lag": lag,
                    "deleted": sum(r.deleted.count for r in rows if r.deleted is not None),
                    "at_risk": sum(r.at_risk or 0 for r in rows),
                    "at_risk_bytes": sum(r.at_risk_bytes or 0 for r in rows)})
    return out


def write_report(path: str | os.PathLike, to: str | os.PathLike, *, version_label: str | None = None,
                 **kwargs) -> dict:
    """Write the report of store ``path`` to ``to`` (never inside the store); returns a small summary."""
    out = Path(os.path.abspath(to))
    refuse_inside(out, [protected_root(path)], "the report")
    if out.is_dir():
        raise StoreError("the report must be a file path, not a directory", out)
    data = collect(path, **kwargs)
    refuse_inside(out, [data["store"]], "the report")
    page = render(data, version_label).encode("utf-8")
    write_atomic(out, page)
    s = data["verify"]["summary"]
    return {"report": str(out), "store": data["store"], "bytes": len(page), "errors": s.get("errors", 0),
            "warnings": s.get("warnings", 0), "records": data["stats"]["totals"]["records"],
            "verify_exit_code": data["verify_exit_code"]}


def write_atomic(out: Path, payload: bytes) -> None:
    """``payload`` to ``out`` through a temporary file in its directory, fsynced, then renamed."""
    with atomic_file(out, "the report") as f:
        f.write(payload)


# ---------------------------------------------------------------- rendering


def num(key: str, value, shown: str | None = None) -> str:
    """A number the page's script checks against the data block: ``key`` is its path there."""
    v = "" if value is None else str(value)
    label = shown if shown is not None else (f"{value:,}" if isinstance(value, int) else "-" if value is None
                                             else text(value))
    return f'<span class="n" data-key="{text(key)}" data-value="{text(v)}">{label}</span>'


def _json_block(data: dict) -> str:
    raw = json.dumps(data, ensure_ascii=True, default=str, separators=(",", ":"))
    return raw.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render(data: dict, version_label: str | None = None) -> str:
    """The whole page."""
    v, st = data["verify"], data["stats"]
    s = v["summary"]
    status = "DAMAGED" if s.get("errors") else "CLEAN"
    body = [
        f'<header><h1>rmqdump report <span class="status {status.lower()}">{status}</span></h1>'
        f'<p class="store">{text(data["store"])}</p><p class="meta">created {text(data["created"])} by rmqdump '
        f'{text(version_label or "")} &middot; <span id="check">data check: not run (scripts off)</span></p></header>',
        _summary(v, st),
        _store_map(v, st["totals"]),
        _next_start(v),
        _topics(st),
        _hours(st),
        _consumers(data["consumers"]),
        _findings(v),
    ]
    return (PAGE.replace("%TITLE%", text(f"rmqdump report: {data['store']}"))
            .replace("%BODY%", "\n".join(b for b in body if b))
            .replace("%DATA%", _json_block(data)))


def _dl(rows: list[tuple[str, str]]) -> str:
    return "<dl>" + "".join(f"<dt>{k}</dt><dd>{val}</dd>" for k, val in rows) + "</dl>"


def _summary(v: dict, st: dict) -> str:
    s, t = v["summary"], st["totals"]
    rec = v.get("recovery") or {}
    rows = [
        ("verify", f'{num("verify.summary.errors", s.get("errors"))} errors, '
                   f'{num("verify.summary.warnings", s.get("warnings"))} warnings, '
                   f'{num("verify.summary.infos", s.get("infos"))} info'),
        ("records (verify's walk)", f'{num("verify.summary.records", s.get("records"))} in '
                             f'{num("verify.summary.segments", s.get("segments"))} segment(s); valid data ends at '
                             f'{num("verify.summary.valid_end", s.get("valid_end"))}'),
        ("records (stats' walk, past damage)", f'{num("stats.totals.records", t["records"])} records, '
                            f'{num("stats.totals.bytes", t["bytes"])} bytes, {num("stats.totals.topics", t["topics"])} '
                            f'topics, {num("stats.totals.queues", t["queues"])} queues, '
                            f'{num("stats.totals.blanks", t["blanks"])} blanks'),
        ("store time", f'{text(_iso(t.get("first_store_time")))} .. {text(_iso(t.get("last_store_time")))}'),
    ]
    if rec:
        rows.append(("broker's next start", text(f"{rec.get('mode')} recovery ({rec.get('version')}.x): "
                                                 f"{rec.get('reason')}")))
        dr = rec.get("dropped_records") or {}
        rows.append(("predicted commitlog end",
                     f'{num("verify.recovery.max_offset", rec.get("max_offset"))}; drops '
                     f'{num("verify.recovery.dropped_records.count", dr.get("count"))} record(s), '
                     f'{num("verify.recovery.dropped_cq_entries.count", (rec.get("dropped_cq_entries") or {}).get("count"))}'
                     ' consume-queue entries'))
    return '<section id="summary"><h2>Summary</h2>' + _dl(rows) + "</section>"


def _damage(v: dict) -> list[tuple[int, int, str, str]]:
    """(start, end, what, css class) of the damage verify reported: recovery's dropped ranges, --keep-going's
    salvage ranges, a segment's first damage; records recovery accepts although damaged (``accepted``)."""
    seen: dict[tuple[int, int], tuple[str, str]] = {}
    rec = v.get("recovery") or {}
    for r in ((rec.get("dropped_records") or {}).get("damaged_ranges") or []) + \
            ((v.get("salvage") or {}).get("damaged_ranges") or []):
        seen.setdefault((r["start"], r["end"]), (r.get("kind") or "damage", "damage"))
    for seg in v.get("segments") or []:
        fd = seg.get("first_damage")
        if fd is not None and not any(a <= fd < b for a, b in seen):
            seen[(fd, fd + 1)] = (f"first damage in {seg['segment']}", "damage")
    for cls, items in (("damage", rec.get("unchecked_damage") or []), ("accepted", rec.get("accepted_damaged") or [])):
        for a in items:
            if a.get("offset") is not None and not any(x <= a["offset"] < y for x, y in seen):
                what = "damage recovery never reads" if cls == "damage" else "accepted by recovery although damaged"
                seen[(a["offset"], a["offset"] + 1)] = (f"{a.get('kind')}: {what}", cls)
    return sorted((a, b, k, c) for (a, b), (k, c) in seen.items())


_TAIL = {"blank": "blank", "zeros": "unwritten", "empty": "unwritten", "full": None, "damage": "damaged tail",
         "garbage": "garbage tail"}


def _store_map(v: dict, totals: dict) -> str:
    """Segments on an offset axis: verify's data and tails, damage, the recovery cut; past a damaged tail, the
    data ``stats``' walk (past damage) found and where it met unwritten space."""
    segs = v.get("segments") or []
    if not segs:
        return '<section id="map"><h2>Store map</h2><p>no commitlog segments</p></section>'
    lo, hi = min(x["start"] for x in segs), max(x["start"] + x["size"] for x in segs)
    span = max(hi - lo, 1)
    x0, width, y, h = 10, W - 20, 30, 46

    def X(off: int) -> float:
        return round(x0 + width * (min(max(off, lo), hi) - lo) / span, 2)

    parts = []
    rec = v.get("recovery") or {}
    deleted = set(rec.get("deleted_commitlog_files") or [])
    for seg in segs:
        a, b, end = seg["start"], seg["start"] + seg["size"], seg["end_offset"]
        name = text(seg["segment"])
        parts.append(f'<rect class="seg" x="{X(a)}" y="{y}" width="{max(X(b) - X(a), 0.5)}" height="{h}">'
                     f'<title>{name}: [{a}, {b}) {seg["records"]} records, {seg["blanks"]} blanks, tail '
                     f'{text(seg["tail"])}</title></rect>')
        if end > a:
            parts.append(f'<rect class="data" x="{X(a)}" y="{y}" width="{max(X(end) - X(a), 0.5)}" height="{h}">'
                         f'<title>{name}: data [{a}, {end})</title></rect>')
        tail = _TAIL.get(seg["tail"], seg["tail"])
        if tail and end < b:
            parts.append(f'<rect class="tail {text(seg["tail"])}" x="{X(end)}" y="{y}" '
                         f'width="{max(X(b) - X(end), 0.5)}" height="{h}"><title>{name}: {text(tail)} '
                         f'[{end}, {b})</title></rect>')
        if seg["segment"] in deleted:
            parts.append(f'<line class="deleted" x1="{X(a)}" y1="{y}" x2="{X(b)}" y2="{y + h}"/>')
        if X(b) - X(a) > 110:
            parts.append(f'<text x="{X(a) + 3}" y="{y - 4}" class="lbl">{name}</text>')
    walk_end = totals.get("end_offset")
    for seg in segs:
        a, b = seg["start"], seg["start"] + seg["size"]
        if seg["tail"] in ("damage", "garbage") and walk_end is not None and a <= walk_end < b \
                and str(totals.get("end_reason", "")).startswith("end_of_data"):
            parts.append(f'<rect class="tail zeros" x="{X(walk_end)}" y="{y}" width="{max(X(b) - X(walk_end), 0.5)}" '
                         f'height="{h}"><title>unwritten [{walk_end}, {b}) (stats: '
                         f'{text(totals.get("end_reason"))})</title></rect>')
    legend = ["data", "blank", "unwritten", "damage"]
    marks = _damage(v)
    if any(c == "accepted" for *_, c in marks):
        legend.append("accepted")
    if rec.get("max_offset") is not None:
        cut = rec["max_offset"]
        data_end = max([x.get("end_offset") or 0 for x in segs] + [walk_end or 0])
        if data_end > cut and not ends_at_last_blank(rec):
            parts.append(f'<rect class="dropped" x="{X(cut)}" y="{y}" width="{max(X(data_end) - X(cut), 2)}" '
                         f'height="{h}"><title>dropped by recovery: [{cut}, {data_end}) '
                         f'({(rec.get("dropped_records") or {}).get("count")} records)</title></rect>')
            legend.append("dropped")
        parts.append(f'<line class="cut" x1="{X(cut)}" y1="{y - 14}" x2="{X(cut)}" y2="{y + h + 14}"/>'
                     f'<text class="cutlbl" x="{X(cut) + 3}" y="{y + h + 26}">recovery cut {cut}</text>')
        if rec.get("start_offset") is not None:
            so = rec["start_offset"]
            parts.append(f'<path class="start" d="M{X(so)} {y + h + 4} l-5 9 h10 z"><title>recovery walk starts '
                         f'at {so} ({text(rec.get("start_file"))})</title></path>')
    for a, b, kind, cls in marks:
        parts.append(f'<rect class="{cls}" x="{X(a) - 1}" y="{y - 6}" width="{max(X(b) - X(a), 3)}" '
                     f'height="{h + 12}"><title>{text(kind)} [{a}, {b})</title></rect>')
    ticks = "".join(f'<text class="tick" text-anchor="{("start", "middle", "middle", "middle", "end")[i]}" '
                    f'x="{X(lo + span * i // 4)}" y="{y + h + 44}">'
                    f'{text(_bytes(lo + span * i // 4))}</text>' for i in range(5))
    names = {"accepted": "accepted although damaged", "dropped": "dropped by recovery"}
    leg = "".join(f'<span class="key {k}"></span>{names.get(k, k)} ' for k in legend) + '<span class="key cut"></span>recovery cut'
    return (f'<section id="map"><h2>Store map</h2><p class="hint">commitlog offsets {lo}..{hi} '
            f'({len(segs)} segment(s)); hover for details</p>'
            f'<svg viewBox="0 0 {W} {y + h + 52}" role="img" aria-label="store map">{"".join(parts)}{ticks}</svg>'
            f'<p class="legend">{leg}</p></section>')


def _next_start(v: dict) -> str:
    ns = v.get("next_start") or (v.get("recovery") or {}).get("next_start")
    if not ns:
        return ""
    lines: list[str] = []
    try:
        from rmqdump.broker.recovery.cost import summary_lines

        lines = summary_lines(ns)
    except (ImportError, KeyError, TypeError, ValueError):
        lines = [str(ns.get("why_not") or "")] if not ns.get("estimated") else []
    key = "verify.next_start" if v.get("next_start") else "verify.recovery.next_start"
    rows = [(text(k), num(f"{key}.{k}", val) if isinstance(val, int) and not isinstance(val, bool) else text(val))
            for k, val in ns.items() if isinstance(val, (int, float, str, bool)) and val is not None]
    return ('<section id="next-start"><h2>Next start (estimate)</h2>'
            + "".join(f"<p>{text(line)}</p>" for line in lines if line)
            + f"<details><summary>every field</summary>{_dl(rows)}</details></section>")


def _bars(rows: list[tuple[str, int, str]], unit: str) -> str:
    """Horizontal bars: (label, value, data-key of the value)."""
    if not rows:
        return "<p>none</p>"
    top = max(r[1] for r in rows) or 1
    out = ['<table class="bars">']
    for label, val, key in rows:
        out.append(f'<tr><td class="lbl">{text(label)}</td><td class="num">{num(key, val)}</td><td class="bar">'
                   f'<svg viewBox="0 0 400 14" preserveAspectRatio="none"><rect x="0" y="1" height="12" '
                   f'width="{round(400 * val / top, 2)}"><title>{text(label)}: {val} {unit}</title></rect></svg>'
                   "</td></tr>")
    return "".join(out) + "</table>"


def _topics(st: dict) -> str:
    ts = st.get("topics") or []
    order = sorted(range(len(ts)), key=lambda i: (-ts[i]["records"], ts[i]["topic"]))
    rows = [(ts[i]["topic"], ts[i]["records"], f"stats.topics.{i}.records") for i in order[:TOP_TOPICS]]
    more = ""
    if len(order) > TOP_TOPICS:
        rest = [ts[i] for i in order[TOP_TOPICS:]]
        more = (f"<p>{len(rest)} more topics with {sum(t['records'] for t in rest):,} records "
                "(all are in the data block)</p>")
    return f'<section id="topics"><h2>Records per topic</h2>{_bars(rows, "records")}{more}</section>'


def _hours(st: dict) -> str:
    hs = st.get("hours") or []
    if not hs:
        return '<section id="hours"><h2>Records per hour (UTC, store time)</h2><p>none</p></section>'
    top = max(h["records"] for h in hs) or 1
    n, ch = len(hs), 110
    bw = min((W - 20) / n, 48)
    bars = []
    for i, h in enumerate(hs):
        bh = round(ch * h["records"] / top, 2)
        bars.append(f'<rect class="hour" data-key="stats.hours.{i}.records" data-value="{h["records"]}" '
                    f'x="{round(10 + i * bw, 2)}" y="{10 + ch - bh}" width="{max(round(bw * 0.9, 2), 0.5)}" '
                    f'height="{bh}"><title>{text(h["hour"])}: {h["records"]} records, {h["bytes"]} bytes</title></rect>')
    labels = "".join(f'<text class="tick" text-anchor="{"end" if i and i == n - 1 else "start"}" '
                     f'x="{round(10 + (i + (i and i == n - 1)) * bw, 2)}" y="{ch + 28}">{text(hs[i]["hour"])}</text>'
                     for i in sorted({0, n // 2, n - 1}))
    return (f'<section id="hours"><h2>Records per hour (UTC, store time)</h2><p class="hint">{n} hour(s), at most '
            f'{top:,} records in one</p><svg viewBox="0 0 {W} {ch + 36}" role="img" aria-label="records per hour">'
            f'{"".join(bars)}{labels}</svg></section>')


def _consumers(c: dict) -> str:
    head = '<section id="consumers"><h2>Consumers: lag and messages deleted before consumption</h2>'
    if c.get("rows") is None:
        return head + f"<p>{text(c.get('why_not'))}</p></section>"
    rows = c["rows"]
    out = [head, f"<p>offsets from {text(c.get('offsets_file'))}</p>"]
    out += [f'<p class="warn">{text(p)}</p>' for p in c.get("problems") or []]
    out.append('<table class="grid"><tr><th>group</th><th>queues</th><th>lag</th><th>deleted before consumption'
               '</th><th>at risk next</th></tr>')
    for i, g in enumerate(c["groups"]):
        out.append(f'<tr class="group"><td>{text(g["group"])}</td><td class="num">{g["queues"]}</td>'
                   + "".join(f'<td class="num{" bad" if k == "deleted" and g[k] else ""}">'
                             f'{num(f"consumers.groups.{i}.{k}", g[k])}</td>' for k in ("lag", "deleted", "at_risk"))
                   + "</tr>")
    out.append("</table><details><summary>per queue</summary><table class=\"grid\"><tr><th>group</th><th>topic</th>"
               "<th>queue</th><th>committed</th><th>min</th><th>max</th><th>lag</th><th>deleted</th>"
               "<th>deleted queue offsets</th><th>stored no later than</th><th>at risk</th><th>note</th></tr>")
    for i, r in enumerate(rows):
        dq = r.get("deleted_queue_offsets")
        out.append(
            f'<tr><td>{text(r["group"])}</td><td>{text(r["topic"])}</td><td class="num">{r["queue_id"]}</td>'
            + "".join(f'<td class="num">{num(f"consumers.rows.{i}.{k}", r[k])}</td>'
                      for k in ("committed", "min_offset", "max_offset", "lag", "deleted"))
            + f'<td>{text(f"[{dq[0]}, {dq[1]})") if dq else ""}</td><td>{text(_iso(r.get("deleted_stored_not_after"))) if dq else ""}'
            f'</td><td class="num">{num(f"consumers.rows.{i}.at_risk", r.get("at_risk"))}</td>'
            f'<td>{text(r.get("note") or "")}</td></tr>')
    return "".join(out) + "</table></details></section>"


def _findings(v: dict) -> str:
    fs = v.get("findings") or []
    out = [f'<section id="findings"><h2>Findings ({num("verify.findings.length", len(fs))})</h2>'
           '<p class="filters">show: <label><input type="checkbox" data-sev="error" checked> errors</label> '
           '<label><input type="checkbox" data-sev="warning" checked> warnings</label> '
           '<label><input type="checkbox" data-sev="info" checked> info</label> '
           '<input type="search" id="q" placeholder="filter kind, file, detail"></p>'
           '<table class="grid" id="findings-table"><tr><th>severity</th><th>kind</th><th>file</th><th>offset</th>'
           "<th>detail</th></tr>"]
    for f in fs:
        sev = text(f.get("severity"))
        out.append(f'<tr class="finding {sev}" data-sev="{sev}"><td>{sev}</td><td>{text(f.get("kind"))}</td>'
                   f'<td>{text(f.get("file") or "-")}</td><td class="num">'
                   f'{"-" if f.get("offset") is None else text(f["offset"])}</td><td>{text(f.get("detail"))}</td></tr>')
    return "".join(out) + "</table></section>"


PAGE = """<!DOCTYPE html>
<html lang="en" data-check="pending"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>%TITLE%</title>
<style>
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:0 auto;max-width:1140px;padding:12px 20px;color:#1d232a;background:#fff}
h1{font-size:22px;margin:4px 0}h2{font-size:17px;margin:22px 0 6px;border-bottom:1px solid #d6dbe1}
.store{font-family:ui-monospace,monospace;margin:0;word-break:break-all}.meta,.hint{color:#5b6570;margin:2px 0}
.status{font-size:14px;padding:2px 8px;border-radius:4px;color:#fff;vertical-align:middle}.damaged{background:#c62828}.clean{background:#2e7d32}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0}dt{color:#5b6570}dd{margin:0}
svg{width:100%;height:auto;display:block}
.seg{fill:#eef1f4;stroke:#8a96a3;stroke-width:.6}.data{fill:#4a7fc1}.tail.blank{fill:#c9d3dd}.tail{fill:#f4f6f8}
.tail.damage,.tail.garbage{fill:#f3b0a8}.damage{fill:#d32f2f;opacity:.85}.accepted{fill:#f9a825}.dropped{fill:#ff9800;opacity:.45}
.cut{stroke:#b71c1c;stroke-width:2;stroke-dasharray:5 3}.cutlbl{fill:#b71c1c;font-size:12px}.start{fill:#2e7d32}
.deleted{stroke:#6d4c41;stroke-width:1.5}.lbl{font-size:11px;fill:#3c4650;font-family:ui-monospace,monospace}
.tick{font-size:11px;fill:#5b6570}.hour{fill:#4a7fc1}
.legend .key{display:inline-block;width:12px;height:12px;margin:0 4px 0 10px;vertical-align:-1px;border:1px solid #8a96a3}
.key.data{background:#4a7fc1}.key.blank{background:#c9d3dd}.key.unwritten{background:#f4f6f8}.key.damage{background:#d32f2f}
.key.dropped{background:#ffcc80}.key.accepted{background:#f9a825}.key.cut{background:#b71c1c;width:3px}
table{border-collapse:collapse}.grid{width:100%;font-size:13px}.grid th,.grid td{border-bottom:1px solid #e3e7eb;padding:3px 6px;text-align:left;vertical-align:top}
.grid td:last-child{word-break:break-word}.num,.grid td.num{text-align:right;font-variant-numeric:tabular-nums}
.bars{width:100%}.bars td{padding:1px 6px}.bars .lbl{max-width:420px;overflow-wrap:anywhere;font-family:ui-monospace,monospace;font-size:12px}
.bars .bar{width:45%}.bars rect{fill:#4a7fc1}.bad{color:#c62828;font-weight:600}.warn{color:#a15c00}
tr.error td:first-child{color:#c62828;font-weight:600}tr.warning td:first-child{color:#a15c00}tr.info td:first-child{color:#1565c0}
.filters input[type=search]{margin-left:10px;padding:2px 6px}#check.ok{color:#2e7d32}#check.bad{color:#c62828;font-weight:600}
</style></head><body>
%BODY%
<script type="application/json" id="rmqdump-data">%DATA%</script>
<script>
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("rmqdump-data").textContent);
  function at(path) {
    var cur = data, parts = path.split(".");
    for (var i = 0; i < parts.length; i++) {
      if (cur === null || cur === undefined) return undefined;
      if (parts[i] === "length" && Array.isArray(cur) && i === parts.length - 1) return cur.length;
      cur = cur[parts[i]];
    }
    return cur;
  }
  var bad = 0, checked = 0;
  document.querySelectorAll("[data-key]").forEach(function (el) {
    var want = at(el.getAttribute("data-key"));
    var want_s = want === null || want === undefined ? "" : String(want);
    var shown = el.tagName.toLowerCase() === "span" ? el.textContent.replace(/,/g, "") : want_s;
    checked++;
    if (el.getAttribute("data-value") !== want_s || (shown !== want_s && !(want_s === "" && shown === "-"))) {
      bad++;
      console.error("rmqdump report: " + el.getAttribute("data-key") + " shows " + el.getAttribute("data-value")
                    + ", the data says " + want_s);
    }
  });
  var check = document.getElementById("check");
  check.textContent = bad ? "data check: " + bad + " of " + checked + " numbers differ from the data"
                          : "data check: " + checked + " numbers agree with the data";
  check.className = bad ? "bad" : "ok";
  document.documentElement.setAttribute("data-check", bad ? "mismatch" : "ok");
  document.documentElement.setAttribute("data-checked", String(checked));
  var q = document.getElementById("q");
  function filter() {
    var on = {}, needle = q ? q.value.toLowerCase() : "";
    document.querySelectorAll("input[data-sev]").forEach(function (c) { on[c.getAttribute("data-sev")] = c.checked; });
    document.querySelectorAll("tr.finding").forEach(function (tr) {
      var ok = on[tr.getAttribute("data-sev")] !== false && (!needle || tr.textContent.toLowerCase().indexOf(needle) >= 0);
      tr.style.display = ok ? "" : "none";
    });
  }
  document.querySelectorAll("input[data-sev]").forEach(function (c) { c.addEventListener("change", filter); });
  if (q) q.addEventListener("input", filter);
})();
</script>
</body></html>
"""
