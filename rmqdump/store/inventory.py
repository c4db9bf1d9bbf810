"""The store inventory: every file and directory under a store root, classified without reading it.

Each entry is *read* (some rmqdump command decodes it), *named* (a file RocketMQ writes that rmqdump knows
but does not decode: present, not read) or *unknown* (no RocketMQ 4.9/5.3 file has that name at that place;
reported, never skipped). Names only: no file is opened, symlinks are listed and never followed, unknown
directories are not entered, and the walk stops after ``max_entries`` entries, saying where. Per directory at
most ``list_cap`` unknown entries are listed (the smallest names), with the count of the rest.

Names come from RocketMQ 5.3.3's source (``StorePathConfigHelper``, ``BrokerPathConfigHelper``, the timer,
compaction, DLedger and controller code) and format note §1; where unsure, the comment says so.
:func:`detect_features` turns an inventory (plus what the readers saw in records) into broker features.
"""

from __future__ import annotations

import bisect
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rmqdump.codec.layout import (
    STORE_ABORT_FILE,
    STORE_BATCH_CONSUMEQUEUE_DIR,
    STORE_CHECKPOINT_FILE,
    STORE_COMMITLOG_DIR,
    STORE_CONFIG_DIR,
    STORE_CONSUMEQUEUE_DIR,
    STORE_CONSUMEQUEUE_EXT_DIR,
    STORE_INDEX_DIR,
    STORE_LOCK_FILE,
)

READ, NAMED, UNKNOWN = "read", "named", "unknown"
READS, NAMES_ONLY = "reads", "names only"

_OFFSET_NAME = re.compile(r"[0-9]{20}")
_INDEX_NAME = re.compile(r"[0-9]{17}")  # yyyyMMddHHmmssSSS
_QUEUE_ID = re.compile(r"[+-]?[0-9]+")
# RocksDB's own file names (a database directory): CURRENT, IDENTITY, LOCK, LOG, LOG.old.*, MANIFEST-n,
# OPTIONS-n, n.sst, n.log (WAL), n.blob, n.dbtmp; ``archive/`` holds archived WAL files
_ROCKSDB_FILE = re.compile(r"CURRENT|IDENTITY|LOCK|LOG|LOG\.old\.[0-9]+|MANIFEST-[0-9]+|OPTIONS-[0-9]+(\.dbtmp)?"
                           r"|[0-9]+\.(sst|log|blob|dbtmp)")
_ROCKSDB_MARKERS = re.compile(r"CURRENT|IDENTITY|MANIFEST-[0-9]+|[0-9]+\.sst")


@dataclass(frozen=True)
class Kind:
    """What a class of paths is: its shape, whether rmqdump reads it, and the broker feature it shows."""

    pattern: str
    status: str
    what: str
    feature: str | None = None


def _k(pattern: str, status: str, what: str, feature: str | None = None) -> Kind:
    k = Kind(pattern, status, what, feature)
    KINDS.append(k)
    return k


KINDS: list[Kind] = []  # in display order
CL_DIR = _k("commitlog/", READ, "commitlog directory")
CL_SEG = _k("commitlog/<offset>", READ, "commitlog segments (20-digit start offsets)")
CQ_DIR = _k("consumequeue/", READ, "consume queue root")
CQ_TOPIC = _k("consumequeue/<topic>/", READ, "consume queue topic directories")
CQ_QUEUE = _k("consumequeue/<topic>/<qid>/", READ, "consume queue directories")
CQ_FILE = _k("consumequeue/<topic>/<qid>/<offset>", READ, "consume queue files (20-byte units)")
BCQ_DIR = _k("batchconsumequeue/", READ, "BatchConsumeQueue root (5.x)", "batchcq")
BCQ_TOPIC = _k("batchconsumequeue/<topic>/", READ, "BatchCQ topic directories", "batchcq")
BCQ_QUEUE = _k("batchconsumequeue/<topic>/<qid>/", READ, "BatchCQ queue directories", "batchcq")
BCQ_FILE = _k("batchconsumequeue/<topic>/<qid>/<offset>", READ, "BatchCQ files (46-byte units)", "batchcq")
IDX_DIR = _k("index/", READ, "index directory")
IDX_FILE = _k("index/<yyyyMMddHHmmssSSS>", READ, "index files")
CHECKPOINT = _k("checkpoint", READ, "store checkpoint (flush timestamps)")
ABORT = _k("abort", READ, "abort marker: the last run did not shut down cleanly")
ABORT_BAK = _k("abort.bak", READ, "previous abort content (5.x; a PID = a crashed run)")
LOCK = _k("lock", READ, "broker lock file (probed, never taken)")
CFG_DIR = _k("config/", READ, "broker config directory")
CFG_READ = _k("config/<read table>.json[.bak]", READ,
              "topics, consumerOffset, delayOffset, subscriptionGroup (+ .bak copies)")
