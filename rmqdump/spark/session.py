"""A quiet SparkSession for rmqdump: no console progress bar, errors-only driver logging, UTC.

Settings add to the cluster's instead of replacing them: a key set in ``spark-defaults.conf``
(``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``) or given by the caller keeps its value, the log4j option
is appended to the driver's ``extraJavaOptions``, and the UI, shuffle partitions and executors' JVM
options are left to the cluster.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[*]"
DRIVER_JAVA_OPTIONS = "spark.driver.extraJavaOptions"

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
    """Path of a log4j2 properties file (errors only) for the driver (a local master runs its executors in it)."""
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


def cluster_defaults() -> dict[str, str]:
    """The cluster's ``spark-defaults.conf`` (``$SPARK_CONF_DIR``, else ``$SPARK_HOME/conf``, else the
    pyspark installation's ``conf``), as spark-submit reads it (Java properties: ``key value`` or
    ``key=value``); empty when there is none."""
    conf_dir = os.environ.get("SPARK_CONF_DIR")
    if not conf_dir:
        home = os.environ.get("SPARK_HOME")
        if not home:
            try:
                from pyspark.find_spark_home import _find_spark_home

                home = _find_spark_home()
            except Exception:  # no pyspark: no defaults
                return {}
        conf_dir = os.path.join(home, "conf")
    out: dict[str, str] = {}
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf"), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        line = line.strip()
        if not line or line[0] in "#!":
            continue
        m = re.match(r"([^\s=:]+)\s*[\s=:]\s*(.*)$", line)
        if m:
            out[m.group(1)] = m.group(2).strip()
    return out


def session_conf(master: str | None = None, conf: Mapping[str, str] | None = None,
                 defaults: Mapping[str, str] | None = None) -> dict[str, str]:
    """The configuration :func:`build_session` passes: rmqdump's settings for keys neither ``conf`` (the
    caller's, which wins) nor ``defaults`` (the cluster's, :func:`cluster_defaults` when None) set, and the
    log4j option appended to the driver's JVM options (theirs kept)."""
    conf = dict(conf or {})
    defaults = cluster_defaults() if defaults is None else dict(defaults)
    ours = {
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.python.filterPushdown.enabled": "true",
        "spark.python.worker.reuse": "true",
    }
    if not under_spark_submit() and "PYSPARK_PYTHON" not in os.environ:
        # executors must run an interpreter that can import rmqdump: this one, when on this machine
        ours["spark.pyspark.python"] = sys.executable
        ours["spark.pyspark.driver.python"] = sys.executable
    if master and master.startswith("local"):
        ours["spark.driver.bindAddress"] = "127.0.0.1"
        ours["spark.driver.host"] = "127.0.0.1"
    out = {k: v for k, v in ours.items() if k not in defaults and k not in conf}
    if not under_spark_submit():  # (under spark-submit the driver JVM runs already)
        theirs = conf.get(DRIVER_JAVA_OPTIONS, defaults.get(DRIVER_JAVA_OPTIONS, "")).strip()
        if "-Dlog4j2.configurationFile=" not in theirs and "-Dlog4j.configuration" not in theirs:
            out[DRIVER_JAVA_OPTIONS] = f"{theirs} -Dlog4j2.configurationFile=file:{log4j2_config()}".strip()
    out.update({k: v for k, v in conf.items() if k != DRIVER_JAVA_OPTIONS or k not in out})
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


def can_import_rmqdump(python: str) -> bool:
    """Whether the interpreter ``python`` (a path, or a name looked up on PATH as Spark does) imports
    rmqdump and pyarrow: this interpreter does; another one is asked."""
    found = shutil.which(python) or python
    if os.path.abspath(found) == os.path.abspath(sys.executable):
        return True
    try:
        run = subprocess.run([found, "-c", "import rmqdump, pyarrow"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return False
    return run.returncode == 0


def adopt_running_context() -> None:
    """A SparkContext started before :func:`build_session` (a plain ``SparkSession.builder.getOrCreate()``
    in the same process) runs Python workers with the interpreter it was started with (``PYSPARK_PYTHON`` /
    ``spark.pyspark.python`` then, else ``python3`` from PATH), which may lack rmqdump. On a local master
    (workers on this machine) such a session's Python side is pointed at this interpreter; on a cluster its
    setting is the cluster's business and is kept."""
    from pyspark import SparkContext

    sc = SparkContext._active_spark_context
    if sc is None or not str(sc.master).startswith("local"):
        return
    if not can_import_rmqdump(sc.pythonExec):
        sc.pythonExec = sys.executable


def build_session(master: str | None = None, app_name: str = "rmqdump", conf: Mapping[str, str] | None = None,
                  log_level: str = "ERROR") -> SparkSession:
    """Get or create a SparkSession with the rmqdump data sources registered.

    ``master`` defaults to ``local[*]``, except under spark-submit, whose ``--master`` is kept.
    Settings of an already running session (e.g. the master) cannot change; its Python workers are
    made able to import rmqdump (:func:`adopt_running_context`).
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
    adopt_running_context()
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register_data_sources(spark)
    return spark
