"""checkpoint, config/*.json and the broker lock against the real RocketMQ 4.9.8 stores."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO, manifest, real_store
from rmqdump.broker.lock import StoreLock, probe_lock
from rmqdump.errors import FormatError, LockError, StoreError
from rmqdump.store.checkpoint import (
    Checkpoint,
    decode_checkpoint,
    encode_checkpoint,
    ms_to_iso,
    read_checkpoint,
    write_checkpoint,
)
from rmqdump.store.config import (
    ConsumerOffsets,
    load_config_file,
    load_consumer_offsets,
    load_delay_offsets,
    load_subscription_groups,
    load_topics,
    parse_fastjson,
)

# --- checkpoint ------------------------------------------------------------------------------


def test_checkpoint_clean_matches_store_info():
    (info,) = [x for x in manifest("clean") if x["type"] == "store_info"]
    cp = read_checkpoint(real_store("clean"))
    assert cp.physic_msg_timestamp == info["checkpoint_physicMsgTimestamp"]
    assert cp.logics_msg_timestamp == info["checkpoint_logicsMsgTimestamp"]
    assert cp.index_msg_timestamp == info["checkpoint_indexMsgTimestamp"] == 0
    assert cp.master_flushed_offset == 0 and cp.confirm_phy_offset == 0 and cp.file_size == 4096
    assert cp.min_timestamp == 1795297380545 - 3000
    assert cp.min_timestamp_index == 0
    assert ms_to_iso(cp.physic_msg_timestamp) == "2026-11-21T21:43:00.545Z"
    d = cp.as_dict()
    assert d["minTimestamp_iso"] == "2026-11-21T21:42:57.545Z"


def test_checkpoint_kill9_on_disk_is_zero():
    """The kill -9 store's checkpoint is all zeros on disk; the manifest's logics value was set
    in memory by RocketMQ's recovery (it is 'after recovery'), so only physic/index compare."""
    (info,) = [x for x in manifest("crash_kill9_after_rocketmq_recovery") if x["type"] == "store_info"]
    cp = read_checkpoint(real_store("crash_kill9") / "checkpoint")
    assert cp.fields() == (0, 0, 0, 0, 0)
    assert cp.physic_msg_timestamp == info["checkpoint_physicMsgTimestamp"]
    assert cp.index_msg_timestamp == info["checkpoint_indexMsgTimestamp"]
    assert cp.min_timestamp == 0


def test_checkpoint_sizes_and_roundtrip(tmp_path):
    cp = Checkpoint(1795297380545, 1795297380000, 1795297000000, 7, 397358)
    image = encode_checkpoint(cp)
    assert len(image) == 4096 and image[40:] == bytes(4056)
    assert decode_checkpoint(image).fields() == cp.fields()
    assert cp.min_timestamp == 1795297377000 and cp.min_timestamp_index == 1795297000000
    short = decode_checkpoint(image[:24])
    assert short.fields() == (1795297380545, 1795297380000, 1795297000000, 0, 0) and short.file_size == 24
    with pytest.raises(FormatError):
        decode_checkpoint(image[:23])
    path = tmp_path / "checkpoint"
    path.write_bytes(image[:24])
    assert read_checkpoint(path).file_size == 24
    path.write_bytes(b"\x01" * 10)
    with pytest.raises(FormatError) as info:
        read_checkpoint(path)
    assert info.value.file == str(path)
    # write keeps bytes beyond the fields and grows the file to 4096
    path.write_bytes(b"\xee" * 100)
    write_checkpoint(path, cp)
    data = path.read_bytes()
    assert len(data) == 4096 and data[:40] == image[:40] and data[40:100] == b"\xee" * 60
    assert read_checkpoint(path) == Checkpoint(*cp.fields(), file_size=4096)
    with pytest.raises(StoreError):
        read_checkpoint(tmp_path / "missing")


def test_ms_to_iso_edges():
    assert ms_to_iso(0) == "1970-01-01T00:00:00.000Z"
    assert ms_to_iso(-1) == "1969-12-31T23:59:59.999Z"
    assert ms_to_iso(2**62) == f"{2**62} ms"


# --- config ------------------------------------------------------------------------------------


