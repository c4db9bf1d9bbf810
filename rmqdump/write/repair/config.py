"""``repair --restore-config``: a corrupt, empty or missing ``config/*.json`` restored from its ``.bak``.

After a power loss a broker's ``config/*.json`` may be empty, NUL-filled or cut short (apache/rocketmq
#7729, #6096). ``ConfigManager.load`` then falls back to ``<name>.bak``, but its next persist
(``MixAll.string2File``) copies the *corrupt* main file over the ``.bak``: one more crash and both are
gone. The restore makes the main file a byte copy of its ``.bak`` — only when the ``.bak`` itself is what
the broker's loader accepts (:func:`rmqdump.store.config.parse_fastjson` plus the typed decoder of the
file, as :func:`rmqdump.store.config.load_config_file` reads them). A file whose ``.bak`` is bad too is
never touched: the plan is blocked and says why.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rmqdump.codec.layout import STORE_CONFIG_DIR
from rmqdump.errors import FormatError, StoreError
from rmqdump.store.config import (
    BAK_SUFFIX,
    CONSUMER_OFFSET_JSON,
    DELAY_OFFSET_JSON,
    SUBSCRIPTION_GROUP_JSON,
    TOPICS_JSON,
    decode_consumer_offsets,
    decode_delay_offsets,
    decode_subscription_groups,
    decode_topics,
    parse_fastjson,
    read_config_bytes,
)
from rmqdump.write.repair.model import Change, RepairPlan


def _any_object(value: Any, file: Path) -> Any:
    """Every ``ConfigManager.decode`` reads a JSON object (its wrapper class); anything else loads nothing."""
    if not isinstance(value, dict):
        raise FormatError("not a JSON object (the broker's config loader reads an object)", file)
    return value


#: the typed decoder of each config file rmqdump knows; other ``*.json`` must hold an object
DECODERS: dict[str, Callable[[Any, Path], Any]] = {
    TOPICS_JSON: decode_topics, CONSUMER_OFFSET_JSON: decode_consumer_offsets,
    DELAY_OFFSET_JSON: decode_delay_offsets, SUBSCRIPTION_GROUP_JSON: decode_subscription_groups,
}


@dataclass
class ConfigState:
    """One ``config/<name>`` and its ``.bak``: ``problem`` is why the main file is unusable ("" if it is fine)."""

    name: str
    problem: str
    bak: bytes | None = None  # the .bak's bytes when they validate
    bak_problem: str = ""
    main_exists: bool = True


def validate_config(raw: bytes | None, path: Path) -> str:
    """Why ``raw`` (a config file's bytes, None: missing) is not what the broker's loader accepts; "" if it is."""
    if raw is None:
        return "missing"
    if not raw:
        return "empty (0 bytes)"
    if not raw.strip(b" \t\r\n\f\v\0"):
        return f"{len(raw)} bytes of whitespace/NUL, no JSON"
    try:
        value = parse_fastjson(raw, path)
        if value is None:
            return "no JSON value"
        DECODERS.get(path.name.removesuffix(BAK_SUFFIX), _any_object)(value, path)
    except FormatError as e:
        return e.message
    return ""


def config_states(root: Path) -> list[ConfigState]:
    """Every ``config/*.json`` (or ``*.json.bak`` without its main file) that is not usable as it is."""
    cdir = root / STORE_CONFIG_DIR
    if not cdir.is_dir() or cdir.is_symlink():
        return []
    names = sorted({p.name.removesuffix(BAK_SUFFIX) for p in cdir.iterdir()
                    if p.name.endswith(".json") or p.name.endswith(".json" + BAK_SUFFIX)})
    out = []
    for name in names:
        main, bak = cdir / name, cdir / (name + BAK_SUFFIX)
        if main.is_symlink() or (os.path.lexists(main) and not stat.S_ISREG(os.lstat(main).st_mode)):
            out.append(ConfigState(name, "not a regular file", bak_problem="the main file is not a regular file"))
            continue
        try:
            problem = validate_config(read_config_bytes(main), main)
        except StoreError as e:
            problem = e.message
        if not problem:
            continue
        state = ConfigState(name, problem, main_exists=os.path.lexists(main))
        if bak.is_symlink():
            state.bak_problem = "the .bak is a symlink"
        else:
            try:
                raw = read_config_bytes(bak)
            except StoreError as e:
                raw, state.bak_problem = None, e.message
            if not state.bak_problem:
                state.bak_problem = validate_config(raw, bak)
                if not state.bak_problem:
                    state.bak = raw
        if not state.main_exists and state.bak is None:
            continue  # neither file: nothing the broker would load, nothing to restore
        out.append(state)
    return out


def config_changes(root: Path, plan: RepairPlan, restore: bool) -> None:
    """Add the restores to ``plan`` (``restore``), or a warning per unusable config file (without it).

    A restore is a ``delete`` of the main file (backed up, so ``--undo`` puts the corrupt bytes back)
    and a ``create`` holding the ``.bak``'s bytes. A file whose ``.bak`` is bad too blocks the plan.
    """
    refused = []
    for s in config_states(root):
        rel = f"{STORE_CONFIG_DIR}/{s.name}"
        if not restore:
            if s.bak is not None:
                plan.warnings.append(
                    f"{rel} is unusable ({s.problem}): the broker loads {s.name}{BAK_SUFFIX} instead and its next "
                    f"persist copies the bad file over {s.name}{BAK_SUFFIX}; --restore-config restores it")
            else:
                plan.warnings.append(f"{rel} is unusable ({s.problem}) and so is its {BAK_SUFFIX} ({s.bak_problem})")
            continue
        if s.bak is None:
            refused.append(f"{rel} is unusable ({s.problem}) and its {BAK_SUFFIX} cannot replace it "
                           f"({s.bak_problem})")
            continue
        why = f"{s.problem}: restored from {s.name}{BAK_SUFFIX} ({len(s.bak)} bytes, valid)"
        if s.main_exists:
            plan.changes.append(Change("delete", rel, group="config", why=why))
        plan.changes.append(Change("create", rel, size=len(s.bak), pieces=[(0, s.bak)] if s.bak else [],
                                   group="config", why=why))
        plan.step("config", "restore", file=rel, detail=s.problem, size=len(s.bak))
    if refused:
        plan.blocked = "; ".join(refused) + ": refusing to touch it (restore it by hand or from another replica)"
