"""``bundle``: one ``.tar.gz`` to hand to support: the store's layout (every file: path, size, mtime,
sparse or not), geometry, checkpoint, ``config/`` with secrets stripped, ``info`` and ``verify`` as JSON,
the ``--evidence`` manifest (sha256 of every file those read) and the rmqdump version. No store data
unless ``with_data``; then its files (never ``config/`` unstripped) go under ``data/``.

Secrets: in JSON every value under a key matching :data:`SECRET_KEY` (``secretKey``, ``accessKey``,
``password``, ``token``...) becomes ``"<stripped>"``; in any other text file (``plain_acl.yml``,
``*.properties``) so does the value of every such ``key: value`` / ``key=value`` line; ``key=value``
pairs inside strings are stripped too. Binary files in ``config/`` are listed, not included.

The bundle is written only outside the store (:func:`rmqdump.disk.guard.refuse_inside`), to a temporary
file in the target's directory, fsynced, then renamed: a reader never sees half a bundle.
"""

from __future__ import annotations

import io
import json
import os
import platform
import re
import stat
import tarfile
import time
from pathlib import Path

from rmqdump.codec.layout import MAX_RECORD_SIZE
from rmqdump.disk.durable import atomic_file
from rmqdump.disk.fileio import open_regular
from rmqdump.disk.guard import refuse_inside
from rmqdump.errors import RmqdumpError, StoreError

BUNDLE_VERSION = 1
STRIPPED = "<stripped>"
SECRET_KEY = re.compile(r"secret|password|passwd|pwd|token|access_?key|credential|private_?key", re.IGNORECASE)
_LINE = re.compile(r"""^(\s*(?:-\s+)?["']?)([\w.\-]+)(["']?\s*[:=]\s*)(\S.*?)\s*$""")
_INLINE = re.compile(r"""((?:secret|password|passwd|pwd|token|access_?key|credential|private_?key)\w*["']?\s*[=:]\s*)"""
                     r"""("[^"]*"|'[^']*'|[^\s,;&"'}]+)""", re.IGNORECASE)
MAX_LAYOUT_ENTRIES = 1_000_000


def strip_json(value, forced: bool = False):
    """``value`` (parsed JSON) with every scalar under a secret-looking key replaced by :data:`STRIPPED`."""
    if isinstance(value, dict):
        return {k: strip_json(v, forced or bool(SECRET_KEY.search(str(k)))) for k, v in value.items()}
    if isinstance(value, list):
        return [strip_json(v, forced) for v in value]
    if forced and value is not None:
        return STRIPPED
    return strip_inline(value) if isinstance(value, str) else value


def strip_inline(text: str) -> str:
    """``password=x`` / ``"secretKey": "x"`` inside free text with the value stripped."""
    return _INLINE.sub(lambda m: m.group(1) + STRIPPED, text)


def strip_text(text: str) -> str:
    """A properties / YAML / other text file with the value of every secret-looking key stripped."""
    out = []
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        end = line[len(body):]
        m = _LINE.match(body)
        if m and SECRET_KEY.search(m.group(2)):
            out.append(m.group(1) + m.group(2) + m.group(3) + STRIPPED + end)
        else:
            out.append(strip_inline(body) + end)
    return "".join(out)


def stripped_config(path: Path) -> bytes | None:
    """The file's contents with secrets stripped (JSON kept JSON), or None for a binary file."""
    from rmqdump.store.config import parse_fastjson, read_config_bytes

    raw = read_config_bytes(path) or b""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if "\0" in text:
        return None
    if ".json" in path.name:
        try:
            doc = parse_fastjson(raw, path)
        except RmqdumpError:
            return strip_text(text).encode("utf-8")
        return (json.dumps(strip_json(doc), indent=2, ensure_ascii=False) + "\n").encode("utf-8")
    return strip_text(text).encode("utf-8")


