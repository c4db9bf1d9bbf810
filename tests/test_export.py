"""Single-machine export (rmqdump.rows.arrow + rmqdump.rows.export + `rmqdump export`), no Spark."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from conftest import REAL, real_store
from rmqdump.cli import cli
from rmqdump.codec.encoder import choose_magic, encode_fields, properties_bytes
from rmqdump.rows.arrow import RECORD_SCHEMA, SegmentReport, record_batches
from rmqdump.rows.export import NAME_MAX, export, partition_dir_name
from rmqdump.rows.schema import FIELDS


def scan_rows(path: Path, *extra: str) -> list[dict]:
    """`rmqdump scan --format jsonl` output (bodies base64)."""
    res = CliRunner().invoke(cli, ["scan", str(path), "-f", "jsonl", "-q", *extra])
    assert res.exit_code in (0, 1), res.output
    return [json.loads(line) for line in res.stdout.splitlines()]


def as_scan(row: dict) -> dict:
    """An exported row reduced to the scan JSONL fields, rendered like scan renders them."""
    out = {k: row[k] for k in FIELDS}
    if isinstance(out["properties"], list):  # Arrow map -> list of pairs
        out["properties"] = dict(out["properties"])
    if isinstance(out["body"], bytes):
        out["body"] = base64.b64encode(out["body"]).decode("ascii")
    return out


def test_schema_follows_the_jsonl_fields():
    assert RECORD_SCHEMA.names[:len(FIELDS)] == list(FIELDS)
    assert RECORD_SCHEMA.names[len(FIELDS):] == ["broker", "store", "segment", "crc_ok", "store_time"]


@pytest.mark.parametrize("name", ["clean", "crash_kill9"])
def test_parquet_export_equals_scan(tmp_path, name):
    store = real_store(name)
    res = export(store, tmp_path / "out.parquet", include_body=True)
    table = pq.read_table(tmp_path / "out.parquet")
    assert table.schema.equals(RECORD_SCHEMA)
    rows = table.to_pylist()
    expected = scan_rows(store)
    assert len(rows) == res.rows == len(expected) > 200
    assert [as_scan(r) for r in rows] == expected
    assert {r["broker"] for r in rows} == {name}
    assert all(r["segment"].endswith(r["file"]) and os.path.isfile(r["segment"]) for r in rows)
    assert all(r["crc_ok"] for r in rows if r["body_length"] > 0)
    assert all(r["store_time"].timestamp() * 1000 == r["store_timestamp"] for r in rows)


def test_export_cli_jsonl_same_columns(tmp_path):
    store = real_store("clean")
    out = tmp_path / "clean.jsonl"
    res = CliRunner().invoke(cli, ["export", str(store), "--to", str(out), "--body", "-q"])
    assert res.exit_code == 0, res.output
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [list(r) for r in lines[:1]] == [list(RECORD_SCHEMA.names)]
    assert [{k: r[k] for k in FIELDS} for r in lines] == scan_rows(store)
    assert lines[0]["store_time"].startswith("2026-11-21T")


def test_damaged_store_each_segment_to_its_own_end(tmp_path):
    """corrupt_crc: the first segment stops at the flipped body (like scan), the second is still read."""
    store = real_store("corrupt_crc")
    meta = json.loads((REAL / "corrupt_crc.json").read_text())
    bad = meta["corrupted_record_commitLogOffset"]
    reports: list[SegmentReport] = []
    rows = pa.Table.from_batches(list(record_batches(store, include_body=True, on_segment=reports.append)),
                                 schema=RECORD_SCHEMA).to_pylist()
    scan = scan_rows(store)  # scan stops at the damage
    assert [as_scan(r) for r in rows if r["offset"] < bad] == scan
    assert scan[-1]["offset"] + scan[-1]["size"] == bad
    assert [(r.stop_kind, r.stop_offset) for r in reports] == [("body_crc", bad), ("end_of_data", 397358)]
    assert min(r["offset"] for r in rows if r["offset"] > bad) == 262144
    # --crc flag keeps walking and marks the damaged record
    flagged = pa.Table.from_batches(list(record_batches(store, crc="flag")), schema=RECORD_SCHEMA).to_pylist()
    assert [r["offset"] for r in flagged if r["crc_ok"] is False] == [bad]
    assert len(flagged) == len(scan_rows(real_store("clean")))
    # the CLI says so and exits 1
    res = CliRunner().invoke(cli, ["export", str(store), "--to", str(tmp_path / "x.parquet")])
    assert res.exit_code == 1
    assert f"stopped at damage at offset {bad}: body_crc" in res.stderr


HOSTILE = ["../../escape", "/abs/olute", "a\0b", "..", ".", "x" * 300, "\u00e9" * 200, "%RETRY%g",
           "a/../../b", "topic=evil", "~tilde", "\\back", "", "x" * 299 + "y", "\u00e9" * 127 + "a"]


def test_partition_dir_names_are_safe_and_distinct():
    names = [partition_dir_name("topic", v) for v in HOSTILE]
    assert len(set(names)) == len(HOSTILE)
    for v, n in zip(HOSTILE, names, strict=True):
        assert n.startswith("topic=") and "/" not in n and "\0" not in n
        assert len(n.encode("utf-8")) <= NAME_MAX
        if len(n.encode("utf-8")) < NAME_MAX - 20 and v:
            assert unquote(n[len("topic="):]) == v  # Spark/pyarrow decode it back
    assert partition_dir_name("topic", None) == partition_dir_name("topic", "") == "topic=__HIVE_DEFAULT_PARTITION__"
    with pytest.raises(ValueError):
        partition_dir_name("../x", "a")


def _write_store(root: Path, topics: list[str]) -> Path:
    """A one-segment store holding one record per topic (V2 magic for long topics)."""
    cl = root / "commitlog"
    cl.mkdir(parents=True)
    data = bytearray()
    for i, t in enumerate(topics):
        raw = t.encode("utf-8")
        data += encode_fields(topic=raw, body=f"body {i}".encode(), properties=properties_bytes({"KEYS": f"k{i}"}),
                              queue_offset=i, physical_offset=len(data), store_timestamp=1_700_000_000_000 + i,
                              magic=choose_magic(t))
    (cl / "00000000000000000000").write_bytes(bytes(data) + bytes(65536 - len(data)))
    return root


def test_partitioned_export_never_escapes(tmp_path):
    topics = [t for t in HOSTILE if t]
    store = _write_store(tmp_path / "store", topics)
    out = tmp_path / "deep" / "out"
    res = export(store, out, partition_by="topic,date", include_body=True)
    assert res.rows == len(topics)
    files = [Path(dp) / f for dp, _, fs in os.walk(tmp_path) for f in fs]
    written = [f for f in files if f.suffix == ".parquet"]
    assert len(written) == len(topics)
    for f in written:
        assert f.resolve().is_relative_to(out.resolve())
        assert len(f.parent.parent.name.encode()) <= NAME_MAX
    assert sorted(p.name for p in tmp_path.iterdir()) == ["deep", "store"]
    assert sorted(p.name for p in (tmp_path / "deep").iterdir()) == ["out"]
    # the files keep the exact topics; pyarrow's hive discovery decodes the short directory names back
    exact = ds.dataset([str(f) for f in written], format="parquet").to_table().column("topic").to_pylist()
    assert sorted(exact) == sorted(topics)
    hive = ds.dataset(str(out), format="parquet", partitioning="hive").to_table()
    dirs = {(r["offset"], r["topic"]) for r in hive.select(["offset", "topic"]).to_pylist()}
    short = {t for t in topics if len(partition_dir_name("topic", t).encode()) < NAME_MAX - 20}
    assert short <= {t for _, t in dirs}
    assert (out / "_SUCCESS").exists()


def test_output_checks(tmp_path):
    store = real_store("clean")
    out = tmp_path / "a.parquet"
    export(store, out)
    from rmqdump.errors import RmqdumpError

    with pytest.raises(RmqdumpError, match="exists"):
        export(store, out)
    assert export(store, out, overwrite=True, flt=None).rows > 0
    with pytest.raises(RmqdumpError, match="format"):
        export(store, tmp_path / "a.csv")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("keep")
    with pytest.raises(RmqdumpError, match="not empty"):
        export(store, tmp_path / "full", partition_by="topic")
    assert (tmp_path / "full" / "x").read_text() == "keep"
    assert not [p for p in tmp_path.rglob("*.inprogress")]


def _fast_available() -> bool:
    try:
        from rmqdump.fast import walk as fastwalk
    except ImportError:
        return False
    return fastwalk.fast_available()


def _hostile_store(root: Path) -> Path:
    """Records the vectorised builder must treat exactly like the per-record path."""
    cl = root / "commitlog"
    cl.mkdir(parents=True)
    props = [b"", b"KEYS\x01a  b \x02TAGS\x01t", b"a\x01b\x02a\x01c\x02a\x01", b"\x01x\x02y\x01\x02\x02z\x01\x01\x01",
             b"KEYS\x01k\x02KEYS\x01k2 k3\x02TAGS\x01\x02UNIQ_KEY\x01u", "TAGS\x01\u00e9\u4e2d\x02KEYS\x01\u00e9 x".encode(),
             b"x\x01y\x00z\x02TAGS\x01a\x00", b"DELAY\x013\x02TAGS\x01q", b"\x02\x02", b"k\x01v\x01w"]
    data = bytearray()
    i = 0
    for topic in (b"T", b"SCHEDULE_TOPIC_XXXX", "\u00e9".encode(), b"a\x00b"):
        for p in props:
            data += encode_fields(topic=topic, body=b"b%d" % i, properties=p, queue_id=i % 3, queue_offset=i,
                                  physical_offset=len(data), born_port=1000 + i % 2,
                                  store_timestamp=1_700_000_000_000 + i * 1000 if i % 7 else -5)
            i += 1
    size = 1 << 20
    (cl / "00000000000000000000").write_bytes(bytes(data) + bytes(size - len(data)))
    # the second segment needs the per-record path: undecodable properties, an IPv6 born host
    tail = encode_fields(topic=b"T", body=b"x", properties=b"K\x01\xff\xfe", physical_offset=size)
    tail += encode_fields(topic=b"T", body=b"x", properties=b"K\x01v", physical_offset=size + len(tail),
                          sys_flag=0x10, born_addr=bytes(15) + b"\x01")
    (cl / f"{size:020d}").write_bytes(tail + bytes(size - len(tail)))
    return root


@pytest.mark.skipif(not _fast_available(), reason="compiled fast walk unavailable (numba/numpy)")
def test_vectorised_path_equals_per_record_path(tmp_path):
    from rmqdump.rows.arrow import read_split, segment_splits
    from rmqdump.rows.filters import RecordFilter

    stores = [real_store(n) for n in ("clean", "crash_torn", "corrupt_crc")] + [_hostile_store(tmp_path / "h")]
    filters = [None, RecordFilter(topics=("T", "TopicTest")), RecordFilter(keys=("k2", "b", "key-5")),
               RecordFilter(tags=("t", "TagA")), RecordFilter(queue_id=1, since=1_700_000_005_000)]
    for split in segment_splits(stores):
        for flt in filters:
            for opts in ({}, {"include_body": True, "decompress": True}, {"crc": "off"}):
                runs = []
                for fast in (False, True):
                    reports: list[SegmentReport] = []
                    batches = list(read_split(split, fast=fast, flt=flt, on_segment=reports.append, **opts))
                    runs.append((pa.Table.from_batches(batches, schema=RECORD_SCHEMA),
                                 [(r.stop_kind, r.stop_offset, r.records, r.rows) for r in reports]))
                assert runs[0][0].equals(runs[1][0]), (split.path, flt, opts)
                assert runs[0][1] == runs[1][1]
    first, second = segment_splits([tmp_path / "h"])
    assert sum(b.num_rows for b in read_split(first, fast=True)) == 40
    assert sum(b.num_rows for b in read_split(second, fast=True)) == 2


def _store_with_a_bad_compressed_body(tmp_path):
    """Three records; the middle one says zstd (sysflag) but its body is not zstd, with a valid BODYCRC
    (the broker serves it; a consumer fails to decompress it)."""
    import zlib as _z

    from rmqdump.codec.encoder import encode_fields
    from rmqdump.codec.layout import COMPRESSED_FLAG, COMPRESSION_ZSTD_TYPE

    root = tmp_path / "store"
    (root / "commitlog").mkdir(parents=True)
    data = bytearray()
    for i, (body, flag) in enumerate(((b"plain-0", 0), (b"not zstd at all", COMPRESSED_FLAG | COMPRESSION_ZSTD_TYPE),
                                      (_z.compress(b"plain-2"), COMPRESSED_FLAG))):
        data += encode_fields(topic=b"T", body=body, properties=b"", queue_offset=i, physical_offset=len(data),
                              sys_flag=flag, store_timestamp=1795297000000 + i, born_timestamp=1795297000000)
    (root / "commitlog" / "00000000000000000000").write_bytes(bytes(data) + bytes((1 << 16) - len(data)))
    return root


@pytest.mark.parametrize("fast", ["0", "1"])
def test_a_body_that_will_not_decompress_is_a_row_finding(tmp_path, fast):
    """`export --body --decompress` and `scan --decompress` go on past a body that does not decompress: every
    record is there, that body as stored, the record named on stderr; export exits 1 (a finding)."""
    import json as _json

    from secutil import run_cli

    store = _store_with_a_bad_compressed_body(tmp_path)
    env = {"RMQDUMP_FAST": fast}
    r = run_cli(["export", store, "--to", tmp_path / "o.jsonl", "--body", "--decompress", "--keep-going"],
                timeout=120, env=env)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.describe()
    rows = [_json.loads(x) for x in (tmp_path / "o.jsonl").read_text().splitlines()]
    assert len(rows) == 3 and "offset 0" not in r.stderr and "body exported as stored" in r.stderr, r.describe()
    s = run_cli(["scan", store, "--decompress", "--body", "text", "-f", "jsonl"], timeout=120, env=env)
    assert s.returncode == 0 and "Traceback" not in s.stderr, s.describe()
    bodies = [_json.loads(x)["body"] for x in s.stdout.splitlines()]
    assert bodies == ["plain-0", "not zstd at all", "plain-2"], bodies
    assert "body shown as stored" in s.stderr, s.describe()
