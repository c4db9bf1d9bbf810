"""Names from a store never escape an output directory.

Stores are built with hostile topics written straight into the commitlog (as RocketMQ itself
stores them before failing to create their consume queue): ``../../x``, absolute paths,
NUL bytes, ``.``/``..``, separators, names over 255 bytes (V2 records), control characters.
Every writer of output trees runs over them: ``export --partition-by`` and
``repair --rebuild-cq/--rebuild-index --to``. Nothing may appear outside the output
directory, no entry inside it may be a link or a name over 255 bytes, and the exported
data must keep every topic exactly.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from secutil import build_store, props, run_cli, snapshot

from rmqdump.cli import COMMANDS
from rmqdump.disk.paths import (
    NAME_MAX,
    check_no_symlinks,
    decode_component,
    encode_component,
    ensure_within,
    is_safe_component,
    safe_child,
)
from rmqdump.errors import StoreError

MARK = "rmqdump-escape-probe"
HOSTILE_TOPICS: list[bytes] = [
    b"TopicOK",
    f"../../{MARK}".encode(),
    f"../../../../../../../../tmp/{MARK}-abs".encode(),
    f"/tmp/{MARK}-absolute".encode(),
    f"a\x00{MARK}".encode(),
    b".",
    b"..",
    f"dir/{MARK}".encode(),
    f"..\\..\\{MARK}".encode(),
    b"%2e%2e",
    b"t\x1b[31m\x07\r\n",
    b"\xff\xfe invalid utf-8",
    b"",
    # last: V2 records (2-byte topic length), where a 4.9 broker's recovery stops
    b"x" * 300,  # over NAME_MAX
    ("\u00e9" * 200).encode(),  # 400 UTF-8 bytes
]


@pytest.fixture
def hostile_store(tmp_path) -> Path:
    root = tmp_path / "sandbox" / "store"
    build_store(root, [(t, b"body-%d" % i, props(KEYS=f"k{i}", TAGS="t")) for i, t in enumerate(HOSTILE_TOPICS)])
    return root


def _all_entries(root: Path) -> list[Path]:
    out = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        out += [Path(dirpath) / n for n in dirnames + filenames]
    return out


def _assert_contained(sandbox: Path, out: Path, before: dict) -> None:
    """Only ``out`` changed under ``sandbox``; nothing leaked to /tmp; ``out`` holds no links or long names."""
    after = snapshot(sandbox)
    changed = [k for k in set(before) | set(after) if before.get(k) != after.get(k)]
    rel_out = str(out.relative_to(sandbox))
    ancestors = {str(p.relative_to(sandbox)) for p in out.parents if sandbox in p.parents}
    outside = [k for k in changed
               if k != "." and k != rel_out and k not in ancestors and not k.startswith(rel_out + os.sep)]
    assert not outside, f"written outside {out}: {outside}"
    leaked = [p for p in Path("/tmp").iterdir() if MARK in p.name] + [p for p in Path("/").iterdir() if MARK in p.name]
    assert not leaked, leaked
    for p in _all_entries(out):
        st = os.lstat(p)
        assert not stat.S_ISLNK(st.st_mode), f"link in output: {p}"
        assert len(os.fsencode(p.name)) <= NAME_MAX, p
        assert os.path.realpath(p).startswith(os.path.realpath(out) + os.sep), p


def _require(cmd: str) -> None:
    if cmd not in COMMANDS:
        pytest.skip(f"command {cmd!r} is not registered yet (rmqdump {cmd} missing)")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_export_partition_by_topic_stays_inside(hostile_store, fmt):
    _require("export")
    pytest.importorskip("pyarrow", reason="rmqdump export needs pyarrow (export extra)")
    sandbox = hostile_store.parent
    out = sandbox / "out" / "parts"
    before = snapshot(sandbox)
    r = run_cli(["export", hostile_store, "--to", out, "--partition-by", "topic,queue_id", "--format", fmt],
                timeout=120)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.describe()
    _assert_contained(sandbox, out, before)
    # every record is exported once, under a topic=... directory, with its exact topic in the data
    import pyarrow.dataset as ds

    if fmt == "parquet":
        table = ds.dataset(str(out), format="parquet", partitioning=None).to_table(columns=["topic"])
        topics = table.column("topic").to_pylist()
    else:
        import json

        topics = [json.loads(line)["topic"] for f in out.rglob("*.jsonl") for line in f.read_text().splitlines()]
    expected = [t.decode("utf-8", "replace") for t in HOSTILE_TOPICS]
    assert sorted(topics) == sorted(expected)
    tops = [p.name for p in out.iterdir() if p.is_dir()]
    assert all(n.startswith("topic=") for n in tops), tops
    assert len(tops) == len(set(expected))  # distinct topics -> distinct directories


def test_export_partition_by_broker_name_stays_inside(hostile_store):
    """The broker column comes from a directory name (here a hostile one)."""
    _require("export")
    pytest.importorskip("pyarrow", reason="rmqdump export needs pyarrow (export extra)")
    sandbox = hostile_store.parent
    evil = sandbox / "..evil\x1b[31m%2F.."
    hostile_store.rename(evil)
    out = sandbox / "out2"
    before = snapshot(sandbox)
    r = run_cli(["export", evil, "--to", out, "--partition-by", "broker,topic"], timeout=120)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr, r.describe()
    _assert_contained(sandbox, out, before)


@pytest.mark.parametrize("what", ["--rebuild-cq", "--rebuild-index"])
def test_repair_rebuild_to_stays_inside(hostile_store, what):
    _require("repair")
    sandbox = hostile_store.parent
    out = sandbox / "rebuilt"
    before_store = snapshot(hostile_store)
    before = snapshot(sandbox)
    r = run_cli(["repair", hostile_store, what, "--to", out, "-f", "json"], timeout=120)
    assert r.returncode in (0, 1, 2) and "Traceback" not in r.stderr, r.describe()
    if r.returncode == 2:
        assert len([x for x in r.stderr.splitlines() if x.strip()]) == 1, r.stderr
    assert snapshot(hostile_store) == before_store, "--to must not touch the store"
    if out.exists():
        _assert_contained(sandbox, out, before)
    if what == "--rebuild-cq" and r.returncode != 2:
        # the one broker-compatible topic was rebuilt; the hostile ones were not turned into paths
        assert (out / "consumequeue" / "TopicOK" / "0").is_dir(), sorted(map(str, _all_entries(out)))
        names = {p.name for p in (out / "consumequeue").iterdir()}
        assert all(is_safe_component(n) for n in names), names


def test_repair_rebuild_to_refuses_a_symlinked_output(hostile_store, tmp_path):
    """A pre-planted link inside --to (e.g. consumequeue -> elsewhere) is not followed."""
    _require("repair")
    sandbox = hostile_store.parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = sandbox / "rebuilt"
    out.mkdir()
    (out / "consumequeue").symlink_to(elsewhere, target_is_directory=True)
    r = run_cli(["repair", hostile_store, "--rebuild-cq", "--to", out, "-f", "json"], timeout=120)
    assert "Traceback" not in r.stderr, r.describe()
    assert not any(elsewhere.iterdir()), f"followed the link: {list(elsewhere.rglob('*'))}"


# --- paths.py ------------------------------------------------------------------------------------

NAMES = [s.decode("utf-8", "surrogateescape") for s in HOSTILE_TOPICS] + [
    "~", "%", "%25", "a~0123456789abcdef", "\ud800", "\udc80", "\u202e", "\u0085", "a" * 255, "a" * 256,
    "\u00e9" * 127, "\u00e9" * 128, "CON", "nul", " ", "-rf", ".hidden", "...",
]


@pytest.mark.parametrize("name", NAMES, ids=[repr(n)[:40] for n in NAMES])
def test_encode_component_is_always_safe_and_reversible(tmp_path, name):
    enc = encode_component(name)
    assert enc not in ("", ".", "..") and "/" not in enc and "\0" not in enc
    assert len(enc.encode("utf-8")) <= NAME_MAX and is_safe_component(enc)
    assert decode_component(enc) in (name, None)
    (tmp_path / enc).mkdir()  # really creatable, and a direct child
    assert [p.name for p in tmp_path.iterdir()] == [enc]


def test_encode_component_is_injective():
    encs = [encode_component(n) for n in NAMES]
    assert len(set(encs)) == len(set(NAMES))


@pytest.mark.parametrize("name", NAMES, ids=[repr(n)[:40] for n in NAMES])
def test_safe_child_refuses_or_stays_a_direct_child(tmp_path, name):
    try:
        child = safe_child(tmp_path, name)
    except StoreError:
        assert not is_safe_component(name)
        return
    assert child.parent == tmp_path and child.name == name
    child.mkdir()


def test_safe_child_refuses_symlinks(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "out")
    with pytest.raises(StoreError, match="symlink"):
        safe_child(tmp_path, "link")
    assert safe_child(tmp_path, "link", allow_symlink=True) == tmp_path / "link"


def test_ensure_within_and_check_no_symlinks(tmp_path):
    base = tmp_path / "base"
    (base / "a").mkdir(parents=True)
    (base / "ln").symlink_to(tmp_path)
    assert ensure_within(base, base / "a" / "new") == base / "a" / "new"
    with pytest.raises(StoreError):
        ensure_within(base, base / ".." / "x")
    with pytest.raises(StoreError):
        ensure_within(base, base / "ln" / "x")
    check_no_symlinks(base, base / "a" / "missing" / "deeper")
    with pytest.raises(StoreError, match="symlink"):
        check_no_symlinks(base, base / "ln" / "x")
    with pytest.raises(StoreError):
        check_no_symlinks(base, tmp_path / "elsewhere")


def test_export_partition_dir_name_is_safe():
    pytest.importorskip("pyarrow")
    from rmqdump.rows.export import partition_dir_name

    seen = {}
    # names reachable from a store: topics are decoded with "replace", broker names with
    # surrogateescape (so only U+DC80..U+DCFF surrogates)
    for n in (n for n in NAMES if not ("\ud800" <= n[:1] <= "\udc7f" or "\udd00" <= n[:1] <= "\udfff")):
        d = partition_dir_name("topic", n)
        assert d.startswith("topic=") and "/" not in d and "\0" not in d and len(d.encode("utf-8")) <= NAME_MAX, d
        seen.setdefault(d, set()).add(n)
    collisions = {d: s for d, s in seen.items() if len(s) > 1 and not (s <= {""})}
    assert not collisions, collisions


def test_store_writer_refuses_unsafe_topics(tmp_path):
    """The dispatching writer (appender, fixtures) never turns a hostile topic into a path."""
    from rmqdump.write.writer import MessageSpec, StoreWriter

    w = StoreWriter(tmp_path / "s", commitlog_file_size=65536, cq_file_size=600, index_slots=16, index_entries=64)
    for topic in ("../../x", "/abs", ".", "..", "a/b", "x" * 300):
        with pytest.raises(StoreError):
            w.append(MessageSpec(topic=topic, body=b"b"))
            w.sync()
    w.close()
    assert not (tmp_path / "x").exists() and not Path("/abs").exists()
    for p in _all_entries(tmp_path / "s"):
        assert tmp_path / "s" in p.parents
