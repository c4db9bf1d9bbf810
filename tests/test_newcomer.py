"""Issue 17's small items, on the bundled fixture store (no ../shared needed): `info` on a file that is no
segment, `scan --from-offset` inside a record or past the end, the repair summary's message count under
`--salvage recrc/filler`, verify's "valid data ends" beside a pre-allocated zero segment, and the README's
command table naming `lookup --queue TOPIC QID QOFFSET`."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from oracle.harness import writable_copy

from rmqdump.cli import cli
from rmqdump.codec.record import Message
from rmqdump.store.commitlog import CommitLog

REPO = Path(__file__).resolve().parents[1]
STORE = REPO / "fixtures" / "store"
SEG0 = STORE / "commitlog" / "00000000000000000000"


def run(*args, env=None):
    return CliRunner().invoke(cli, [str(a) for a in args], env=env)


def one_line_error(res, code: int = 2) -> str:
    assert res.exit_code == code, (res.exit_code, res.stdout, res.stderr)
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    assert res.stderr.startswith("rmqdump: error:") and res.stderr.count("\n") == 1, res.stderr
    return res.stderr


# --- 6. info on a file that is not a segment ------------------------------------------------------------------


def test_info_refuses_a_text_file_as_scan_does(tmp_path):
    txt = tmp_path / "notaseg.txt"
    txt.write_bytes(b"hello this is not a seg\n")
    scan_err = one_line_error(run("scan", txt))
    info_err = one_line_error(run("info", txt))
    assert "not a RocketMQ store, commitlog directory or segment" in info_err and "bad MAGICCODE" in info_err
    assert str(txt) in info_err and str(txt) in scan_err
    assert run("info", txt, "-f", "json").exit_code == 2  # no document for it in any format


@pytest.mark.parametrize("name", ["00000000000000000000", "segment-copy.bin"])
def test_info_still_reads_a_real_segment_file(tmp_path, name):
    seg = tmp_path / name
    shutil.copyfile(SEG0, seg)
    res = run("info", seg, "-f", "json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    # the file ends with an end-of-file BLANK: alone, it is the last file, where RocketMQ's recovery ends at it
    assert len(doc["commitlog"]["segments"]) == 1 and 0 < doc["commitlog"]["max_offset"] < 4096
    assert doc["commitlog"]["end_reason"] == "end_of_data: BLANK in the last file"
    named = [p["kind"] for p in doc["commitlog"]["problems"]]
    assert named == ([] if name.isdigit() else ["segment_name"])


# --- 7. scan --from-offset inside a record, inside a BLANK, past the end -------------------------------------


@pytest.fixture(params=["0", "1"], ids=["pure", "compiled"])
def engine(request, monkeypatch):
    if request.param == "1":
        from rmqdump.fast.engine import fast_available

        if not fast_available():
            pytest.skip("compiled walk not available")
    monkeypatch.setenv("RMQDUMP_FAST", request.param)
    return request.param


def test_scan_from_offset_inside_a_record_names_the_nearest_starts(engine):
    # fixtures/store: TopicBig's first record is 4901..5136 (segment 4096)
    err = one_line_error(run("scan", STORE, "--from-offset", 5000, "-f", "jsonl"))
    assert "commitlog/00000000000000004096 at byte 904" in err
    assert "offset 5000 is inside the record at 4901 (size 235); records start at 4901 and 5136" in err
    ok = run("scan", STORE, "--from-offset", 5136, "-f", "jsonl")  # the named start works
    assert ok.exit_code == 0 and json.loads(ok.stdout.splitlines()[0])["offset"] == 5136


def test_scan_from_offset_inside_the_end_of_file_blank(engine):
    # segment 0's records end at 4065, where an end-of-file BLANK of 31 bytes fills it up to 4096
    err = one_line_error(run("scan", STORE, "--from-offset", 4080, "-f", "jsonl"))
    assert "offset 4080 is inside the end-of-file BLANK at 4065 (size 31); records start at 4065 and 4096" in err


@pytest.mark.parametrize("offset", [15000, 16384, 20000])
def test_scan_from_offset_past_the_end_says_where_the_records_end(engine, offset):
    res = run("scan", STORE, "--from-offset", offset, "-f", "jsonl")
    assert res.exit_code == 0 and res.stdout == ""
    assert f"offset {offset} is past the end of the records (they end at 13848)" in res.stderr


def test_scan_from_offset_at_a_record_start_or_the_end_has_no_hint(engine):
    for offset, n in ((4901, 44), (13848, 0)):
        res = run("scan", STORE, "--from-offset", offset, "-f", "jsonl")
        assert res.exit_code == 0 and len(res.stdout.splitlines()) == n
        assert "past the end" not in res.stderr and "inside" not in res.stderr


# --- 8. the repair summary counts what is kept --------------------------------------------------------------


def _flip_body_byte(store: Path, offset: int) -> None:
    """Flip one byte in the body of the record at ``offset`` (its CRC no longer matches)."""
    cl = CommitLog.open(store)
    rec = cl.decode_at(offset)
    seg = cl.segment_for(offset)
    raw = bytearray(seg.path.read_bytes())
    pos = raw.index(rec.body, offset - seg.start) + 2
    raw[pos] ^= 0x01
    seg.path.write_bytes(bytes(raw))


def _messages_from(store: Path, start: int) -> int:
    return sum(1 for m in CommitLog.open(store).walk(start=start) if isinstance(m, Message))


@pytest.mark.parametrize("mode", ["recrc", "filler"])
def test_repair_summary_counts_the_records_the_repaired_store_holds(tmp_path, mode):
    store = writable_copy(STORE, tmp_path / "s")
    _flip_body_byte(store, 8719)  # TopicBatch 0/0, inside the walk of the broker's normal recovery
    plan = run("repair", store, "--salvage", mode, "-f", "json")
    assert plan.exit_code == 1, plan.output
    doc = json.loads(plan.stdout)
    start = doc["broker_recovery"]["start_offset"]
    assert doc["broker_end"] == 8719 and doc["end"] == 13848 and doc["records_lost"] == 0
    text = run("repair", store, "--salvage", mode)
    # the entry of TopicBatch 0/0 still points at a record (the kept one, or its tombstone), never at filler
    assert not any("neutralised bytes" in w for w in doc["warnings"])

    applied = run("repair", store, "--salvage", mode, "--apply", "--backup-dir", tmp_path / "bk", "-q")
    assert applied.exit_code == 0, applied.output
    walked = _messages_from(store, start)
    kept, written = doc["records_kept"], doc["records_written"]
    if mode == "recrc":  # the record stays, CRC rewritten: a kept message, nothing written over it
        assert (kept, written) == (walked, 0)
        assert f"; {walked} messages from offset {start} " in text.stdout
    else:  # a tombstone takes the destroyed record's place: written, not kept
        assert (kept, written) == (walked - 1, 1)
        assert f"; {kept} messages and 1 filler/tombstone record(s) over the damage from offset {start} " in text.stdout
    verify = json.loads(run("verify", store, "-f", "json").stdout)
    assert verify["summary"]["records"] == _messages_from(store, 0)


# --- 9. verify's "valid data ends" beside a pre-allocated zero segment ---------------------------------------


def test_verify_valid_end_is_where_the_records_end_not_the_zero_segment(tmp_path):
    store = writable_copy(STORE, tmp_path / "crashed")
    (store / "commitlog" / "00000000000000016384").write_bytes(bytes(4096))  # pre-allocated, never written
    (store / "abort").write_bytes(b"")  # a crash: the broker runs abnormal recovery
    doc = json.loads(run("verify", store, "-f", "json").stdout)
    assert doc["summary"]["valid_end"] == 13848
    assert doc["recovery"]["max_offset"] == 13848 == doc["recovery"]["stop"]["offset"]
    text = run("verify", store)
    assert "valid data ends at 13848" in text.stdout and "16384" not in text.stdout.split("\n")[1]


# --- 10. the README's command table shows what lookup's options take ---------------------------------------


def test_readme_command_table_shows_lookup_option_values():
    from rmqdump.cli.lookup import lookup

    row = next(line for line in (REPO / "README.md").read_text(encoding="utf-8").splitlines()
               if line.startswith("| `rmqdump lookup"))
    shown = re.findall(r"`(--[a-z-]+)(?: ([A-Z][A-Z ]*))?`", row)
    assert ("--queue", "TOPIC QID QOFFSET") in shown
    for p in lookup.params:
        if p.metavar and p.opts[0] in dict(shown):
            assert (p.opts[0], p.metavar) in shown, (p.opts[0], p.metavar, row)