CFG_NAMED = _k("config/<other table>.json[.bak]", NAMED,
               "other broker tables: consumerFilter, lmqConsumerOffset, consumerOrderInfo, "
               "topicQueueMapping, messageRequestMode (+ .bak copies)")
CFG_TMP = _k("config/<name>.tmp", NAMED, "a config file being rewritten (MixAll.string2File's temp file)")
CFG_BROKER = _k("config/broker.properties", NAMED, "broker settings (the default brokerConfigPath)")
TIMER_CHECK = _k("config/timercheck", READ, "timer checkpoint (4 KiB, binary; rmqdump timer)", "timer")
TIMER_METRICS = _k("config/timermetrics[.bak]", READ, "timer metrics (JSON; rmqdump timer)", "timer")
TIMER_WHEEL = _k("timerwheel", READ, "timer wheel (32-byte slots; rmqdump timer)", "timer")
TIMERLOG_DIR = _k("timerlog/", READ, "timer log directory", "timer")
TIMERLOG_FILE = _k("timerlog/<offset>", READ, "timer log files (52-byte units; rmqdump timer)", "timer")
# 5.3.3 keeps the RocksDB CQ in consumequeue/ itself (RocksDBConsumeQueueStore: getStorePathConsumeQueue)
ROCKS_CQ = _k("consumequeue/<RocksDB file>", READ, "RocksDB consume queue database (storeType=defaultRocksDB; "
              "rocksdb extra)", "rocksdb_cq")
ROCKS_CFG = _k("config/<RocksDB table>/", READ,
               "RocksDB config databases: topics/, subscriptionGroups/, consumerOffsets/ (configManagerVersion "
               "v1), rdb/ (v2; rocksdb extra)",
               "rocksdb_config")
CQEXT = _k("consumequeue_ext/", NAMED, "ConsumeQueueExt files (enableConsumeQueueExt)", "cq_ext")
COMPACTION = _k("compaction/", READ, "compaction store: position-checkpoint, compactionLog/, compactionCq/ (verify)",
                "compaction")
DLEDGER = _k("dledger-<selfId>/", READ, "DLedger commitlog: data/, index/, checkpoint, currterm", "dledger")
CONTROLLER = _k("epochFileCheckpoint[.bak]|brokerIdentity[-temp][.bak]", READ,
                "controller-mode HA metadata: epochs and broker identity (info, verify)", "controller")
MULTIPATH = _k("<dir>/[commitlog/]<offset>", READ, "another commitlog folder (multi-path storePathCommitLog; read "
               "with --commitlog-path or --broker-config)", "multi_path")
TRANSACTION = _k("transaction/", NAMED, "legacy transaction state table / redo log (path helpers only)")

_CFG_READ_NAMES = {"topics.json", "consumerOffset.json", "delayOffset.json", "subscriptionGroup.json"}
_CFG_NAMED_NAMES = {"consumerFilter.json", "lmqConsumerOffset.json", "consumerOrderInfo.json",
                    "topicQueueMapping.json", "messageRequestMode.json"}
# RocksDB config folders (5.3.3): v1 RocksDB{Topic,SubscriptionGroup,ConsumerOffset}Manager.rocksdbConfigFilePath
# (config/topics/, config/subscriptionGroups/, config/consumerOffsets/), v2 ConfigStorage (config/rdb/, one
# RocksDB for all)
_CFG_ROCKS_DIRS = {"topics", "subscriptionGroups", "consumerOffsets", "rdb"}