def test_real_config_files():
    root = real_store("clean")
    delay = load_delay_offsets(root)
    assert delay.data == {1: 1, 2: 1, 3: 3} and not delay.used_backup
    assert delay.path == root / "config" / "delayOffset.json"
    offsets = load_consumer_offsets(root).data
    assert isinstance(offsets, ConsumerOffsets)
    assert offsets.offsets("TopicTest", "cg-test") == {0: 33, 1: 31, 2: 32, 3: 32}
    assert offsets.offsets("%RETRY%cg-test", "cg-test") == {0: 2}
    assert offsets.offsets("RMQ_SYS_TRANS_HALF_TOPIC", "CID_RMQ_SYS_TRANS") == {0: 8}
    assert ("RMQ_SYS_TRANS_OP_HALF_TOPIC", "CID_RMQ_SYS_TRANS", 0, 6) in offsets.rows()
    topics = load_topics(root).data
    assert topics["TopicTest"].read_queue_nums == 4 and topics["TopicTest"].perm == 6
    assert topics["SCHEDULE_TOPIC_XXXX"].write_queue_nums == 18
    assert {"TopicBatch", "TopicTx", "TopicUnicodeProps", "%RETRY%cg-test"} <= set(topics)
    groups = load_subscription_groups(root).data
    assert groups["cg-test"]["retryMaxTimes"] == 16
    kill9 = real_store("crash_kill9")
    assert load_delay_offsets(kill9).data == {}
    assert load_consumer_offsets(kill9).data.table == {}
    missing = load_subscription_groups(kill9)  # no file and no .bak: the broker starts empty
    assert missing.data is None and missing.path is None


def test_fastjson_leniency():
    text = '{"a":"x{1:2, 3:4}","b":{1:1,-2:3,},c:\'q\',"d":[1,2.5,true,null,"\\u00e9",],"e":{}}'
    assert parse_fastjson(text) == {"a": "x{1:2, 3:4}", "b": {1: 1, -2: 3}, "c": "q",
                                    "d": [1, 2.5, True, None, "\u00e9"], "e": {}}
    assert parse_fastjson("   ") is None
    assert parse_fastjson('{"k":"\u4e2d\u6587 1:2"}'.encode()) == {"k": "\u4e2d\u6587 1:2"}
    assert parse_fastjson("{0:250,1:250}") == {0: 250, 1: 250}


@pytest.mark.parametrize("text,offset", [
    ('{"a":1', 6), ('{"a":}', 5), ("{1:x}", 3), ('"abc', 0), ("[1,2", 4), ('{"a" 1}', 5),
    ('{"\u00e9\u00e9":?}', 8), ("[" * 5000, None), ('{"a":1} x', 8), ('{"a":"\\q"}', 6),
])
def test_fastjson_errors_carry_byte_offsets(text, offset):
    with pytest.raises(FormatError) as info:
        parse_fastjson(text.encode(), "f.json")
    assert info.value.file == "f.json"
    if offset is not None:
        assert info.value.offset == offset


def test_fastjson_fuzz_never_escapes():
    import random

    base = (real_store("clean") / "config" / "consumerOffset.json").read_bytes()
    rng = random.Random(9)
    for _ in range(2000):
        data = bytearray(base)
        for _ in range(rng.randrange(1, 6)):
            pos = rng.randrange(len(data))
            op = rng.randrange(3)
            if op == 0:
                data[pos] = rng.randrange(256)
            elif op == 1:
                del data[pos]
            else:
                data.insert(pos, rng.choice(b'{}[]:,"\\\'0123456789abc\xff'))
        try:
            parse_fastjson(bytes(data))
        except FormatError as exc:
            assert exc.offset is not None and 0 <= exc.offset <= len(data)


