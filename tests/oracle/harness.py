"""RocketMQ's own store code as the judge: write stores with ``put``, read them back with ``run``.

``../shared/oracle/{498,533}`` (see its README) holds RocketMQ 4.9.8 and 5.3.3's store classes with two
drivers: ``put`` writes a store through ``DefaultMessageStore.putMessage(s)`` from a JSONL spec, ``run``
loads a *copy* of a store as a broker does (recovery included) and dumps what RocketMQ reads back.

A :class:`Base` is a spec written by ``put``; a :class:`Variant` is a base plus damage (bytes zeroed,
bits flipped, files truncated/deleted, ``abort`` left) applied to a copy. Both are cached under
``.oracle-cache/`` (``RMQDUMP_ORACLE_CACHE``) keyed by a digest of everything that shapes them, so a
second run of the suite costs no JVM start for the stores themselves.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ORACLE = REPO.parent / "shared" / "oracle"
CACHE = Path(os.environ.get("RMQDUMP_ORACLE_CACHE", REPO / ".oracle-cache"))
CACHE_FORMAT = "1"

#: keys of Put's settings line that are Put's own, not store settings for ``run --set``
PUT_ONLY_KEYS = {"type", "topics", "timerDequeue", "brokerTopicLengthCheck", "producerGroup", "bornHost",
                 "storeHost", "scheduleDelivery"}
#: settings passed positionally to ``run``
SIZE_KEYS = ("mappedFileSizeCommitLog", "mappedFileSizeConsumeQueue", "maxHashSlotNum", "maxIndexNum")


def unavailable_reason(version: str = "498") -> str | None:
    """Why the oracle cannot run here, or None."""
    if not (ORACLE / version / "put").is_file():
        return f"RocketMQ oracle {ORACLE / version} is not beside the checkout"
    java = os.environ.get("JAVA_HOME")
    if not (shutil.which("java") or (java and Path(java, "bin", "java").exists())):
        return "no java on PATH (the oracle needs a Java 17 runtime)"
    return None


def oracle_version_stamp(version: str) -> str:
    p = ORACLE / version / "VERSION"
    return p.read_text(encoding="utf-8") if p.is_file() else ""


def _digest(*parts: object) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def settings_of(spec: list[dict]) -> dict:
    return spec[0] if spec and spec[0].get("type") == "settings" else {}


def run_args(version: str, settings: dict, bcq_topics: bool = False) -> list[str]:
    """``run``'s positional sizes and ``--set`` options for a store written with ``settings``."""
    args = [str(settings[k]) for k in SIZE_KEYS]
    if version == "533":
        args.append(f"--bcq-file-size={settings.get('mapperFileSizeBatchConsumeQueue', 736)}")
    for key, value in settings.items():
        if key in PUT_ONLY_KEYS or key in SIZE_KEYS or key == "mapperFileSizeBatchConsumeQueue":
            continue
        if isinstance(value, list):
            value = ",".join(value)
        elif isinstance(value, bool):
            value = str(value).lower()
        args.append(f"--set={key}={value}")
    return args