#: a rule maps (name, is_dir) to the kind of that entry and the rule for its children (None: not entered)
Rule = Callable[[str, bool], tuple[Kind | None, "Rule | None"]]


def _none(name: str, is_dir: bool) -> tuple[Kind | None, Rule | None]:
    return None, None


def _files(kind: Kind, name_re: re.Pattern) -> Rule:
    def rule(name: str, is_dir: bool):
        return (kind, None) if not is_dir and name_re.fullmatch(name) else (None, None)
    return rule


def _queues(topic: Kind, queue: Kind, file: Kind, rocks: Kind | None) -> Rule:
    files = _files(file, _OFFSET_NAME)

    def qdir(name: str, is_dir: bool):
        return (queue, files) if is_dir and _QUEUE_ID.fullmatch(name) else (None, None)

    def root(name: str, is_dir: bool):
        if is_dir:
            return (rocks, _all(rocks)) if rocks is not None and name == "archive" else (topic, qdir)
        return (rocks, None) if rocks is not None and _ROCKSDB_FILE.fullmatch(name) else (None, None)
    return root


def _all(kind: Kind, depth: int = 4) -> Rule:
    """Everything below is ``kind`` (a database or a feature's own folder), at most ``depth`` levels."""
    def rule(name: str, is_dir: bool):
        return kind, (_all(kind, depth - 1) if is_dir and depth > 1 else None)
    return rule


def _rocks(kind: Kind) -> Rule:
    def rule(name: str, is_dir: bool):
        if is_dir:
            return (kind, _rocks(kind)) if name == "archive" else (None, None)
        return (kind, None) if _ROCKSDB_FILE.fullmatch(name) else (None, None)
    return rule


def _config(name: str, is_dir: bool):
    if is_dir:
        return (ROCKS_CFG, _rocks(ROCKS_CFG)) if name in _CFG_ROCKS_DIRS else (None, None)
    base = name[:-4] if name.endswith(".bak") else name
    if base in _CFG_READ_NAMES:
        return CFG_READ, None
    if base in _CFG_NAMED_NAMES:
        return CFG_NAMED, None
    if name == "timercheck":
        return TIMER_CHECK, None
    if base == "timermetrics":
        return TIMER_METRICS, None
    if name == "broker.properties":
        return CFG_BROKER, None
    if name.endswith(".tmp") and (name[:-4] in _CFG_READ_NAMES | _CFG_NAMED_NAMES or name[:-4] == "timermetrics"):
        return CFG_TMP, None
    return None, None


def _compaction(name: str, is_dir: bool):
    # CompactionStore: compaction/position-checkpoint (CompactionPositionMgr, a string2File JSON, so .bak
    # too), compaction/compactionLog/<topic>/<qid>/<offset>, compaction/compactionCq/<topic>/<qid>/...
    if is_dir:
        return (COMPACTION, _all(COMPACTION, 3)) if name in ("compactionLog", "compactionCq") else (None, None)
    return (COMPACTION, None) if name in ("position-checkpoint", "position-checkpoint.bak") else (None, None)


def _dledger(name: str, is_dir: bool):
    # DLedger 0.3.1.2: data/ and index/ mapped files; checkpoint and currterm are properties files written
    # with a .bak copy (currterm.bak assumed by analogy with checkpoint.bak, not seen in an oracle store)
    if is_dir:
        return (DLEDGER, _files(DLEDGER, _OFFSET_NAME)) if name in ("data", "index") else (None, None)
    return (DLEDGER, None) if name in ("checkpoint", "checkpoint.bak", "currterm", "currterm.bak") else (None, None)


def _multipath_files(name: str, is_dir: bool):
    return (MULTIPATH, None) if not is_dir and _OFFSET_NAME.fullmatch(name) else (None, None)


def _multipath_holder(name: str, is_dir: bool):
    return (MULTIPATH, _multipath_files) if is_dir and name == STORE_COMMITLOG_DIR else (None, None)


