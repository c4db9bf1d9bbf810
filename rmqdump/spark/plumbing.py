"""Spark plumbing the jobs share: executor errors back as RmqdumpErrors, job-group progress, parallelize."""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from urllib.parse import unquote, urlparse

from rmqdump.errors import RmqdumpError

Progress = Callable[[int, int], None]

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):(//)?")


def local_path(path: str | os.PathLike, what: str = "store") -> str:
    """``path`` as an absolute local path (``file:`` URIs accepted). Other schemes (``s3a://``,
    ``hdfs://`` ...) are refused: rmqdump reads stores and writes exports with local file access, so
    every executor must see them at the same local (or mounted) path."""
    p = os.fspath(path)
    m = _URI.match(p)
    if m and len(m.group(1)) > 1 and (m.group(2) or m.group(1).lower() == "file"):
        u = urlparse(p)
        if u.scheme.lower() != "file" or u.netloc not in ("", "localhost"):
            raise RmqdumpError(f"{p}: {u.scheme}://{u.netloc} is not supported for the {what}: rmqdump reads and "
                               f"writes local (or mounted) paths that every executor sees; give a path or file:///path")
        p = unquote(u.path)
    return os.path.abspath(p)


_GLOB = re.compile(r"[*?[]")


def expand_paths(paths, what: str = "store") -> list[str]:
    """Store paths as absolute local paths (:func:`local_path`), a glob (``/data/broker-*/store``, for a
    path that does not exist as written) expanded on the driver: sorted, duplicates dropped. A glob that
    matches nothing is an error."""
    import glob

    out: list[str] = []
    for p in paths:
        lp = local_path(p, what)
        if _GLOB.search(lp) and not os.path.exists(lp):
            found = sorted(glob.glob(lp))
            if not found:
                raise RmqdumpError(f"{os.fspath(p)}: no {what} matches this pattern")
            out.extend(os.path.abspath(f) for f in found)
        else:
            out.append(lp)
    return list(dict.fromkeys(out))


def store_names(paths: list[str], given: Mapping[str, str] | None = None) -> dict[str, str]:
    """Broker names of the stores ``paths`` (absolute, as :func:`expand_paths` gives them): the unique
    defaults from the paths (:func:`rmqdump.rows.arrow.broker_names`), replaced where ``given`` (store path,
    ``file:`` URI or relative path -> name) names a store. A given path that is not one of ``paths``, an
    empty name, or one name for two stores is an error."""
    from rmqdump.rows.arrow import broker_names

    names = broker_names(paths)
    for path, name in (given or {}).items():
        key = local_path(path)
        if key not in names:
            raise RmqdumpError(f"{path}: a broker name is given for a path that is not one of the stores "
                               f"(give the store path as it is loaded)")
        if not isinstance(name, str) or not name.strip():
            raise RmqdumpError(f"{path}: empty broker name")
        names[key] = name.strip()
    seen: dict[str, str] = {}
    for path, name in names.items():
        if name in seen:
            raise RmqdumpError(f"broker name {name!r} names two stores ({seen[name]} and {path}): "
                               f"give each store its own name")
        seen[name] = path
    return names


_REMOTE_ERROR = re.compile(r"rmqdump\.errors\.(\w+Error): (.*)")


def _remote_error(e: BaseException) -> RmqdumpError | None:
    """The RmqdumpError an executor raised, from the text of a Spark task failure."""
    text = str(e)
    found = _REMOTE_ERROR.findall(text)
    if not found:
        return None
    from rmqdump import errors

    name, message = found[-1]
    cls = getattr(errors, name, RmqdumpError)
    if not (isinstance(cls, type) and issubclass(cls, RmqdumpError)):
        cls = RmqdumpError
    return cls(message.strip())


@contextmanager
def spark_errors():
    """Re-raise executor-side RmqdumpErrors as such (one line for the CLI)."""
    try:
        yield
    except RmqdumpError:
        raise
    except Exception as e:
        err = _remote_error(e)
        if err is None:
            raise
        raise err from None


@contextmanager
def track(spark, description: str, progress: Progress | None, interval: float = 0.5):
    """Run the enclosed Spark actions in a job group; report (completed tasks, total tasks) to ``progress``."""
    sc = spark.sparkContext
    group = f"rmqdump-{uuid.uuid4().hex[:12]}"
    sc.setJobGroup(group, description)
    stop = threading.Event()

    def poll() -> None:
        tracker = sc.statusTracker()
        while not stop.wait(interval):
            try:
                done = total = 0
                for jid in tracker.getJobIdsForGroup(group):
                    info = tracker.getJobInfo(jid)
                    for sid in (info.stageIds if info else ()):
                        st = tracker.getStageInfo(sid)
                        if st is not None:
                            done += st.numCompletedTasks
                            total += st.numTasks
                if total:
                    progress(done, total)
            except Exception:  # the session is going away: stop reporting
                return

    thread = threading.Thread(target=poll, name="rmqdump-progress", daemon=True) if progress else None
    if thread is not None:
        thread.start()
    try:
        with spark_errors():
            yield
    finally:
        stop.set()
        if thread is not None:
            thread.join(timeout=5)
        sc.setLocalProperty("spark.jobGroup.id", None)
        sc.setLocalProperty("spark.job.description", None)


def _parallelize(spark, items: list, slices: int | None = None):
    return spark.sparkContext.parallelize(items, max(1, slices or len(items)))