def _java(version: str, tool: str, args: list[str], *, stdin: str | None = None, timeout: float = 300,
          ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess:
    env = dict(os.environ, RMQ_ORACLE_LOG=os.environ.get("RMQ_ORACLE_LOG", "error"))
    res = subprocess.run([str(ORACLE / version / tool), *args], input=stdin, capture_output=True, text=True,
                         timeout=timeout, env=env)
    if res.returncode not in ok:
        raise RuntimeError(f"oracle {version}/{tool} {' '.join(args)} exited {res.returncode}:\n"
                           f"{res.stderr[-4000:]}")
    return res


def put(version: str, store: Path, spec: list[dict], flags: tuple[str, ...] = (), log: Path | None = None) -> list[dict]:
    """Write (or append to) ``store`` with RocketMQ's ``put``; returns its status lines. ``log``: a file for
    RocketMQ's own log lines (errors only, unless ``RMQ_ORACLE_LOG`` says otherwise)."""
    text = "\n".join(json.dumps(line, ensure_ascii=False) for line in spec) + "\n"
    res = _java(version, "put", [*flags, str(store), "-"], stdin=text, ok=(0, 3))
    if log is not None:
        log.write_text(res.stderr)
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def load(version: str, store: Path, args: list[str]) -> list[dict]:
    """RocketMQ's ``load()`` on a copy of ``store``: the manifest of what it reads back."""
    with tempfile.TemporaryDirectory(prefix="rmq-oracle-") as tmp:
        copy = Path(tmp) / "store"
        shutil.copytree(store, copy, symlinks=True)
        out = Path(tmp) / "manifest.jsonl"
        _java(version, "run", [str(copy), str(out), *args], ok=(0, 2))
        return read_jsonl(out)


@dataclass(frozen=True)
class Base:
    """A store RocketMQ writes from ``spec`` (ending clean, ``--crash`` or ``--crash-no-dispatch``)."""

    name: str
    version: str
    spec: tuple[str, ...]  # JSON lines, so the dataclass stays hashable
    flags: tuple[str, ...] = ()

    @property
    def lines(self) -> list[dict]:
        return [json.loads(s) for s in self.spec]

    @property
    def settings(self) -> dict:
        return settings_of(self.lines)

    @property
    def run_args(self) -> list[str]:
        return run_args(self.version, self.settings)

    @property
    def key(self) -> str:
        return _digest(CACHE_FORMAT, "base", self.version, self.spec, self.flags, oracle_version_stamp(self.version))


@dataclass
class Built:
    """A store on disk with RocketMQ's statuses (from put) and manifest (from run)."""

    name: str
    version: str
    store: Path
    statuses: list[dict]
    manifest: list[dict]
    run_args: list[str]
    ending: str = "clean"
    settings: dict = field(default_factory=dict)

    def of(self, kind: str) -> list[dict]:
        return [m for m in self.manifest if m["type"] == kind]

    @property
    def info(self) -> dict:
        return self.of("store_info")[0]


def _atomic_dir(final: Path, build: Callable[[Path], None]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=final.name + ".", dir=final.parent))
    try:
        build(tmp)
        try:
            tmp.rename(final)
        except OSError:  # built concurrently by another process
            if not final.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def build_base(base: Base) -> Built:
    CACHE.mkdir(parents=True, exist_ok=True)
    final = CACHE / f"{base.name}-{base.key}"
    if not (final / "manifest.jsonl").is_file():
        def make(tmp: Path) -> None:
            statuses = put(base.version, tmp / "store", base.lines, base.flags)
            (tmp / "statuses.jsonl").write_text("".join(json.dumps(s) + "\n" for s in statuses))
            manifest = load(base.version, tmp / "store", base.run_args)
            (tmp / "manifest.jsonl").write_text("".join(json.dumps(m) + "\n" for m in manifest))
        _atomic_dir(final, make)
    ending = {"--crash": "crash", "--crash-no-dispatch": "crash-no-dispatch"}.get(next(iter(base.flags), ""), "clean")
    return Built(base.name, base.version, final / "store", read_jsonl(final / "statuses.jsonl"),
                 read_jsonl(final / "manifest.jsonl"), base.run_args, ending=ending, settings=base.settings)


# --- damage -------------------------------------------------------------------------------------------

Mutation = dict  # {"op": zero|flip|truncate|delete|touch|write, "path": rel, ...}


def apply_mutations(store: Path, mutations: list[Mutation]) -> None:
    for m in mutations:
        p = store / m["path"]
        op = m["op"]
        if op == "zero":
            with open(p, "r+b") as f:
                f.seek(m["offset"])
                f.write(b"\0" * m["length"])
        elif op == "flip":
            with open(p, "r+b") as f:
                f.seek(m["offset"])
                b = f.read(1)[0]
                f.seek(m["offset"])
                f.write(bytes([b ^ (1 << m.get("bit", 0))]))
        elif op == "truncate":
            os.truncate(p, m["size"])
        elif op == "delete":
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        elif op == "touch":
            p.parent.mkdir(parents=True, exist_ok=True)
            p.touch()
        elif op == "write":
            with open(p, "r+b") as f:
                f.seek(m["offset"])
                f.write(bytes.fromhex(m["hex"]))
        else:  # pragma: no cover - a typo in a scenario
            raise ValueError(f"unknown mutation {op}")