def _looks_like_commitlog_folder(path: Path) -> Rule | None:
    """A root-level folder of another commitlog path: 20-digit files in it, or in its ``commitlog/``."""
    for d, rule in ((path, _multipath_files), (path / STORE_COMMITLOG_DIR, _multipath_holder)):
        try:
            if d != path and not os.path.isdir(d) or os.path.islink(d):
                continue
            with os.scandir(d) as it:
                for n, e in enumerate(it):
                    if n >= 64:
                        break
                    if _OFFSET_NAME.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                        return rule
        except OSError:
            continue
    return None


def other_commitlog_folders(root: str | os.PathLike) -> list[Path]:
    """Root-level folders besides ``commitlog/`` that hold commitlog segments (a multi-path store's other
    ``storePathCommitLog`` folders kept inside the store root), each as the folder holding the segments."""
    out: list[Path] = []
    try:
        names = sorted(e.name for e in os.scandir(root) if e.is_dir(follow_symlinks=False))
    except OSError:
        return out
    for name in names:
        if name in _ROOT or name.startswith("dledger-"):
            continue
        rule = _looks_like_commitlog_folder(Path(root) / name)
        if rule is not None:
            out.append(Path(root) / name / (STORE_COMMITLOG_DIR if rule is _multipath_holder else ""))
    return out


_ROOT: dict[str, tuple[Kind, bool, Rule | None]] = {  # name -> (kind, is a directory, children)
    STORE_COMMITLOG_DIR: (CL_DIR, True, _files(CL_SEG, _OFFSET_NAME)),
    STORE_CONSUMEQUEUE_DIR: (CQ_DIR, True, _queues(CQ_TOPIC, CQ_QUEUE, CQ_FILE, ROCKS_CQ)),
    STORE_BATCH_CONSUMEQUEUE_DIR: (BCQ_DIR, True, _queues(BCQ_TOPIC, BCQ_QUEUE, BCQ_FILE, None)),
    STORE_CONSUMEQUEUE_EXT_DIR: (CQEXT, True, _queues(CQEXT, CQEXT, CQEXT, None)),
    STORE_INDEX_DIR: (IDX_DIR, True, _files(IDX_FILE, _INDEX_NAME)),
    STORE_CHECKPOINT_FILE: (CHECKPOINT, False, None),
    STORE_ABORT_FILE: (ABORT, False, None),
    "abort.bak": (ABORT_BAK, False, None),
    STORE_LOCK_FILE: (LOCK, False, None),
    STORE_CONFIG_DIR: (CFG_DIR, True, _config),
    "timerwheel": (TIMER_WHEEL, False, None),
    "timerlog": (TIMERLOG_DIR, True, _files(TIMERLOG_FILE, _OFFSET_NAME)),
    "compaction": (COMPACTION, True, _compaction),
    # controller mode: AutoSwitchHAService's epoch file (EpochFileCache over a CheckpointFile, which keeps a
    # .bak) and ReplicasManager's temporary broker identity; both at the store root (format note §1)
    "epochFileCheckpoint": (CONTROLLER, False, None),
    "epochFileCheckpoint.bak": (CONTROLLER, False, None),
    "brokerIdentity": (CONTROLLER, False, None),
    "brokerIdentity.bak": (CONTROLLER, False, None),  # MetadataFile.writeToFile: MixAll.string2File keeps a .bak
    "brokerIdentity-temp": (CONTROLLER, False, None),  # ReplicasManager's TempBrokerMetadata (+ "-temp")
    "brokerIdentity-temp.bak": (CONTROLLER, False, None),
    "transaction": (TRANSACTION, True, _all(TRANSACTION, 1)),
}


@dataclass
class Group:
    kind: Kind
    example: str  # the first path of this kind met
    files: int = 0
    dirs: int = 0


