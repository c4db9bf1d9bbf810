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
