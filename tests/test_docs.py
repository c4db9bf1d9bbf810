"""The README never goes stale: generated command sections match real runs, and every documented
example runs as shown (on a copy of the bundled fixture store)."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import re
import shlex
import shutil

import pytest
from click.testing import CliRunner

from conftest import FIXTURES, REPO
from rmqdump.cli import COMMANDS, cli

README = REPO / "README.md"


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", REPO / "scripts" / "gen_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_generated_command_sections_match_the_readme():
    gen = _gen_docs()
    text = README.read_text(encoding="utf-8")
    assert text.count(gen.BEGIN) == 1 and text.count(gen.END) == 1
    assert gen.current_block(text) == gen.render(), "README.md is stale: run `python scripts/gen_docs.py`"


def test_every_command_has_a_section():
    text = README.read_text(encoding="utf-8")
    for name in COMMANDS:
        assert f"### `rmqdump {name}`" in text, name


def _blocks(lang: str) -> list[str]:
    text = README.read_text(encoding="utf-8")
    return re.findall(rf"^```{lang}\n(.*?)^```", text, flags=re.S | re.M)


def _command_lines() -> list[str]:
    """Every `rmqdump ...` command in the README's sh blocks (split at && and |, comments dropped)."""
    out = []
    for block in _blocks("sh"):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            for part in re.split(r"&&|\|", line):
                part = part.strip()
                if part.startswith("rmqdump "):
                    out.append(part)
    return out


COMMAND_LINES = _command_lines()


def test_readme_has_runnable_examples():
    assert any(c.startswith("rmqdump scan fixtures/store") for c in COMMAND_LINES)  # the quick start


@pytest.mark.parametrize("line", COMMAND_LINES)
def test_documented_example_runs(line, tmp_path):
    shutil.copytree(FIXTURES / "store", tmp_path / "fixtures" / "store")
    args = [("fixtures/store" if a in ("STORE", "PATH") else a) for a in shlex.split(line)[1:]]
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        res = CliRunner().invoke(cli, args, prog_name="rmqdump")
    finally:
        os.chdir(cwd)
    assert res.exception is None or isinstance(res.exception, SystemExit), f"{line}: {res.exception!r}"
    assert res.exit_code in (0, 1), f"{line}: exit {res.exit_code}: {res.output}"


@pytest.mark.parametrize("code", _blocks("python"))
def test_documented_python_runs(code):
    code = code.replace('"/data/rocketmq/store"', repr(str(FIXTURES / "store")))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {})
    assert out.getvalue().strip()


def test_readme_shows_the_tables_on_an_80_column_terminal():
    """The scan and verify sections show a real run on an 80-column pseudo-terminal, and it fits."""
    gen = _gen_docs()
    text = README.read_text(encoding="utf-8")
    assert {name for name, runs in gen.NARROW.items() for width, _ in runs if width == 80} >= {"scan", "verify"}
    for name, runs in gen.NARROW.items():
        section = text[text.index(f"### `rmqdump {name}`"):]
        for width, args in runs:
            cmd = "$ rmqdump " + " ".join(args)
            block = section[section.index(cmd):].split("```", 1)[0].splitlines()[1:]
            assert len(block) > 5 and "…" not in block[0]
            assert all(len(line) <= width for line in block if not line.startswith(("hidden at", "stopped"))), block
