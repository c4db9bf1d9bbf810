"""`rmqdump bundle`: a support bundle of a real store copy: contents, no secrets, no data unless asked,
written only outside the store, and the store left byte-identical."""

from __future__ import annotations

import hashlib
import json
import os
import tarfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_fingerprint import FIXTURES, copy_store

from rmqdump.analysis.bundle import STRIPPED, strip_json, strip_text
from rmqdump.cli import cli

SECRETS = ("RocketMQ-ak-7f3e", "sk-12345678-secret", "hunter2-pw", "swordfish-inline", "tok-abcdef", "jsonsecret-99")
ACL = f"""globalWhiteRemoteAddresses:
  - 10.10.103.*
accounts:
  - accessKey: {SECRETS[0]}
    secretKey: "{SECRETS[1]}"
    whiteRemoteAddress:
    admin: false
"""
PROPS = f"brokerName=broker-a\nstorePassword = {SECRETS[2]}\njdbcUrl=jdbc:mysql://h/db?user=u&password={SECRETS[3]}\n"
EXTRA = {"auth": {"token": SECRETS[4], "host": "10.0.0.1"}, "users": [{"name": "x", "secretKey": SECRETS[5]}]}


@pytest.fixture
def store(tmp_path) -> Path:
    s = copy_store(FIXTURES / "store", tmp_path / "store")
    (s / "config" / "plain_acl.yml").write_text(ACL)
    (s / "config" / "broker.properties").write_text(PROPS)
    (s / "config" / "extra.json").write_text(json.dumps(EXTRA))
    return s


def tree_hashes(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            st = os.lstat(p)
            digest = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
            out[str(p.relative_to(root))] = (st.st_mode, st.st_size, st.st_mtime_ns, digest)
    return out


def members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def bundle(*args: str):
    return CliRunner().invoke(cli, ["bundle", *args])


def test_bundle_contents_without_secrets_or_data(store, tmp_path):
    before = tree_hashes(store)
    out = tmp_path / "out" / "b.tar.gz"
    out.parent.mkdir()
    res = bundle(str(store), "--to", str(out))
    assert res.exit_code == 0, res.output
    assert tree_hashes(store) == before  # read only: every file and directory as it was
    got = members(out)
    for name in ("manifest.json", "layout.json", "geometry.json", "checkpoint.json", "info.json", "verify.json",
                 "evidence.json", "config/topics.json", "config/plain_acl.yml", "config/broker.properties",
                 "config/extra.json"):
        assert name in got, sorted(got)
        assert name in res.output
    assert not any(n.startswith("data/") for n in got)
    for name, data in got.items():
        for secret in SECRETS:
            assert secret.encode() not in data, (name, secret)
    assert got["config/plain_acl.yml"].decode().count(STRIPPED) == 2
    assert "10.10.103.*" in got["config/plain_acl.yml"].decode()  # what is not a secret stays
    assert json.loads(got["config/extra.json"]) == {
        "auth": {"token": STRIPPED, "host": "10.0.0.1"}, "users": [{"name": "x", "secretKey": STRIPPED}]}
    props = got["config/broker.properties"].decode()
    assert f"storePassword = {STRIPPED}" in props and f"password={STRIPPED}" in props and "brokerName=broker-a" in props
    # no commitlog bytes: neither a record's body nor its header
    seg = (store / "commitlog" / "00000000000000000000").read_bytes()
    for name, data in got.items():
        assert seg[:64] not in data and b"Hello RocketMQ" not in data, name
    layout = {e["path"]: e for e in json.loads(got["layout.json"])["entries"]}
    assert layout["commitlog/00000000000000000000"]["size"] == 4096
    assert layout["commitlog/00000000000000000000"]["type"] == "file" and "sparse" in layout["commitlog/00000000000000000000"]
    verify = json.loads(got["verify.json"])
    assert verify["exit_code"] == 0 and verify["summary"]["records"] == 69
    assert json.loads(got["info.json"])["commitlog"]["max_offset"] == 12288 + 1560
    ev = json.loads(got["evidence.json"])
    assert any(f["path"].endswith("commitlog/00000000000000000000") and len(f["sha256"]) == 64 for f in ev["files"])
    manifest = json.loads(got["manifest.json"])
    assert manifest["version"] and manifest["store"] == str(store)
    assert [p.name for p in out.parent.iterdir()] == ["b.tar.gz"]  # no temporary file left


def test_with_data_adds_store_files_but_never_raw_config(store, tmp_path):
    before = tree_hashes(store)
    out = tmp_path / "b.tar.gz"
    res = bundle(str(store), "--to", str(out), "--with-data", "--no-evidence", "-f", "json")
    assert res.exit_code == 0, res.output
    assert tree_hashes(store) == before
    got = members(out)
    assert got["data/commitlog/00000000000000000000"] == (store / "commitlog" / "00000000000000000000").read_bytes()
    assert "data/consumequeue/TopicTest/0/00000000000000000000" in got
    assert not any(n.startswith("data/config") for n in got) and "evidence.json" not in got
    for data in got.values():
        for secret in SECRETS:
            assert secret.encode() not in data
    assert json.loads(res.stdout)["with_data"] is True


def test_refuses_inside_the_store(store):
    before = tree_hashes(store)
    for target in (store / "b.tar.gz", store / "commitlog" / "b.tar.gz", store / "config" / "b.tar.gz"):
        res = bundle(str(store), "--to", str(target))
        assert res.exit_code == 2, res.output
        assert "must not be inside the store" in res.output and "Traceback" not in res.output
    assert tree_hashes(store) == before


def test_sparse_file_is_flagged(store, tmp_path):
    cq = store / "consumequeue" / "TopicTest" / "0" / "00000000000000000000"
    os.truncate(cq, 8 << 20)  # a hole after the written units
    if os.stat(cq).st_blocks * 512 >= 8 << 20:
        pytest.skip("this filesystem allocates holes")
    out = tmp_path / "b.tar.gz"
    assert bundle(str(store), "--to", str(out), "--no-evidence").exit_code == 0
    layout = {e["path"]: e for e in json.loads(members(out)["layout.json"])["entries"]}
    assert layout["consumequeue/TopicTest/0/00000000000000000000"]["sparse"] is True
    assert layout["commitlog/00000000000000000000"]["sparse"] is False


def test_an_existing_bundle_is_replaced(store, tmp_path):
    out = tmp_path / "b.tar.gz"
    out.write_bytes(b"old")
    assert bundle(str(store), "--to", str(out), "--no-evidence").exit_code == 0
    assert "manifest.json" in members(out)


def test_strip_rules():
    assert strip_json({"a": {"secretKey": "x", "n": 1}, "Password": None, "accessKeys": ["k1", "k2"]}) == {
        "a": {"secretKey": STRIPPED, "n": 1}, "Password": None, "accessKeys": [STRIPPED, STRIPPED]}
    assert strip_json({"url": "http://h?token=abc&x=1"}) == {"url": f"http://h?token={STRIPPED}&x=1"}
    assert strip_text("  - accessKey: ak\nname: b\n") == f"  - accessKey: {STRIPPED}\nname: b\n"
    assert strip_text('"secretKey" : "v",\r\n') == f'"secretKey" : {STRIPPED}\r\n'
