"""Regenerate the README's command sections from real runs on the bundled fixture store.

    python scripts/gen_docs.py          # rewrite README.md between the GENERATED markers
    python scripts/gen_docs.py --check  # exit 1 if README.md is stale (what tests/test_docs.py checks)

Only the text between ``<!-- BEGIN GENERATED: commands -->`` and ``<!-- END GENERATED:
commands -->`` is replaced. Every command registered in ``rmqdump.cli.COMMANDS`` gets a
section with its help; the examples below (or a ``DOC_EXAMPLES`` list of argument lists in
the command's own module) are run from the repository root, as on a terminal (table output),
and their output (stdout and stderr) is pasted verbatim. The ``NARROW`` examples run the real
CLI on a pseudo-terminal 80 columns wide, to show how tables give way on a small terminal.
"""

from __future__ import annotations

import importlib
import os
import select
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import click  # noqa: E402
from click.testing import CliRunner  # noqa: E402

from rmqdump.cli import COMMANDS, cli  # noqa: E402

README = REPO / "README.md"
BEGIN = "<!-- BEGIN GENERATED: commands -->"
END = "<!-- END GENERATED: commands -->"
STORE = "fixtures/store"
NOW = "2026-11-01T01:00:00Z"
#: Sections come in this order; commands not listed follow alphabetically.
ORDER = ("info", "scan", "stats", "pending", "consumers")
#: Examples run for the docs (argument lists after ``rmqdump``).
EXAMPLES: dict[str, list[list[str]]] = {
    "info": [["info", STORE]],
    "scan": [
        ["scan", STORE, "-n", "5"],
        ["scan", STORE, "--resolve", "--topic", "TopicDelay", "--topic", "TopicTx", "--body", "text"],
        ["scan", STORE, "--follow", "--from-end", "--until-idle", "1"],
        ["scan", STORE, "--body-regex", "RocketMQ (1[0-2])$", "--body", "text"],
    ],
    "stats": [["stats", STORE]],
    "pending": [["pending", STORE, "--now", NOW], ["pending", STORE, "--all", "--now", NOW]],
    "consumers": [["consumers", STORE], ["consumers", STORE, "--unconsumed", "--topic", "TopicTest", "--body", "text"]],
}
DAMAGED = "fixtures/oracle/498-flip-body-mid/store"
#: Examples run on a real 80-column (pseudo-)terminal: (width, arguments after ``rmqdump``).
NARROW: dict[str, list[tuple[int, list[str]]]] = {
    "scan": [(80, ["scan", STORE, "-n", "5", "--body", "text"])],
    "verify": [(80, ["verify", DAMAGED])],
}
NARROW_INTRO = {
    "scan": "On an 80-column terminal the table keeps every offset and number whole, abbreviates free text "
            "with `…` and names the columns it had no room for (stderr):",
    "verify": f"A damaged store (`{DAMAGED}`, written by RocketMQ 4.9.8, then a MAGICCODE byte zeroed and a body bit flipped) on an "
              "80-column terminal: each finding's detail goes on its own line under its location and kind "
              "(beside them on a wider terminal):",
}
INTRO = {
    "scan": "Add `--resolve` to see where system-topic records are really going, `--follow` (`-F`) to keep "
            "reading a live store like `tail -f` (pread only; an unwritten or half-written tail is waited for, "
            "never reported as damage; stop with Ctrl-C or `--until-idle SECONDS`).",
    "stats": "`-f json` prints the whole document; `-f csv` / `-f jsonl` print one row per entry "
             "(`section,topic,queue_id,key,records,bytes,body_bytes,value`).",
    "pending": "States: `pending` (the broker still owes it), `delivered`/`resolved`, `superseded` (a re-put "
               "copy replaced it), `redeliver` (a copy exists but delayOffset.json is behind: the broker would "
               "deliver it again), `lost` (the offsets say delivered, but no copy is on disk; exit 1). "
               "`--now` pins the reference time of the `overdue` flag.",
    "consumers": "`-f jsonl` with `--unconsumed` exports the never-consumed messages (scan schema plus `group`).",
}
#: Store formats beyond the classic layout, each shown by a real run on its bundled fixture (issues 18, 19):
#: (title, what it is, argument lists after ``rmqdump``).
FORMATS: list[tuple[str, str, list[list[str]]]] = [
    ("DLedger commitlog (`enableDLegerCommitLog`)",
     "`dledger-<id>/data` entries (a 48-byte header wrapping a commitlog record) are unwrapped: records sit at the "
     "offsets RocketMQ gives them (entry position + 48), so queues, index and lookups agree; entry headers, index "
     "units, `checkpoint` and `currterm` are checked and DLedger's own recovery is predicted. The fixture was "
     "written by RocketMQ 4.9.8's `DLedgerCommitLog` (its 160 MiB index file is bundled cut short, which `verify` "
     "reports). `append` and `repair` refuse DLedger stores.",
     [["scan", "fixtures/oracle/498-dledger/store", "-n", "3"]]),
    ("Several commitlog folders (`storePathCommitLog=a,b`)",
     "`--commitlog-path` (or `--broker-config FILE`) names every folder; segments are read across them in offset "
     "order, a name in two folders or a gap is a finding, and a folder of segments left out is named. Written by "
     "RocketMQ 4.9.8 over two folders:",
     [["verify", "fixtures/oracle/498-multipath/store", "--commitlog-path", "commitlog,disk2/commitlog"]]),
    ("RocksDB consume queues and config (`storeType=defaultRocksDB`, `configManagerVersion=v2`)",
     "Opened read-only (through a private folder of links: the store is not touched); the queues feed the same "
     "checks and lookups as ConsumeQueue files, the config tables feed `consumers`, `info` and `stats`. The "
     "fixture is `fixtures/store` with its queues and config written into RocksDB by the real RocksDB library "
     "in the layout of RocketMQ 5.3.3's source (`scripts/rocksdb_fixture.py`; RocketMQ's oracle has no RocksDB "
     "library). Needs `pip install 'rmqdump[rocksdb]'`.",
     [["consumers", "fixtures/rocksdb/store-rocks"]]),
    ("Compaction topics (`cleanup.policy=COMPACTION`)",
     "`compaction/compactionLog`, the sparse `compactionCq` and `position-checkpoint` are read and checked "
     "against the topic's commitlog records and RocketMQ's keep rule (`verify`). Written and compacted by "
     "RocketMQ 5.3.3:",
     [["info", "fixtures/oracle/533-compaction/store"]]),
]
FORMATS_INTRO = ("### Other store formats\n\nThe timer store has its own command (`rmqdump timer`, above); "
                 "controller-mode epoch files (`epochFileCheckpoint`, `brokerIdentity`) are shown by `info` and "
                 "checked by `verify` (the records past the checkpoint's confirm offset of a truncated slave, "
                 "apache/rocketmq #10666, are a finding).\n")

