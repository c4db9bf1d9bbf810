"""Regenerate ``fixtures/oracle/<name>/`` with RocketMQ's own store code (``../shared/oracle``).

Each fixture directory holds ``recipe.json`` (``version`` 498|533, ``put_flags``, ``run_args``,
``run_sets``, ``mutations``, optional ``until``) and ``spec.jsonl``; this script writes ``store/`` with ``put``,
applies the mutations (bytes changed after RocketMQ wrote them) and records ``manifest.jsonl``, what ``run``
read back from a copy. ``until`` names a ``verify`` finding kind a store shows only now and then (a race inside
RocketMQ): ``put`` writes again until the store has it and RocketMQ's log (kept as ``rocketmq.log``) names an
error. Usage: ``python scripts/make_oracle_fixtures.py [NAME ...]`` (default: every fixture).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from oracle.harness import apply_mutations, load, put, read_jsonl, unavailable_reason  # noqa: E402

#: how many stores ``until`` writes at most (RocketMQ's compaction race: about 1 in 20)
UNTIL_TRIES = 100


def _has_finding(store: Path, kind: str) -> bool:
    from rmqdump.analysis.verify import verify_store

    return any(f.kind == kind for f in verify_store(store).findings)


def make(fixture: Path) -> None:
    recipe = json.loads((fixture / "recipe.json").read_text(encoding="utf-8"))
    version = recipe["version"]
    store = fixture / "store"
    if store.exists():
        shutil.rmtree(store)
    until, log = recipe.get("until"), fixture / "rocketmq.log"
    for attempt in range(1, UNTIL_TRIES + 1):
        put(version, store, read_jsonl(fixture / "spec.jsonl"), tuple(recipe.get("put_flags", ())),
            log=log if until else None)
        if not until or (" ERROR " in log.read_text() and _has_finding(store, until)):
            break
        if attempt == UNTIL_TRIES:
            raise SystemExit(f"{fixture.name}: no {until} in {UNTIL_TRIES} stores written")
        shutil.rmtree(store)
    apply_mutations(store, recipe.get("mutations", []))
    args = [*recipe["run_args"], *(f"--set={k}={v}" for k, v in recipe.get("run_sets", {}).items())]
    manifest = load(version, store, args)
    (fixture / "manifest.jsonl").write_text("".join(json.dumps(m) + "\n" for m in manifest), encoding="utf-8")
    print(f"{fixture.name}: {sum(m['type'] == 'message' for m in manifest)} records read back by RocketMQ")


def main(names: list[str]) -> int:
    root = REPO / "fixtures" / "oracle"
    fixtures = [root / n for n in names] if names else sorted(p.parent for p in root.glob("*/recipe.json"))
    for fixture in fixtures:
        if not (fixture / "recipe.json").is_file():
            print(f"no fixture {fixture} (usage: make_oracle_fixtures.py [NAME ...])", file=sys.stderr)
            return 2
        reason = unavailable_reason(json.loads((fixture / "recipe.json").read_text())["version"])
        if reason:
            print(f"cannot regenerate {fixture.name}: {reason}", file=sys.stderr)
            return 2
        make(fixture)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
