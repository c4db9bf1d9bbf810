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
TO_SPLIT = {"rmqdump.write.writer", "rmqdump.write.appender", "rmqdump.rows.arrow",
            "rmqdump.broker.recovery", "rmqdump.store.consumequeue", "rmqdump.store.indexfile", "rmqdump.fast.walk",
            "rmqdump.analysis.lookup", "rmqdump.analysis.verify.records", "rmqdump.analysis.verify.store_checks"}


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
