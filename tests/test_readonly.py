"""Read-only guarantee: every read command leaves every byte, size, mtime and entry of a store as it was.

Read commands are discovered from ``rmqdump.cli.COMMANDS`` (minus the writers); each runs
over copies of the real stores and the fixture store:

* snapshots (sha256, size, mtime_ns, mode of every file; every directory entry and link)
  before and after must be identical;
* an audit hook sees every ``open`` with write flags, rename, remove, mkdir, truncate,
  chmod, utime ... under the store: there must be none;
* with the copy chmod a-w and (as root, where permissions do not bind) bind-mounted
  read-only in a private mount namespace, every command must behave exactly as before.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from secutil import WriteAudit, diff_snapshots, make_read_only, make_writable, ro_mount_prefix, run_cli, snapshot

from conftest import FIXTURES, REAL
from rmqdump.cli import COMMANDS, cli

#: commands that write to the store (never run here; see test_write_safety.py)
WRITE_COMMANDS = {"append"}
#: write commands whose default is a dry run: read-only when run without their write switch
DRY_RUN_BY_DEFAULT = {"repair"}

#: argument lists per command; "{store}" and "{out}" are substituted. Unknown commands get
#: ``[store]`` and ``[store, -f, json]``.
INVOCATIONS: dict[str, list[list[str]]] = {
    "scan": [["{store}", "-f", "jsonl"], ["{store}", "-f", "json", "--keep-going", "--no-mmap", "--body", "hex"],
             ["{store}", "-f", "table", "--body", "text", "--decompress"], ["{store}/commitlog", "-f", "csv"]],
    "info": [["{store}", "-f", "json"], ["{store}", "-f", "table", "--no-mmap"]],
    "verify": [["{store}", "-f", "json"], ["{store}", "-f", "table", "--keep-going", "--no-mmap"]],
    "lookup": [["{store}", "--key", "key-1", "-f", "jsonl"], ["{store}", "--offset", "0", "-f", "json"],
               ["{store}", "--queue", "TopicTest", "0", "0", "-f", "jsonl"],
               ["{store}", "--scan", "--key", "key-1", "-f", "table"],
               ["{store}", "--uniq-key", "FD000000000000000000000000000002000000000000000000000000"]],
    "cq": [["{store}", "-f", "json"], ["{store}", "--topic", "TopicTest", "--queue", "0", "--raw", "-f", "jsonl"],
           ["{store}", "--entries", "-f", "table"]],
    "index": [["{store}", "-f", "json"], ["{store}", "--entries", "-f", "jsonl"], ["{store}", "-f", "table"]],
    "stats": [["{store}", "-f", "json"], ["{store}", "-f", "table"]],
    "pending": [["{store}", "-f", "json"], ["{store}", "-f", "table"]],
    "consumers": [["{store}", "-f", "json"], ["{store}", "-f", "table", "--unconsumed"]],
    "export": [["{store}", "--to", "{out}/export.jsonl", "--body"],
               ["{store}", "--to", "{out}/parts", "--partition-by", "topic,date"]],
    "repair": [["{store}"], ["{store}", "-f", "json"]],
}

STORES = ["clean", "crash_kill9", "crash_torn", "crash_torn_props", "corrupt_crc", "fixture"]


def read_commands() -> list[str]:
    """Read commands (``spark`` is left out: it needs a JVM and runs the same readers)."""
    return sorted(set(COMMANDS) - WRITE_COMMANDS - {"spark"})


def invocations(cmd: str) -> list[list[str]]:
    return INVOCATIONS.get(cmd, [["{store}"], ["{store}", "-f", "json"]])


def source(name: str) -> Path:
    src = FIXTURES / "store" if name == "fixture" else REAL / name
    if not src.is_dir():
        pytest.skip(f"{src} is not available")
    return src


@pytest.fixture
def copy_of(tmp_path):
    def _copy(name: str) -> Path:
        dst = tmp_path / "stores" / name
        shutil.copytree(source(name), dst, symlinks=True)
        make_writable(dst)
        return dst

    return _copy


def _argv(cmd: str, args: list[str], store: Path, out: Path) -> list[str]:
    return [cmd, *(a.replace("{store}", str(store)).replace("{out}", str(out)) for a in args)]


def test_every_command_is_classified():
    """A new command must be read-only (covered below) or listed as a writer here."""
    assert set(COMMANDS) >= WRITE_COMMANDS & set(COMMANDS)
    assert read_commands(), "no read commands registered"


@pytest.mark.parametrize("store_name", STORES)
def test_read_commands_change_nothing(copy_of, tmp_path, store_name):
    store = copy_of(store_name)
    out = tmp_path / "out"
    out.mkdir()
    before = snapshot(store)
    runner = CliRunner()
    problems = []
    ran = {}
    for cmd in read_commands():
        for args in invocations(cmd):
            argv = _argv(cmd, args, store, out)
            with WriteAudit(store) as audit:
                res = runner.invoke(cli, argv, catch_exceptions=True)
            if audit.events:
                problems.append(f"{' '.join(argv)}: wrote to the store: {audit.events[:5]}")
            if res.exception is not None and not isinstance(res.exception, SystemExit):
                problems.append(f"{' '.join(argv)}: raised {type(res.exception).__name__}: {res.exception}")
            if res.exit_code not in (0, 1, 2):
                problems.append(f"{' '.join(argv)}: exit code {res.exit_code}")
            ran.setdefault(cmd, []).append(res.exit_code)
            after = snapshot(store)
            changes = diff_snapshots(before, after)
            if changes:
                problems.append(f"{' '.join(argv)}: changed the store: {changes[:5]}")
                before = after
    assert not problems, "\n".join(problems)
    if store_name == "clean":
        for cmd, codes in ran.items():
            if cmd in INVOCATIONS:
                assert any(c in (0, 1) for c in codes), f"{cmd}: no invocation ran on the clean store ({codes})"


@pytest.mark.parametrize("store_name", ["clean", "fixture"])
def test_read_commands_work_on_a_read_only_store(copy_of, tmp_path, store_name):
    """chmod a-w (and, as root, a read-only bind mount): same exit code as on the writable copy."""
    store = copy_of(store_name)
    out = tmp_path / "out"
    out.mkdir()
    expected = {}
    for cmd in read_commands():
        for args in invocations(cmd)[:2]:
            argv = _argv(cmd, args, store, out)
            r = run_cli(argv, timeout=120)
            expected[tuple(argv)] = r.returncode
            for p in out.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    before = snapshot(store)
    make_read_only(store)
    prefix = ro_mount_prefix(store)
    problems = []
    try:
        for argv, rc in expected.items():
            r = run_cli(list(argv), timeout=120, prefix=prefix)
            if r.returncode != rc or "Traceback" in r.stderr:
                problems.append(f"{r.describe()}\n(expected rc={rc} on the writable copy)")
            for p in out.iterdir():
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    finally:
        make_writable(store)
    after = snapshot(store)
    # modes were changed by this test itself: compare everything but the mode
    strip = {k: v[:-1] if v[0] in ("file", "dir") and len(v) > 2 else v for k, v in before.items() if k != "."}
    strip_after = {k: v[:-1] if v[0] in ("file", "dir") and len(v) > 2 else v for k, v in after.items() if k != "."}
    assert not diff_snapshots({k: v for k, v in strip.items() if v[0] == "file"},
                              {k: v for k, v in strip_after.items() if v[0] == "file"})
    assert not problems, "\n".join(problems)


def test_ro_mount_is_enforced_when_available(copy_of):
    """The read-only mount really refuses writes (else the test above proves less than it says)."""
    store = copy_of("fixture")
    prefix = ro_mount_prefix(store)
    if prefix is None:
        pytest.skip("no private read-only bind mount here (needs root and unshare -m)")
    import subprocess

    r = subprocess.run([*prefix, "sh", "-c", f"echo x >> '{store}/checkpoint'"], capture_output=True)
    assert r.returncode != 0 and b"Read-only" in r.stderr


def test_evidence_manifest_lists_every_file_read(copy_of, tmp_path):
    store = copy_of("clean")
    ev = tmp_path / "ev.json"
    r = run_cli(["--evidence", ev, "verify", store, "-f", "json"], timeout=120)
    assert r.returncode in (0, 1), r.describe()
    import json

    doc = json.loads(ev.read_text())
    files = {e["path"]: e for e in doc["files"]}
    seg = str(store / "commitlog" / "00000000000000000000")
    assert seg in files
    from secutil import sha256_file

    for path, e in files.items():
        p = Path(path)
        assert p.is_file() and (store in p.parents), path
        assert e["size"] == p.stat().st_size and e["sha256"] == sha256_file(p) and e["mtime_ns"] == p.stat().st_mtime_ns
        assert "changed_during_command" not in e
    assert doc["version"] and doc["store"] == str(store)
    assert doc["geometry"]["commitlog"]["file_size"] == 262144
    assert doc["geometry"]["consumequeue_file_size"] == 600
    assert doc["geometry"]["index"]["hash_slot_num"] == 500
    assert doc["opened_for_write"] == []
    # every consume-queue and index file verify reads is listed (it checks them all)
    for p in (store / "consumequeue").rglob("0*"):
        if p.is_file():
            assert str(p) in files, p
    for p in (store / "index").iterdir():
        assert str(p) in files, p


def test_evidence_is_never_written_into_the_store(copy_of):
    store = copy_of("clean")
    before = snapshot(store)
    r = run_cli(["--evidence", store / "ev.json", "info", store, "-f", "json"], timeout=60)
    assert r.returncode == 2 and "inside the store" in r.stderr, r.describe()
    assert not diff_snapshots(before, snapshot(store))


def test_evidence_flags_a_file_that_changes_during_the_command(copy_of, tmp_path):
    """In-process: a segment that grows after it was opened is flagged (live store)."""
    from rmqdump.disk import evidence

    store = copy_of("clean")
    seg = store / "commitlog" / "00000000000000262144"
    evidence.start()
    try:
        evidence.record_read(seg)
        evidence.record_read(store / "checkpoint")
        with open(seg, "ab") as f:  # the broker appends
            f.write(b"\0" * 4096)
        doc = evidence.write_evidence(tmp_path / "ev.json")
    finally:
        evidence.stop()
    by_path = {e["path"]: e for e in doc["files"]}
    assert by_path[str(seg)]["changed_during_command"]["size_at_open"] == 262144
    assert by_path[str(seg)]["size"] == 262144 + 4096
    assert "changed_during_command" not in by_path[str(store / "checkpoint")]


def test_evidence_hash_file_never_reads_special_files(tmp_path):
    """Links are recorded with their target; FIFOs and devices are named, never read (no hang)."""
    import os

    from secutil import sha256_file

    from rmqdump.disk.evidence import hash_file

    f = tmp_path / "f"
    f.write_bytes(b"segment bytes")
    (tmp_path / "link").symlink_to(f)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "zero").symlink_to("/dev/zero")
    assert hash_file(f)["sha256"] == sha256_file(f)
    link = hash_file(tmp_path / "link")
    assert link["symlink_to"] == str(f) and link["sha256"] == sha256_file(f)
    assert "not a regular file" in hash_file(tmp_path / "fifo")["error"]
    zero = hash_file(tmp_path / "zero")
    assert zero["symlink_to"] == "/dev/zero" and "not a regular file" in zero["error"]


def _first_segment(store: Path) -> Path:
    return sorted(p for p in (store / "commitlog").iterdir() if p.is_file())[0]


@pytest.mark.parametrize("target", ["segment", "config", "new_in_root", "symlink_into_store", "hardlink"])
@pytest.mark.parametrize("given", ["root", "commitlog_dir", "segment"])
def test_export_never_writes_into_the_store(copy_of, tmp_path, target, given):
    """`export --to` (also with --overwrite) refuses every path that lands in the store it reads: one of its
    files, a new file in it, a symlink pointing into it, a hard link to one of its files; the store stays
    byte-identical and nothing is written."""
    store = copy_of("fixture")
    seg = _first_segment(store)
    cfg = next(p for p in sorted((store / "config").iterdir()) if p.suffix == ".json")
    outside = tmp_path / "outside"
    outside.mkdir()
    to = {"segment": seg, "config": cfg, "new_in_root": store / "out.jsonl"}.get(target)
    if target == "symlink_into_store":
        to = outside / "link.jsonl"
        to.symlink_to(seg)
    elif target == "hardlink":
        to = outside / "hard.jsonl"
        to.hardlink_to(seg)
    src = {"root": store, "commitlog_dir": store / "commitlog", "segment": seg}[given]
    before = snapshot(store)
    r = run_cli(["export", src, "--to", to, "--format", "jsonl", "--overwrite"], timeout=120)
    assert r.returncode == 2 and ("inside the store" in r.stderr or "hard links" in r.stderr), r.describe()
    assert len(r.stderr.strip().splitlines()) == 1, r.describe()
    assert not diff_snapshots(before, snapshot(store))


def test_spark_export_out_inside_the_store_is_refused_before_spark(copy_of):
    store = copy_of("fixture")
    before = snapshot(store)
    r = run_cli(["spark", "export", store, "--out", store / "exported"], timeout=60)
    assert r.returncode == 2 and "inside the store" in r.stderr, r.describe()
    assert not diff_snapshots(before, snapshot(store))
    assert not (store / "exported").exists()


def test_export_next_to_the_store_still_works(copy_of, tmp_path):
    """The guard refuses only what is in the store: a sibling directory is fine."""
    store = copy_of("fixture")
    r = run_cli(["export", store, "--to", tmp_path / "out.jsonl"], timeout=120)
    assert r.returncode == 0, r.describe()
    assert (tmp_path / "out.jsonl").stat().st_size > 0
