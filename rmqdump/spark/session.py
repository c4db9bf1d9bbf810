"""A quiet SparkSession for rmqdump: no console progress bar, errors-only logging, UTC, small shuffles."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
SHUFFLE_PARTITIONS = 8

_LOG4J2 = """\
# rmqdump: Spark logs errors only, on stderr
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
# the shell logger at the root level: no "Setting default log level" banner
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = error
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.submit.name = org.apache.spark.deploy.SparkSubmit
logger.submit.level = error
"""


def log4j2_config() -> str:
    """Path of a log4j2 properties file (errors only) for the driver and local executors."""
    digest = hashlib.sha256(_LOG4J2.encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"rmqdump-log4j2-{digest}.properties")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(_LOG4J2)
        os.replace(tmp, path)
    return path


def under_spark_submit() -> bool:
    """Whether this Python process was started by spark-submit (which chose the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def session_conf(master: str | None = None, conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The configuration :func:`build_session` applies (user ``conf`` wins)."""
    out = {
        "spark.ui.showConsoleProgress": "false",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": str(SHUFFLE_PARTITIONS),
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.python.worker.reuse": "true",
    }
    if not under_spark_submit():
        opt = f"-Dlog4j2.configurationFile=file:{log4j2_config()}"
        out["spark.driver.extraJavaOptions"] = opt
        out["spark.executor.extraJavaOptions"] = opt
        if "PYSPARK_PYTHON" not in os.environ:
            # executors must run an interpreter that can import rmqdump: this one, when on this machine
            out["spark.pyspark.python"] = sys.executable
            out["spark.pyspark.driver.python"] = sys.executable
    if master and master.startswith("local"):
        out["spark.driver.bindAddress"] = "127.0.0.1"
        out["spark.driver.host"] = "127.0.0.1"
    out.update(conf or {})
    return out


_JVM_NOISE = (b"WARNING: Using incubator modules",)


def _pump_stderr(stream) -> None:
    """Forward the JVM's stderr to ours, minus its known start-up noise."""
    for line in iter(stream.readline, b""):
        if not line.startswith(_JVM_NOISE):
            try:
                os.write(2, line)
            except OSError:
                pass


def _launch_quiet_gateway(settings: Mapping[str, str]) -> None:
    """Start the driver JVM ourselves (stderr filtered) unless one runs already; best effort."""
    from pyspark import SparkConf, SparkContext

    if SparkContext._gateway is not None or under_spark_submit():
        return
    try:
        from subprocess import PIPE

        from pyspark.java_gateway import launch_gateway

        conf = SparkConf(loadDefaults=False)
        for k, v in settings.items():
            conf.set(k, v)
        gateway = launch_gateway(conf, popen_kwargs={"stderr": PIPE})
    except Exception:  # fall back to pyspark's own launch
        return
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.stderr is not None:
        threading.Thread(target=_pump_stderr, args=(proc.stderr,), name="rmqdump-jvm-stderr", daemon=True).start()
    SparkContext._ensure_initialized(gateway=gateway)


def build_session(master: str | None = None, app_name: str = "rmqdump", conf: Mapping[str, str] | None = None,
                  log_level: str = "ERROR") -> SparkSession:
    """Get or create a SparkSession with the rmqdump data sources registered.

    ``master`` defaults to ``local[*]``, except under spark-submit, whose ``--master`` is kept.
    Settings of an already running session (e.g. the master) cannot change.
    """
    from pyspark.sql import SparkSession

    from rmqdump.spark.datasource import register_data_sources

    if master is None and not under_spark_submit():
        master = DEFAULT_MASTER
    settings = session_conf(master, conf)
    if "spark.pyspark.python" in settings and "PYSPARK_PYTHON" not in os.environ:
        # Spark's Python data source planner starts `python3` from PATH whatever spark.pyspark.python
        # says: without this, a venv used by path (not activated) plans with an interpreter lacking pyarrow
        os.environ["PYSPARK_PYTHON"] = settings["spark.pyspark.python"]
    builder = SparkSession.builder.appName(app_name)
    if master:
        builder = builder.master(master)
    for k, v in settings.items():
        builder = builder.config(k, v)
    _launch_quiet_gateway({"spark.app.name": app_name, **({"spark.master": master} if master else {}), **settings})
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register_data_sources(spark)
    return spark