def test_bak_fallback(store_copy):
    root = store_copy("clean")
    main = root / "config" / "consumerOffset.json"
    main.write_text('{"offsetTable":{"TopicTest@cg-test":{0:33,1:', encoding="utf-8")
    res = load_consumer_offsets(root)
    assert res.used_backup and res.path == main.with_name("consumerOffset.json.bak")
    assert res.data.offsets("TopicTest", "cg-test")[3] == 32
    assert isinstance(res.main_error, FormatError) and res.main_error.offset == len(main.read_bytes())
    # wrong shape (valid JSON) also falls back, like a fastjson decode exception
    main.write_text('{"offsetTable":[1,2]}', encoding="utf-8")
    assert load_consumer_offsets(root).used_backup
    # missing / empty main -> .bak
    main.unlink()
    assert load_consumer_offsets(root).used_backup
    main.write_bytes(b"")
    assert load_consumer_offsets(root).used_backup
    # both bad -> the main file's error with its byte offset
    main.write_text('{"offsetTable":{x}}', encoding="utf-8")
    main.with_name("consumerOffset.json.bak").write_text("{", encoding="utf-8")
    with pytest.raises(FormatError) as info:
        load_consumer_offsets(root)
    assert info.value.file == str(main) and info.value.offset == 17
    # main bad and no .bak -> error (not silently empty)
    main.with_name("consumerOffset.json.bak").unlink()
    with pytest.raises(FormatError):
        load_consumer_offsets(root)
    # a directory or a symlink in place of the file is a StoreError, never followed
    main.unlink()
    os.symlink("/etc/passwd", main)
    with pytest.raises(StoreError):
        load_config_file(main)


# --- lock --------------------------------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import fcntl, os, sys
    fd = os.open(sys.argv[1], os.O_RDWR)
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
    print("locked", flush=True)
    sys.stdin.readline()
""")

STORELOCK_HOLDER = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[2])
    from rmqdump.broker.lock import StoreLock
    with StoreLock(sys.argv[1]):
        print("locked", flush=True)
        sys.stdin.readline()
""")


def _spawn(script: str, *args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    line = proc.stdout.readline()
    assert line.strip() == "locked"
    return proc


def _stop(proc: subprocess.Popen) -> None:
    proc.stdin.close()
    proc.wait(timeout=10)


def test_probe_unlocked_real_store_read_only():
    root = real_store("clean")
    assert not os.access(root / "lock", os.W_OK) or os.geteuid() == 0
    assert probe_lock(root) is None
    assert probe_lock(Path("/nonexistent-store")) is None


def test_probe_and_storelock_against_child_holder(store_copy):
    root = store_copy("clean")
    assert probe_lock(root) is None
    proc = _spawn(HOLDER, str(root / "lock"))
    try:
        assert probe_lock(root) == proc.pid
        t0 = time.monotonic()
        with pytest.raises(LockError) as info:
            StoreLock(root).acquire()
        assert time.monotonic() - t0 < 1.0
        assert info.value.pid == proc.pid and str(proc.pid) in str(info.value)
        assert probe_lock(root) == proc.pid  # our failed attempt did not disturb the holder
    finally:
        _stop(proc)
    assert probe_lock(root) is None
    with StoreLock(root) as lock:
        assert lock.held
        assert probe_lock(root) == os.getpid()
        with pytest.raises(LockError):
            StoreLock(root).acquire()  # same process: refused, would otherwise drop our lock
        assert lock.held
    assert probe_lock(root) is None
    assert (root / "lock").read_bytes() == b"lock"  # content untouched


def test_two_storelocks_in_two_processes(store_copy):
    root = store_copy("clean")
    proc = _spawn(STORELOCK_HOLDER, str(root), str(REPO))
    try:
        assert probe_lock(root) == proc.pid
        with pytest.raises(LockError) as info:
            with StoreLock(root):
                pass
        assert info.value.pid == proc.pid
    finally:
        _stop(proc)
    with StoreLock(root):
        pass


def test_storelock_refuses_symlink_and_creates_missing(tmp_path):
    target = tmp_path / "elsewhere"
    target.write_bytes(b"lock")
    store = tmp_path / "store"
    store.mkdir()
    os.symlink(target, store / "lock")
    with pytest.raises(LockError):
        StoreLock(store).acquire()
    with pytest.raises(LockError):
        probe_lock(store)
    (store / "lock").unlink()
    with pytest.raises(LockError):
        StoreLock(store, create=False).acquire()
    with StoreLock(store):
        assert (store / "lock").exists()
    fifo_store = tmp_path / "fifo"
    fifo_store.mkdir()
    os.mkfifo(fifo_store / "lock")
    with pytest.raises(LockError):
        probe_lock(fifo_store)  # never blocks on a FIFO
