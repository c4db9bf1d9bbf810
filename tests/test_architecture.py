"""The package's shape, as ARCHITECTURE.md states it: folders are layers, imports only go down, no cycles.

The import rule (every import counts, function-local ones too):

    cli | spark  ->  analysis | write | rows  ->  fast  ->  broker  ->  store  ->  disk  ->  codec

``analysis``, ``write`` and ``rows`` do not import each other; ``errors`` and ``findings`` sit below
everything; the package's ``__init__`` (the public re-exports) may import anything.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "rmqdump"
RANK = {"errors": 0, "findings": 0, "codec": 1, "disk": 2, "store": 3, "broker": 4, "fast": 5,
        "analysis": 6, "write": 6, "rows": 6, "cli": 7, "spark": 7}
SIBLINGS = {"analysis", "write", "rows"}
TOP_LEVEL_LIMIT = 12
LONG_MODULE = 600


def _modules() -> dict[str, Path]:
    out = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports() -> dict[str, set[str]]:
    mods = _modules()
    out: dict[str, set[str]] = defaultdict(set)
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{name}: relative import (the layer map reads absolute imports)"
                base = node.module or ""
                if not base.startswith("rmqdump"):
                    continue
                for a in node.names:
                    target = f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                    if target != name:
                        out[name].add(target)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("rmqdump") and a.name != name:
                        out[name].add(a.name)
    return out


def _layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def test_imports_only_go_down_the_layers():
    bad = []
    for src, targets in _imports().items():
        ls = _layer(src)
        if ls is None:
            continue  # rmqdump/__init__: the public facade
        assert ls in RANK, f"{src}: rmqdump/{ls} is not a layer of ARCHITECTURE.md"
        for dst in targets:
            ld = _layer(dst)
            if ld is None:
                if dst == "rmqdump" and src.startswith(("rmqdump.cli", "rmqdump.spark")):
                    continue  # __version__
                bad.append(f"{src} -> {dst} (the package facade)")
            elif ld != ls and (RANK[ld] > RANK[ls] or (ls in SIBLINGS and ld in SIBLINGS)):
                bad.append(f"{src} ({ls}) -> {dst} ({ld})")
    assert bad == [], "imports against the layer rule:\n" + "\n".join(sorted(bad))


def test_no_import_cycles():
    graph = _imports()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in list(graph):
        if v not in index and v != "rmqdump":
            visit(v)
    assert cycles == []


def test_the_top_level_stays_small():
    modules = sorted(p.name for p in PKG.iterdir() if p.suffix == ".py")
    assert len(modules) <= TOP_LEVEL_LIMIT, modules
    assert set(modules) <= {"__init__.py", "errors.py", "findings.py"}


#: long modules not split yet (ARCHITECTURE.md, "Not yet in its room"): the list may only shrink
TO_SPLIT: set[str] = set()


def test_long_modules_say_why():
    """A module over ~600 lines says in its docstring why it is one module ("One module:"), or is on the
    TO_SPLIT list; a module split since must leave the list."""
    long = set()
    for name, path in _modules().items():
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > LONG_MODULE and "One module:" not in (ast.get_docstring(ast.parse(text)) or ""):
            long.add(name)
    assert long - TO_SPLIT == set(), "split these or say why they are one module"
    assert TO_SPLIT - long == set(), "split already: take them off TO_SPLIT"


def test_architecture_md_names_every_layer():
    doc = (PKG.parent / "ARCHITECTURE.md").read_text(encoding="utf-8")
    for layer in RANK:
        if layer not in ("errors", "findings"):
            assert f"`{layer}/`" in doc, layer


#: modules outside ``rmqdump/disk/`` still allowed to call ``os.open``/``os.fsync`` themselves, with why
#: (ARCHITECTURE.md, "A file-open policy"): the list may only shrink
RAW_OPEN_ALLOWED: dict[str, str] = {
    "rmqdump.rows.export": "writes the user's --to output, never a store file (pyarrow opens Parquet outputs itself)",
}


#: layers whose files are store files: a builtin ``open()`` there would block on a FIFO and follow links
STORE_READERS = {"store", "broker", "analysis", "write", "rows"}


def _proc_path(arg: ast.expr) -> bool:
    """``open(f"/proc/...")``: a kernel file about a process, not a store file."""
    if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
        return str(arg.values[0].value).startswith("/proc/")
    return isinstance(arg, ast.Constant) and str(arg.value).startswith("/proc/")


def _raw_disk_calls(tree: ast.AST, layer: str | None = None) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("open", "fsync") and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "os"):
            out.append((node.lineno, f"os.{node.func.attr}("))
        if (layer in STORE_READERS and isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "open" and not (node.args and _proc_path(node.args[0]))):
            out.append((node.lineno, "open("))
    return out


def test_one_door_to_the_disk():
    """Files are opened and fsynced in ``rmqdump/disk/`` only (``fileio``: reads and directories,
    ``durable``: write opens and fsync); everyone else asks it."""
    bad, used = [], set()
    for name, path in _modules().items():
        if _layer(name) == "disk":
            continue
        calls = _raw_disk_calls(ast.parse(path.read_text(encoding="utf-8")), _layer(name))
        if calls and name in RAW_OPEN_ALLOWED:
            used.add(name)
            continue
        bad += [f"{name}:{line}: {what}" for line, what in sorted(calls)]
    assert bad == [], "open and fsync files through rmqdump.disk (fileio / durable):\n" + "\n".join(bad)
    assert set(RAW_OPEN_ALLOWED) - used == set(), "these no longer open files themselves: take them off"


#: modules besides ``codec/layout.py`` that may call the ``struct`` module, with why
STRUCT_ALLOWED = {"rmqdump.broker.lock": "the OS's struct flock for fcntl(F_GETLK), not a RocketMQ layout"}
#: the record's magics as bare numbers (the kernels' old spelling; message texts may name them)
_MAGICS = {0xDAA320A7, 0xDAA320AB, 0xCBD43194}


def test_one_record_layout():
    """Every RocketMQ byte layout is declared once, in ``codec/layout.py``: no other module builds its own
    ``struct`` formats, and the compiled kernels take magics and field positions from it too."""
    bad = []
    for name, path in _modules().items():
        if name == "rmqdump.codec.layout" or name in STRUCT_ALLOWED:
            continue
        text = path.read_text(encoding="utf-8")
        for node in ast.walk(ast.parse(text)):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "struct"
                    and node.attr in ("Struct", "pack", "unpack", "pack_into", "unpack_from", "iter_unpack")):
                bad.append(f"{name}:{node.lineno}: struct.{node.attr}")
            if isinstance(node, ast.Constant) and type(node.value) is int and node.value in _MAGICS:
                bad.append(f"{name}:{node.lineno}: magic 0x{node.value:08X} spelled out")
        if _layer(name) == "fast":
            import re

            for m in re.finditer(r"\bpos \+ \d+\b", text):
                bad.append(f"{name}:{text.count(chr(10), 0, m.start()) + 1}: literal field offset {m.group()!r}")
    assert bad == [], "declare layouts in rmqdump/codec/layout.py and import them:\n" + "\n".join(bad)