def store_layout(root: Path) -> dict:
    """Every entry under ``root`` (never following symlinks): path, type, size, allocated bytes, sparse, mtime."""
    entries: list[dict] = []
    stopped = None
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(dirnames) + sorted(filenames):
            p = Path(dirpath) / name
            if len(entries) >= MAX_LAYOUT_ENTRIES:
                stopped = f"stopped after {MAX_LAYOUT_ENTRIES} entries"
                break
            try:
                st = os.lstat(p)
            except OSError as e:
                entries.append({"path": str(p.relative_to(root)), "error": e.strerror})
                continue
            kind = ("dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else
                    "symlink" if stat.S_ISLNK(st.st_mode) else "special")
            e = {"path": str(p.relative_to(root)), "type": kind, "size": st.st_size, "mode": stat.filemode(st.st_mode),
                 "mtime_ns": st.st_mtime_ns,
                 "mtime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(st.st_mtime_ns // 1_000_000_000))}
            if kind == "file":
                allocated = st.st_blocks * 512
                e.update(allocated=allocated, sparse=allocated < st.st_size)
            elif kind == "symlink":
                try:
                    e["target"] = os.readlink(p)
                except OSError:
                    pass
            entries.append(e)
        if stopped:
            break
    files = [e for e in entries if e.get("type") == "file"]
    return {"root": str(root), "entries": entries, "stopped": stopped, "files": len(files),
            "bytes": sum(e["size"] for e in files), "allocated": sum(e["allocated"] for e in files)}


def _json(doc) -> bytes:
    return (json.dumps(doc, indent=2, ensure_ascii=False, default=str) + "\n").encode("utf-8", "surrogateescape")


def collect(path: str | os.PathLike, *, evidence_hashes: bool = True, use_mmap: bool = True,
            max_record_size: int = MAX_RECORD_SIZE, version: str | None = None) -> tuple[Path, dict]:
    """(store root, {member name: bytes}) of a bundle without data. Reads the store only."""
    from rmqdump.analysis.info import _checkpoint, store_info
    from rmqdump.analysis.verify import verify_store
    from rmqdump.disk import evidence
    from rmqdump.store.geometry import layout_summary
    from rmqdump.store.root import Store

    store = Store.open(path)
    if store.root is None:
        raise StoreError("bundle needs a store root (the directory holding commitlog/)", path)
    root = store.root
    if evidence_hashes:
        evidence.start()
    members: dict[str, bytes] = {}
    members["layout.json"] = _json(store_layout(root))
    members["geometry.json"] = _json(layout_summary(str(root)))
    members["checkpoint.json"] = _json(_checkpoint(root))
    omitted = []
    cdir = root / "config"
    if cdir.is_dir():
        for e in sorted(os.scandir(cdir), key=lambda e: e.name):
            if not e.is_file(follow_symlinks=False):
                omitted.append({"path": f"config/{e.name}", "why": "not a regular file"})
                continue
            try:
                data = stripped_config(Path(e.path))
            except RmqdumpError as err:
                omitted.append({"path": f"config/{e.name}", "why": str(err)})
                continue
            if data is None:
                omitted.append({"path": f"config/{e.name}", "why": "binary"})
            else:
                members[f"config/{e.name}"] = data
    try:
        members["info.json"] = _json(store_info(root, use_mmap=use_mmap))
    except RmqdumpError as err:
        members["info.json"] = _json({"error": str(err)})
    try:
        report = verify_store(store, use_mmap=use_mmap, max_record_size=max_record_size)
        members["verify.json"] = _json({"exit_code": report.exit_code, **report.to_dict()})
    except RmqdumpError as err:
        members["verify.json"] = _json({"error": str(err)})
    if evidence_hashes:
        members["evidence.json"] = _json(evidence.build_manifest(root, version, layout_summary))
    members["manifest.json"] = _json({
        "bundle_version": BUNDLE_VERSION, "tool": "rmqdump", "version": version,
        "python": platform.python_version(), "platform": platform.platform(), "host": platform.node(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "store": str(root),
        "secrets": f"values of keys matching /{SECRET_KEY.pattern}/i replaced by {STRIPPED!r}",
        "config_omitted": omitted, "members": sorted(members) + ["manifest.json"]})
    return root, members


def write_bundle(path: str | os.PathLike, to: str | os.PathLike, *, with_data: bool = False,
                 evidence_hashes: bool = True, use_mmap: bool = True, max_record_size: int = MAX_RECORD_SIZE,
                 version: str | None = None) -> dict:
    """Write the bundle of store ``path`` to ``to`` (a ``.tar.gz``, never inside the store); returns
    ``{"bundle", "members": [{"name", "size"}], "with_data"}``."""
    from rmqdump.disk.guard import protected_root

    out = Path(os.path.abspath(to))
    refuse_inside(out, [protected_root(path)], "the bundle")
    if out.is_dir():
        raise StoreError("the bundle must be a file path, not a directory", out)
    root, members = collect(path, evidence_hashes=evidence_hashes, use_mmap=use_mmap, max_record_size=max_record_size,
                            version=version)
    refuse_inside(out, [root], "the bundle")
    listing = []
    with atomic_file(out, "the bundle") as raw, tarfile.open(fileobj=raw, mode="w:gz") as tar:
        now = time.time()
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), now, 0o644
            tar.addfile(info, io.BytesIO(data))
            listing.append({"name": name, "size": len(data)})
        if with_data:
            listing += _add_data(tar, root)
    return {"bundle": str(out), "store": str(root), "with_data": with_data, "members": listing}


def _add_data(tar: tarfile.TarFile, root: Path) -> list[dict]:
    """The store's regular files (``config/`` excepted: it is in the bundle stripped) under ``data/``."""
    from rmqdump.disk.evidence import record_read

    out = []
    for e in store_layout(root)["entries"]:
        if e.get("type") != "file" or e["path"].split(os.sep)[0] == "config":
            continue
        p = root / e["path"]
        fd = open_regular(p, follow=False)
        record_read(p)
        with os.fdopen(fd, "rb") as f:
            info = tarfile.TarInfo("data/" + e["path"])
            info.size, info.mtime, info.mode = os.fstat(f.fileno()).st_size, e["mtime_ns"] / 1e9, 0o644
            tar.addfile(info, f)
        out.append({"name": info.name, "size": info.size})
    return out
