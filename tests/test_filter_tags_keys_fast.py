"""``scan`` and ``export`` with ``--tag``/``--key`` take the compiled path (``RecordFilter.batch_mask``: only rows whose
properties hold a wanted text are decoded and judged) and print what the pure path prints, byte for byte.

Stores: the bundled ones, with tags and keys taken from their records (and a client id, a prefix of a key, a
tag no record has), alone, together and with a topic; and a store written here with non-ASCII and repeated
properties and text that is not valid UTF-8.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from twins import STORES, store_id

from rmqdump.cli import cli
from rmqdump.codec.record import Message
from rmqdump.fast import render as fastrender
from rmqdump.fast.engine import fast_available
from rmqdump.store.root import Store
from rmqdump.write.message import MessageSpec
from rmqdump.write.writer import StoreWriter

pytestmark = pytest.mark.skipif(not fast_available(), reason="numba/numpy not installed")



def _records(store: Path) -> list[Message]:
    return [r for r in Store.open(store).commitlog.walk(check_crc=False) if isinstance(r, Message)]


def _filters(recs: list[Message]) -> list[list[str]]:
    tagged = [r for r in recs if r.tags][:: max(1, len(recs) // 5)][:5]
    keyed = [r for r in recs if r.keys][:: max(1, len(recs) // 5)][:5]
    out = [["--tag", "no-such-tag"]]
    for r in tagged:
        out += [["--tag", r.tags], ["--tag", r.tags, "--topic", r.topic]]
    for r in keyed:
        out += [["--key", r.keys[-1]], ["--key", r.keys[0], "--key", "nope"]]
        if len(r.keys[0]) > 1:  # a prefix of the key, which must not match (a one-letter key has none)
            out.append(["--key", r.keys[0][:-1]])
        if r.tags:
            out.append(["--key", r.keys[0], "--tag", r.tags])
    out += [["--key", r.uniq_key] for r in recs if r.uniq_key][:2]
    return out


def _run(monkeypatch, flag: str, args: list[str], tmp_path: Path) -> tuple[bytes, bytes, int]:
    monkeypatch.setenv("RMQDUMP_FAST", flag)
    calls = []
    orig = fastrender.JsonlRenderer.write_batch

    def write_batch(self, *a, **kw):
        calls.append(1)
        return orig(self, *a, **kw)

    monkeypatch.setattr(fastrender.JsonlRenderer, "write_batch", write_batch)
    res = CliRunner().invoke(cli, ["scan", "-f", "jsonl", "-q", *args])
    assert res.exit_code in (0, 1), res.output
    out = tmp_path / f"export-{flag}.jsonl"
    out.unlink(missing_ok=True)
    ex = CliRunner().invoke(cli, ["export", "-q", *args, "--to", str(out)])
    assert ex.exit_code in (0, 1), ex.output
    return res.stdout_bytes, out.read_bytes() if out.exists() else b"", len(calls)


def _same(store: Path, filters: list[list[str]], monkeypatch, tmp_path: Path) -> int:
    hits = 0
    for f in filters:
        args = [str(store), *f]
        pure = _run(monkeypatch, "0", args, tmp_path)
        fast = _run(monkeypatch, "1", args, tmp_path)
        assert pure[2] == 0 and fast[2] > 0, f
        assert fast[0] == pure[0], f
        assert fast[1] == pure[1], f
        hits += bool(pure[0])
    return hits


@pytest.mark.parametrize("store", STORES, ids=store_id)
def test_tag_and_key_filters_alike(store, monkeypatch, tmp_path):
    filters = _filters(_records(store))
    hits = _same(store, filters, monkeypatch, tmp_path)
    assert hits or len(filters) == 1


def test_awkward_properties_alike(tmp_path, monkeypatch):
    root = tmp_path / "s"
    specs = [
        MessageSpec("T", b"a", tags="caf\u00e9", keys="\u00fcber k1"),
        MessageSpec("T", b"b", properties_raw=b"TAGS\x01x\x02TAGS\x01y\x02KEYS\x01k1 k2"),  # a repeated TAGS
        MessageSpec("T", b"c", properties_raw=b"TAGS\x01y\xff\x02KEYS\x01k1\xfe"),  # not UTF-8
        MessageSpec("T", b"d", tags="y", keys="k1k2 yy"),
        MessageSpec("U", b"e", tags="y", keys="k1"),
    ]
    with StoreWriter(root, commitlog_file_size=4096, build_index=False, clock=lambda: 1_700_000_000_000) as w:
        for _ in range(5):
            for s in specs:
                w.append(s)
        w.sync()
    filters = [["--tag", "y"], ["--tag", "caf\u00e9"], ["--key", "k1"], ["--key", "k2"], ["--key", "\u00fcber"],
               ["--key", "k1\ufffd"], ["--tag", "y\ufffd"], ["--tag", "y", "--key", "k1", "--topic", "T"]]
    assert _same(root, filters, monkeypatch, tmp_path) >= 6