@dataclass
class Inventory:
    """Counts per kind, the unknown entries (capped per directory), symlinks and special files."""

    root: str
    groups: dict[Kind, Group] = field(default_factory=dict)
    unknown: list[dict] = field(default_factory=list)
    unknown_total: int = 0
    unknown_unlisted: list[dict] = field(default_factory=list)
    irregular: list[dict] = field(default_factory=list)
    examined: int = 0
    stopped: str | None = None

    def has(self, kind: Kind) -> bool:
        return kind in self.groups

    def features_present(self) -> set[str]:
        return {k.feature for k in self.groups if k.feature}

    def counts(self) -> dict:
        read = sum(g.files + g.dirs for k, g in self.groups.items() if k.status == READ)
        named = sum(g.files + g.dirs for k, g in self.groups.items() if k.status == NAMED)
        return {"read": read, "named": named, "unknown": self.unknown_total, "examined": self.examined}

    def to_dict(self) -> dict:
        order = {k: i for i, k in enumerate(KINDS)}
        return {
            "groups": [{"path": k.pattern, "status": k.status, "what": k.what, "feature": k.feature,
                        "files": g.files, "dirs": g.dirs, "example": g.example} for k, g in sorted(self.groups.items(),
                                                                            key=lambda kv: order[kv[0]])],
            "unknown": self.unknown, "unknown_unlisted": self.unknown_unlisted, "irregular": self.irregular,
            "counts": self.counts(), "stopped": self.stopped,
        }


class _Walker:
    def __init__(self, inv: Inventory, list_cap: int, max_entries: int):
        self.inv, self.list_cap, self.max_entries = inv, list_cap, max_entries

    def walk(self, path: Path, rel: str, rule: Rule, root: bool = False) -> None:
        listed: list[tuple[str, str]] = []
        unknown = 0
        try:
            it = os.scandir(path)
        except OSError as exc:
            self._unknown_entry(rel or ".", "unlistable", f"cannot list: {exc.strerror}")
            return
        with it:
            for e in it:
                if self.inv.examined >= self.max_entries:
                    if self.inv.stopped is None:
                        self.inv.stopped = f"stopped after {self.max_entries} entries, in {rel or '.'}"
                    break
                self.inv.examined += 1
                name = e.name
                child_rel = f"{rel}/{name}" if rel else name
                try:
                    is_link = e.is_symlink()
                    is_dir = e.is_dir(follow_symlinks=False)
                    is_file = e.is_file(follow_symlinks=False)
                except OSError:
                    is_link = is_dir = is_file = False
                kind, sub = self._classify(path, name, is_dir, rule, root)
                if kind is None and is_link:  # a symlink is named by what its name would be as either type
                    kind, sub = self._classify(path, name, True, rule, root)
                if kind is None:
                    unknown += 1
                    self.inv.unknown_total += 1
                    ftype = "directory" if is_dir else "file" if is_file else "symlink" if is_link else "special"
                    if len(listed) < self.list_cap or child_rel < listed[-1][0]:
                        bisect.insort(listed, (child_rel, ftype))
                        del listed[self.list_cap:]
                    continue
                group = self.inv.groups.get(kind)
                if group is None:
                    group = self.inv.groups[kind] = Group(kind, child_rel + ("/" if is_dir else ""))
                if is_dir:
                    group.dirs += 1
                else:
                    group.files += 1
                if is_link or not (is_dir or is_file):
                    if len(self.inv.irregular) < self.list_cap:
                        self.inv.irregular.append({"path": child_rel, "type": "symlink" if is_link else "special",
                                                   "what": kind.what})
                    continue  # never followed, never entered
                if is_dir and sub is not None:
                    self.walk(Path(e.path), child_rel, sub)
        self.inv.unknown.extend({"path": p, "type": t} for p, t in listed)
        if unknown > len(listed):
            self.inv.unknown_unlisted.append({"directory": rel or ".", "more": unknown - len(listed)})

    def _classify(self, parent: Path, name: str, is_dir: bool, rule: Rule, root: bool):
        if not root:
            return rule(name, is_dir)
        known = _ROOT.get(name)
        if known is not None:
            kind, want_dir, sub = known
            if want_dir == is_dir:
                if kind is CQ_DIR and _is_rocksdb(parent / name):
                    return ROCKS_CQ, _rocks(ROCKS_CQ)
                return kind, sub
            return None, None
        if is_dir and name.startswith("dledger-"):
            return DLEDGER, _dledger
        if is_dir:
            sub = _looks_like_commitlog_folder(parent / name)
            if sub is not None:
                return MULTIPATH, sub
        return None, None

    def _unknown_entry(self, rel: str, ftype: str, detail: str) -> None:
        self.inv.unknown_total += 1
        self.inv.unknown.append({"path": rel, "type": ftype, "detail": detail})


