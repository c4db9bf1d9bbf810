"""`--body-contains` / `--body-regex`: records filtered on their (decompressed) bodies, in both engines."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from conftest import FIXTURES
from rmqdump.cli import cli
from rmqdump.codec.record import Message
from rmqdump.errors import FormatError
from rmqdump.fast import render as fastrender
from rmqdump.fast.walk import FastWalk, RecordBatch
from rmqdump.rows.filters import RecordFilter
from rmqdump.store.commitlog import CommitLog

STORE = FIXTURES / "store"
#: the fixture's TopicBig bodies: zlib (two sysflag spellings), lz4 and zstd, each inflating to "... alpha ..."
COMPRESSED_ALPHA = [4901, 5136, 5378, 5638]


def messages(store=STORE) -> list[Message]:
    return [m for m in CommitLog.open(store / "commitlog").walk() if isinstance(m, Message)]


def offsets(out: bytes) -> list[int]:
    return [json.loads(line)["offset"] for line in out.splitlines()]


@pytest.fixture
def renderer_batches(monkeypatch):
    calls = {"n": 0}
    orig = fastrender.JsonlRenderer.write_batch

    def write_batch(self, *a, **kw):
        calls["n"] += 1
        return orig(self, *a, **kw)

    monkeypatch.setattr(fastrender.JsonlRenderer, "write_batch", write_batch)
    return calls


@pytest.mark.parametrize("fast", [False, True], ids=["pure", "compiled"])
def test_scan_body_contains_sees_decompressed_bodies(monkeypatch, renderer_batches, fast):
    monkeypatch.setenv("RMQDUMP_FAST", "1" if fast else "0")
    expected = [m.offset for m in messages() if b"alpha" in m.decompressed_body()]
    assert expected == COMPRESSED_ALPHA  # all stored compressed; the zlib streams do not hold the text as is
    assert [m.offset for m in messages() if b"alpha" in m.body] == [5378, 5638]  # lz4, zstd literals
    res = CliRunner().invoke(cli, ["scan", STORE.as_posix(), "-f", "jsonl", "--body", "none",
                                   "--body-contains", "alpha", "-q"])
    assert res.exit_code == 0, res.output
    assert offsets(res.stdout_bytes) == expected
    assert (renderer_batches["n"] > 0) == fast  # the compiled path filters bodies itself


@pytest.mark.parametrize("fast", [False, True], ids=["pure", "compiled"])
def test_scan_body_regex_and_repeated_contains(monkeypatch, fast):
    monkeypatch.setenv("RMQDUMP_FAST", "1" if fast else "0")

    def scan(*args):
        res = CliRunner().invoke(cli, ["scan", STORE.as_posix(), "-f", "jsonl", "-q", *args])
        assert res.exit_code == 0, res.output
        return offsets(res.stdout_bytes)

    msgs = messages()
    hello = [m.offset for m in msgs if re.search(r"Hello RocketMQ 2\d$", m.body.decode("utf-8", "replace"))]
    assert len(hello) == 10 and scan("--body-regex", r"Hello RocketMQ 2\d$") == hello
    unicode = [m.offset for m in msgs if "ключ" in m.body.decode("utf-8", "replace")]
    assert len(unicode) == 1 and scan("--body-regex", r"ключ$") == unicode
    # repeated --body-contains: any of them; with --topic: both criteria
    either = [m.offset for m in msgs if b"alpha" in m.decompressed_body() or b"batch body 3" in m.body]
    assert len(either) == 5 and scan("--body-contains", "alpha", "--body-contains", "batch body 3") == either
    assert scan("--body-contains", "alpha", "--topic", "TopicBatch") == []


@pytest.mark.parametrize("name", ["store", "oracle/498-multi-topic/store", "oracle/533-v2/store",
                                  "oracle/498-healthy-tx-v6/store"])
def test_batch_mask_equals_match(name):
    root = FIXTURES / name
    cl = CommitLog.open(root / "commitlog")
    pure = [m for m in cl.walk() if isinstance(m, Message)]
    hits = 0
    for flt in (RecordFilter(body_contains=("1",)), RecordFilter(body_regex=r"^\w+ \w+ \d$"),
                RecordFilter(body_contains=("a", "e"), body_regex="[0-9]{2}"), RecordFilter(body_regex="^$"),
                RecordFilter(topics=("TopicTest",), body_regex="."), RecordFilter(body_contains=("t",))):
        want = [m.offset for m in pure if flt.match(m)]
        hits += len(want)
        got = []
        for item in FastWalk(cl, read_body=False).batches():
            if isinstance(item, RecordBatch):
                got += item.offsets[flt.batch_mask(item)].tolist()
        assert got == want, (name, flt)
    assert 0 < hits < 6 * len(pure)


@pytest.mark.parametrize("fast", ["0", "1"])
def test_export_body_filter(monkeypatch, tmp_path, fast):
    pytest.importorskip("pyarrow")
    monkeypatch.setenv("RMQDUMP_FAST", fast)
    out = tmp_path / "out.jsonl"
    res = CliRunner().invoke(cli, ["export", STORE.as_posix(), "--to", out.as_posix(), "--body-contains", "alpha",
                                   "-q"])
    assert res.exit_code == 0, res.output
    assert sorted(json.loads(line)["offset"] for line in out.read_text().splitlines()) == COMPRESSED_ALPHA


@pytest.mark.parametrize("command", [["scan"], ["export", "--to", "x.jsonl"]])
def test_bad_regex_is_one_line_exit_2(tmp_path, command):
    args = [command[0], STORE.as_posix(), *command[1:], "--body-regex", "(unclosed"]
    if command[0] == "export":
        args[args.index("x.jsonl")] = (tmp_path / "x.jsonl").as_posix()
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 2
    assert res.stderr.strip().count("\n") == 0 and "bad body regex" in res.stderr, res.stderr
    with pytest.raises(FormatError):
        RecordFilter(body_regex="[")


def test_match_refuses_a_message_read_without_body():
    m = next(m for m in CommitLog.open(STORE / "commitlog").walk(read_body=False) if isinstance(m, Message))
    with pytest.raises(ValueError):
        RecordFilter(body_contains=("x",)).match(m)
