"""``repair --rebuild-cq`` multi-dispatches LMQ records as RocketMQ does: the rebuilt ``consumequeue/``
of ``fixtures/oracle/498-healthy-lmq`` (written by RocketMQ 4.9.8 with ``enableMultiDispatch``) equals
RocketMQ's own files byte for byte, ``%LMQ%`` queues included."""

from __future__ import annotations

from click.testing import CliRunner
from oracle_fixtures import fixture_dir

from rmqdump.cli import cli


def test_rebuilt_consume_queues_equal_rocketmqs(tmp_path):
    store = fixture_dir("498-healthy-lmq") / "store"
    res = CliRunner().invoke(cli, ["repair", str(store), "--rebuild-cq", "--to", str(tmp_path / "out"), "-q"])
    assert res.exit_code == 0, res.output

    def files(root):
        base = root / "consumequeue"
        return {p.relative_to(base).as_posix(): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}

    theirs = {k: v for k, v in files(store).items() if not k.startswith("SCHEDULE_TOPIC_XXXX/")}
    ours = files(tmp_path / "out")
    assert any(k.startswith("%LMQ%") for k in theirs)
    assert ours == theirs