def build_variant(base: Built, name: str, mutations: list[Mutation]) -> Built:
    """``base`` with ``mutations`` applied to a copy, and RocketMQ's manifest of the result."""
    key = _digest(CACHE_FORMAT, "variant", str(base.store), mutations)
    final = CACHE / f"{base.name}~{name}-{key}"
    if not (final / "manifest.jsonl").is_file():
        def make(tmp: Path) -> None:
            shutil.copytree(base.store, tmp / "store", symlinks=True)
            apply_mutations(tmp / "store", mutations)
            (tmp / "mutations.json").write_text(json.dumps(mutations))
            manifest = load(base.version, tmp / "store", base.run_args)
            (tmp / "manifest.jsonl").write_text("".join(json.dumps(m) + "\n" for m in manifest))
        _atomic_dir(final, make)
    return Built(f"{base.name}~{name}", base.version, final / "store", base.statuses,
                 read_jsonl(final / "manifest.jsonl"), base.run_args, ending=base.ending,
                 settings=base.settings)


def writable_copy(src: Built | Path, dest: Path) -> Path:
    """A copy of a store (a :class:`Built`'s or any directory) that tests may write to."""
    shutil.copytree(src.store if isinstance(src, Built) else src, dest, symlinks=True)
    for p in [dest, *dest.rglob("*")]:
        if not p.is_symlink():
            p.chmod(0o755 if p.is_dir() else 0o644)
    return dest


# --- manifest <-> rmqdump's JSONL schema ---------------------------------------------------------------

TRANSACTION = {0: "none", 4: "prepared", 8: "commit", 12: "rollback"}
COMPRESSION = {0: "zlib", 0x100: "lz4", 0x200: "zstd", 0x300: "zlib"}


def java_host(java: str) -> str:
    """``127.0.0.1|10911`` / ``0:0:0:0:0:0:0:1|5555`` → rmqdump's spelling."""
    import ipaddress

    ip, port = java.split("|")
    if ":" in ip:
        return f"[{ipaddress.IPv6Address(ip).compressed}]:{port}"
    return f"{ip}:{port}"


def expected_row(m: dict) -> dict:
    """The manifest's ``message`` line in rmqdump's scan JSONL schema (``--body base64``)."""
    keys = [k for k in (m["keys"] or "").split(" ") if k]
    return {
        "offset": m["commitLogOffset"], "file": m["file"], "file_pos": m["filePos"], "size": m["storeSize"],
        "magic": {"0xDAA320A7": "v1", "0xDAA320AB": "v2"}[m["magicCode"]], "body_crc": m["bodyCRC"],
        "queue_id": m["queueId"], "flag": m["flag"], "queue_offset": m["queueOffset"],
        "physical_offset": m["physicalOffsetField"], "sys_flag": m["sysFlag"],
        "transaction": TRANSACTION[m["tranType"]],
        "compression": COMPRESSION[m["sysFlag"] & 0x700] if m["compressed"] else "none",
        "born_timestamp": m["bornTimestamp"], "born_host": java_host(m["bornHost"]),
        "store_timestamp": m["storeTimestamp"], "store_host": java_host(m["storeHost"]),
        "reconsume_times": m["reconsumeTimes"], "prepared_transaction_offset": m["preparedTransactionOffset"],
        "topic": m["topic"], "properties": m["properties"], "keys": keys, "tags": m["tags"],
        "uniq_key": m["uniqKey"], "msg_id": m["msgId_offset"], "tags_code": m["dispatch_tagsCode"],
        "body_length": m["bodyLength"], "body": m["body_b64"],
    }


def batch_cq_topics(store: Path) -> set[str]:
    """Topics with a 5.x ``batchconsumequeue/`` directory (their queues are not in ``consumequeue/``)."""
    d = store / "batchconsumequeue"
    return {p.name for p in d.iterdir()} if d.is_dir() else set()


def cq_entries(manifest: list[dict]) -> dict[tuple[str, int, int], tuple[int, int, int]]:
    return {(m["topic"], m["queueId"], m["queueOffset"]): (m["commitLogOffset"], m["size"], m["tagsCode"])
            for m in manifest if m["type"] == "cq_entry"}


def cq_max_offsets(manifest: list[dict]) -> dict[tuple[str, int], int]:
    return {(m["topic"], m["queueId"]): m["maxOffsetInQueue"] for m in manifest if m["type"] == "cq_queue"}


def segment_name(offset: int, seg_size: int) -> str:
    return f"{offset // seg_size * seg_size:020d}"