CONVENTIONS = """\
### Conventions shared by every command

* **Output**: data goes to stdout, diagnostics to stderr (one line each). `--format/-f
  table|jsonl|json|csv` (table on a terminal, jsonl when piped) and `--quiet/-q` are the same
  on every command.
* **Progress**: a progress bar appears on stderr for work taking more than about a second, only
  on a terminal, never with `--quiet` or when stderr is piped. `NO_COLOR` turns colour off.
* **Errors**: one line, `rmqdump: error: <file> at byte <offset>: <what>`, exit 2;
  `rmqdump --traceback COMMAND ...` shows the Python traceback instead.
* **Exit codes**: `0` ok · `1` findings (damage, lost messages) · `2` error (bad input or usage).
  A reader that goes away (`rmqdump scan STORE | head`) ends the command quietly with `0`, as
  `git log | head` does.
* **Bodies** (`--body SPEC` on scan, pending, consumers): `none`, `text`, `text:CHARSET`
  (e.g. `text:gbk`), `hex`, `base64`, `json` (parsed and embedded as JSON), or
  `MODULE:FUNCTION`, your own Python callable taking the body bytes and returning a string or
  any JSON value (the current directory is importable), e.g. `--body mydecoders:protobuf_to_dict`.
* **Version**: `rmqdump --version`.
* **Shell completion** (click): add one of these to your shell's startup file:

  ```sh
  eval "$(_RMQDUMP_COMPLETE=bash_source rmqdump)"     # ~/.bashrc
  eval "$(_RMQDUMP_COMPLETE=zsh_source rmqdump)"      # ~/.zshrc
  _RMQDUMP_COMPLETE=fish_source rmqdump | source      # ~/.config/fish/completions/rmqdump.fish
  ```
"""


@contextmanager
def _as_on_a_terminal():
    """Commands pick table output when stdout is a terminal; CliRunner's is not, so say it is."""
    from rmqdump.cli import output

    original = output.default_format

    def default_format(fmt, report=False):
        return fmt or "table"

    modules = [m for m in list(sys.modules.values()) if getattr(m, "default_format", None) is original]
    for m in modules:
        m.default_format = default_format
    try:
        yield
    finally:
        for m in modules:
            m.default_format = original


