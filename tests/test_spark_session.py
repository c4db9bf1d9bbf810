"""``build_session`` adds to the cluster's settings: spark-defaults.conf and the caller's conf are kept."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark

DEFAULTS = """\
# a cluster's spark-defaults.conf
spark.driver.extraJavaOptions   -Dcluster.flag=yes
spark.executor.extraJavaOptions=-Dexec.flag=1
spark.ui.enabled true
spark.sql.shuffle.partitions 13
"""

SCRIPT = """\
import json
from rmqdump.spark import build_session
s = build_session("local[1]", app_name="rmqdump-session-test")
c = s.sparkContext.getConf()
sysprop = s.sparkContext._jvm.System.getProperty
print(json.dumps({"driver": c.get("spark.driver.extraJavaOptions"), "executor": c.get("spark.executor.extraJavaOptions"),
                  "ui": c.get("spark.ui.enabled"), "shuffle": s.conf.get("spark.sql.shuffle.partitions"),
                  "cluster_flag": sysprop("cluster.flag"), "log4j": sysprop("log4j2.configurationFile"),
                  "tz": s.conf.get("spark.sql.session.timeZone")}))
s.stop()
"""


def test_session_conf_keeps_callers_and_clusters_settings(monkeypatch):
    pytest.importorskip("pyspark")
    from rmqdump.spark.session import session_conf

    monkeypatch.delenv("PYSPARK_GATEWAY_PORT", raising=False)
    mine = session_conf("local[2]", {}, {})
    assert "spark.ui.enabled" not in mine and "spark.sql.shuffle.partitions" not in mine
    assert "spark.executor.extraJavaOptions" not in mine
    assert mine["spark.driver.extraJavaOptions"].startswith("-Dlog4j2.configurationFile=file:")
    cluster = {"spark.driver.extraJavaOptions": "-Xss4m -Dc=1", "spark.sql.session.timeZone": "Europe/Paris",
               "spark.pyspark.python": "/opt/py/bin/python3"}
    got = session_conf("local[2]", {}, cluster)
    assert got["spark.driver.extraJavaOptions"].startswith("-Xss4m -Dc=1 -Dlog4j2.configurationFile=file:")
    assert "spark.sql.session.timeZone" not in got and "spark.pyspark.python" not in got  # the cluster's stay
    # the caller's --conf replaces the cluster's value (as spark-submit does); ours is appended to it
    user = session_conf("local[2]", {"spark.driver.extraJavaOptions": "-Du=1", "spark.ui.enabled": "false"}, cluster)
    assert user["spark.driver.extraJavaOptions"].startswith("-Du=1 -Dlog4j2.configurationFile=file:")
    assert user["spark.ui.enabled"] == "false"
    # a log4j configuration of their own is left alone
    own = session_conf("local[2]", {}, {"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=/etc/l.xml"})
    assert "spark.driver.extraJavaOptions" not in own


def test_build_session_adds_to_spark_defaults(tmp_path):
    pytest.importorskip("pyspark")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        pytest.skip("no Java runtime for Spark")
    (tmp_path / "spark-defaults.conf").write_text(DEFAULTS)
    env = {**os.environ, "SPARK_CONF_DIR": str(tmp_path)}
    env.pop("PYSPARK_GATEWAY_PORT", None)
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert "-Dcluster.flag=yes -Dlog4j2.configurationFile=file:" in got["driver"]  # (after Spark's own)
    assert got["cluster_flag"] == "yes" and got["log4j"].startswith("file:")  # the driver JVM got both
    assert got["executor"].endswith(" -Dexec.flag=1") and "log4j2" not in got["executor"]
    assert got["ui"] == "true" and got["shuffle"] == "13"
    assert got["tz"] == "UTC"


PLAIN_FIRST = """\
import json, sys
from click.testing import CliRunner
from pyspark.sql import SparkSession
from rmqdump.cli import cli
plain = SparkSession.builder.master("local[1]").appName("plain").getOrCreate()  # as the README example does
out = {"python": plain.sparkContext.pythonExec}
for name, args in (("stats", ["spark", "stats", "fixtures/store", "--by", "topic", "-f", "jsonl", "-q"]),
                   ("export", ["spark", "export", "fixtures/store", "--out", sys.argv[1], "-q"])):
    res = CliRunner().invoke(cli, args)
    out[name] = {"exit": res.exit_code, "stdout": res.stdout, "stderr": res.stderr[-1500:]}
out["same_session"] = SparkSession.getActiveSession() is plain
print(json.dumps(out))
"""


def test_cli_in_a_process_with_a_plain_session_running(tmp_path):
    """A plain SparkSession created first (its Python workers: `python3` from PATH, which cannot import
    rmqdump), then `rmqdump spark stats` / `export` in the same process: build_session reuses the session
    and runs its Python side (data source planning, the export's tasks) with rmqdump's interpreter."""
    pytest.importorskip("pyspark")
    java = shutil.which("java")
    if java is None:
        pytest.skip("no Java runtime for Spark")
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("python3", "python"):
        (fake / name).write_text("#!/bin/sh\necho 'not the rmqdump interpreter' >&2\nexit 3\n")
        (fake / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYSPARK_GATEWAY_PORT")}
    env["PATH"] = os.pathsep.join((str(fake), os.path.dirname(os.path.realpath(java)), "/usr/bin", "/bin"))
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", PLAIN_FIRST, str(tmp_path / "out")], cwd=repo, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    assert got["python"] == "python3" and got["same_session"]
    assert got["stats"]["exit"] == 0, got["stats"]["stderr"]
    topics = {json.loads(line)["topic"]: json.loads(line)["records"] for line in got["stats"]["stdout"].splitlines()}
    assert topics.get("TopicTest", 0) > 0
    assert got["export"]["exit"] == 0, got["export"]["stderr"]
    assert (tmp_path / "out" / "_SUCCESS").exists() and any((tmp_path / "out").glob("*.parquet"))