def _is_rocksdb(path: Path) -> bool:
    """``consumequeue/`` holding a RocksDB database (5.2+ ``storeType=defaultRocksDB``): its marker files."""
    try:
        with os.scandir(path) as it:
            for n, e in enumerate(it):
                if n >= 4096:
                    return False
                if _ROCKSDB_MARKERS.fullmatch(e.name) and e.is_file(follow_symlinks=False):
                    return True
    except OSError:
        return False
    return False


def take_inventory(root: str | os.PathLike, *, list_cap: int = 20, max_entries: int = 1_000_000) -> Inventory:
    """Classify every entry under the store ``root`` by name and type alone (see the module docstring)."""
    inv = Inventory(str(root))
    _Walker(inv, list_cap, max_entries).walk(Path(root), "", _none, root=True)
    return inv


#: (feature, what, how this rmqdump version handles it)
FEATURES = (
    ("timer", "timer store (timerlog/, timerwheel, config/timercheck, timermetrics)", READS),
    ("rocksdb_cq", "RocksDB consume queue (storeType=defaultRocksDB)", READS),
    ("rocksdb_config", "RocksDB config tables (config/topics/ ... or config/rdb/)", READS),
    ("batchcq", "BatchConsumeQueue (queue.type=BatchCQ topics)", READS),
    ("crc32", "__CRC32# record CRC property (enabledAppendPropCRC)", READS),
    ("v2", "V2 magic records (topics over 127 UTF-16 units)", READS),
    ("dledger", "DLedger commitlog (enableDLegerCommitLog)", READS),
    ("controller", "controller mode (epochFileCheckpoint, brokerIdentity)", READS),
    ("multi_path", "multi-path commitlog (storePathCommitLog a,b)", READS),
    ("compaction", "compaction store (cleanup.policy=COMPACTION)", READS),
    ("cq_ext", "ConsumeQueueExt (enableConsumeQueueExt)", NAMES_ONLY),
)


def detect_features(inv: Inventory, *, batch_topics: set[str] | None = None, v2: str | None = None,
                    crc32: str | None = None) -> list[dict]:
    """Every feature of :data:`FEATURES`: present or not, the evidence, and whether rmqdump reads it.
    ``v2``/``crc32`` are the readers' evidence from records (None: not seen in what was read)."""
    present = inv.features_present()
    evidence: dict[str, str] = {}
    for k, g in inv.groups.items():
        if k.feature and k.feature not in evidence:
            evidence[k.feature] = g.example
    if batch_topics:
        evidence["batchcq"] = f"BatchCQ topics: {', '.join(sorted(batch_topics)[:5])}" + (
            f" and {len(batch_topics) - 5} more" if len(batch_topics) > 5 else "")
        present.add("batchcq")
    for name, ev in (("v2", v2), ("crc32", crc32)):
        if ev:
            evidence[name] = ev
            present.add(name)
    if "compaction" in present:
        g = inv.groups[COMPACTION]
        if g.dirs <= 1:  # compaction/ itself and position-checkpoint[.bak]
            evidence["compaction"] = ("compaction/position-checkpoint only (5.x writes it by default; "
                                      "no compaction log)")
    return [{"feature": f, "what": what, "present": f in present, "evidence": evidence.get(f),
             "rmqdump": how} for f, what, how in FEATURES]


__all__ = ["FEATURES", "KINDS", "NAMED", "NAMES_ONLY", "READ", "READS", "UNKNOWN", "Group", "Inventory", "Kind",
           "detect_features", "other_commitlog_folders", "take_inventory"]