def run(args: list[str]) -> tuple[int, str]:
    """Run ``rmqdump ARGS`` from the repository root; (exit code, stdout+stderr with trailing spaces cut)."""
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        for name in args[:1]:
            if name in COMMANDS:
                importlib.import_module(COMMANDS[name][0])
        with _as_on_a_terminal():
            res = CliRunner().invoke(cli, args, prog_name="rmqdump",
                                     env={"COLUMNS": "100", "NO_COLOR": "1", "FORCE_COLOR": None, "TERM": "dumb"})
    finally:
        os.chdir(cwd)
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise RuntimeError(f"rmqdump {' '.join(args)} crashed: {res.exception!r}") from res.exception
    return res.exit_code, "\n".join(line.rstrip() for line in res.output.splitlines())


def run_on_terminal(args: list[str], width: int, timeout: float = 120.0) -> tuple[int, str]:
    """Run ``rmqdump ARGS`` from the repository root on a pseudo-terminal ``width`` columns wide (stdout and
    stderr both on it, TERM=dumb so nothing is styled); (exit code, the screen text, trailing spaces cut)."""
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, width, 0, 0))
    env = dict(os.environ, COLUMNS=str(width), LINES="50", TERM="dumb", NO_COLOR="1")
    env.pop("FORCE_COLOR", None)
    code = "import sys; from rmqdump.cli import main; sys.argv[0] = 'rmqdump'; main()"
    p = subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, stdin=subprocess.DEVNULL, stdout=slave,
                         stderr=slave, env=env, close_fds=True)
    os.close(slave)
    out = bytearray()
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                p.kill()
                raise RuntimeError(f"rmqdump {' '.join(args)} did not finish in {timeout} s")
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(master)
    rc = p.wait(timeout=timeout)
    text = out.decode("utf-8", "replace").replace("\r\n", "\n")
    if "Traceback" in text:
        raise RuntimeError(f"rmqdump {' '.join(args)} crashed:\n{text}")
    return rc, "\n".join(line.rstrip() for line in text.rstrip("\n").splitlines())


def _examples(name: str) -> list[list[str]]:
    if name in EXAMPLES:
        return EXAMPLES[name]
    module = importlib.import_module(COMMANDS[name][0])
    return [list(a) for a in getattr(module, "DOC_EXAMPLES", [])]


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_./:=%," for c in arg) else "'" + arg.replace("'", "'\\''") + "'"


def _first_paragraph(cmd: click.Command) -> str:
    return " ".join((cmd.help or "").strip().split("\n\n")[0].split())


def render() -> str:
    """The generated block, markers included."""
    names = [n for n in ORDER if n in COMMANDS] + sorted(n for n in COMMANDS if n not in ORDER)
    out = [BEGIN, "<!-- generated by scripts/gen_docs.py from runs on fixtures/: do not edit by hand; "
                  "run `python scripts/gen_docs.py` -->", ""]
    for name in names:
        module, attr, short = COMMANDS[name]
        cmd = getattr(importlib.import_module(module), attr)
        out += [f"### `rmqdump {name}`", "", _first_paragraph(cmd), ""]
        if name in INTRO:
            out += [INTRO[name], ""]
        for args in _examples(name):
            code, text = run(args)
            out += ["```console", "$ rmqdump " + " ".join(_quote(a) for a in args), text]
            if code:
                out.append(f"[exit status {code}]")
            out += ["```", ""]
        for width, args in NARROW.get(name, []):
            code, text = run_on_terminal(args, width)
            out += [NARROW_INTRO[name], "", "```console", "$ rmqdump " + " ".join(_quote(a) for a in args), text]
            if code:
                out.append(f"[exit status {code}]")
            out += ["```", ""]
        _, help_text = run([name, "--help"])
        out += ["<details><summary>all options</summary>", "", "```text", help_text, "```", "", "</details>", ""]
    out += [FORMATS_INTRO]
    for title, what, examples in FORMATS:
        out += [f"#### {title}", "", what, ""]
        for args in examples:
            code, text = run(args)
            out += ["```console", "$ rmqdump " + " ".join(_quote(a) for a in args), text]
            if code:
                out.append(f"[exit status {code}]")
            out += ["```", ""]
    out += [CONVENTIONS, END]
    return "\n".join(out)


def current_block(text: str) -> str:
    """The generated block of a README text (markers included)."""
    if text.count(BEGIN) != 1 or text.count(END) != 1:
        raise SystemExit(f"README.md must contain {BEGIN} and {END} exactly once")
    start, end = text.index(BEGIN), text.index(END) + len(END)
    return text[start:end]


def main(argv: list[str]) -> int:
    text = README.read_text(encoding="utf-8")
    old = current_block(text)
    new = render()
    if "--check" in argv:
        if old != new:
            print("README.md command sections are stale: run python scripts/gen_docs.py", file=sys.stderr)
            return 1
        return 0
    if old != new:
        README.write_text(text.replace(old, new), encoding="utf-8")
        print("README.md updated")
    else:
        print("README.md is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
