"""The compiled engine: the one decision (:func:`use_fast`), the kernels' shared library (built once per
machine in a child process, cached under :func:`cache_dir`, loaded with ctypes; numba's JIT without a C
compiler) and the small entry points on top of it (:func:`crc32`). Environment: see :mod:`rmqdump.fast.walk`."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.util
import os
import platform
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rmqdump.disk.durable import open_cache_file
from rmqdump.fast import abi
from rmqdump.fast.abi import (
    A_BUF,
    A_BYTE_LIMIT,
    A_CHECK_CRC,
    A_COLUMNS,
    A_CRC_MODE,
    A_LIMIT,
    A_MAX_N,
    A_MAX_RECORD_SIZE,
    A_N,
    A_OUT_CODE,
    A_OUT_N,
    A_OUT_POS,
    A_POS,
    A_SEG_START,
    A_SIZE,
    A_STATS,
    ARG_BLOCK_SIZE,
    BLANK,
    COLUMNS,
    CRC_CLMUL,
    CRC_TABLE,
    DEFER,
    FULL,
    INVALID,
    LIMIT,
    SEG_END,
    V_BLOCK_SIZE,
    V_COLUMNS,
    V_OUT_CODE,
    VSCAN_COLUMNS,
)

if TYPE_CHECKING:
    import numpy as np

FAST_THRESHOLD = 64 * 1024 * 1024  # bytes to walk from which the compiled path pays for itself

_np: Any = None
_backend: Any = None
_backend_lock = threading.Lock()


def _numpy():
    global _np
    if _np is None:
        import numpy

        _np = numpy
    return _np


class Backend:
    """The loaded kernels: ctypes entry points taking one int64 argument block each."""

    def __init__(self, kind: str, walk, crc32, info, vscan=None):
        self.kind = kind
        self.walk = walk
        self.crc32 = crc32
        self.vscan = vscan  # verify's per-record checks (None: an older build without them)
        block = (ctypes.c_int64 * 4)()
        info(ctypes.addressof(block))
        self.clmul = bool(block[0])
        if block[1] != ARG_BLOCK_SIZE:
            raise RuntimeError(f"kernel argument block {block[1]} != {ARG_BLOCK_SIZE}")

    def __repr__(self) -> str:
        return f"Backend({self.kind}, crc={'clmul' if self.clmul else 'table'})"


def cache_dir() -> Path:
    """Where the compiled kernels live: ``$RMQDUMP_CACHE_DIR``, else ``$XDG_CACHE_HOME/rmqdump``,
    else ``~/.cache/rmqdump``."""
    if os.environ.get("RMQDUMP_CACHE_DIR"):
        return Path(os.environ["RMQDUMP_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rmqdump"


def _cpu_signature() -> str:
    """CPU model and feature flags (the kernels are compiled for this host's CPU)."""
    sig = [platform.machine(), platform.processor()]
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    sig.append(line.strip())
                if line.strip() == "":
                    break
    except OSError:
        pass
    return "\n".join(sig)


def _abi() -> bytes:
    """The caller/kernel contract: argument block layout, return codes, columns."""
    return repr((A_BUF, A_POS, A_SIZE, A_LIMIT, A_MAX_RECORD_SIZE, A_CHECK_CRC, A_CRC_MODE, A_N, A_MAX_N,
                 A_BYTE_LIMIT, A_SEG_START, A_STATS, A_COLUMNS, A_OUT_N, A_OUT_POS, A_OUT_CODE, ARG_BLOCK_SIZE,
                 FULL, SEG_END, BLANK, LIMIT, DEFER, INVALID, CRC_TABLE, CRC_CLMUL, COLUMNS, VSCAN_COLUMNS,
                 V_COLUMNS, V_OUT_CODE, V_BLOCK_SIZE,
                 sorted((n, v) for n, v in vars(abi).items() if n.startswith(("A_", "V_", "DERIVED", "NOT_"))))).encode()


def _toolchain_signature() -> str:
    """The installed compiler (numba, llvmlite) by file identity: cheaper than importlib.metadata."""
    import importlib.util

    out = []
    for dist in ("numba", "llvmlite"):
        spec = importlib.util.find_spec(dist)
        if spec is not None and spec.origin:
            st = os.stat(spec.origin)
            out.append(f"{spec.origin}:{st.st_size}:{st.st_mtime_ns}")
    return "\n".join(out)


def kernel_library_path(prefix: str, source: str, abi: bytes, extra: str = "") -> Path:
    """Where the shared library built from ``rmqdump/fast/<source>`` lives: keyed by its ABI, source,
    the record layout, compiler, CPU and Python (may not exist yet)."""
    h = hashlib.sha256(abi)
    here = Path(__file__).resolve()
    h.update(here.with_name(source).read_bytes())
    h.update(here.with_name("_link.py").read_bytes())
    h.update((here.parent.parent / "codec" / "layout.py").read_bytes())  # the kernels' record layout
    h.update(_toolchain_signature().encode())
    h.update(_cpu_signature().encode())
    h.update((sys.implementation.cache_tag or "").encode())
    h.update(extra.encode())
    return cache_dir() / f"{prefix}-{h.hexdigest()[:24]}.so"


def library_path() -> Path:
    """The shared library of kernels for this machine, kernel source, numba and Python (may not exist yet)."""
    shared = hashlib.sha256(Path(__file__).with_name("_recordkernels.py").read_bytes()).hexdigest()  # imported
    return kernel_library_path("fastkernels", "_kernels.py", _abi(), os.environ.get("RMQDUMP_CRC", "").lower() + shared)


def library_ready() -> bool:
    """Whether the kernels' shared library is already built here (else the first fast walk builds
    it, 10-30 s once: a CLI may say so before starting)."""
    try:
        return _backend is not None or library_path().exists()
    except OSError:
        return False


@contextlib.contextmanager
def build_lock():
    """An fcntl lock on ``cache_dir()/build.lock``: one process builds a kernel library at a time
    (concurrent CLI runs or Spark workers would otherwise each compile it)."""
    import fcntl

    d = cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    fd = open_cache_file(d / "build.lock")
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def build_kernel_library(module: str, path: Path) -> None:
    """Build ``python -m <module> <path> <cc>`` in a child process (numba compiles from an empty
    scratch cache there, so this process never imports numba). Raises on failure."""
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="rmqdump-numba-") as tmp:
        env = {**os.environ, "NUMBA_CACHE_DIR": tmp}
        res = subprocess.run([sys.executable, "-m", module, str(path), os.environ.get("CC", "cc")],
                             capture_output=True, text=True, env=env, timeout=1800)
    if res.returncode != 0 or not path.exists():
        lines = res.stderr.strip().splitlines()
        raise RuntimeError(f"building {path.name} failed: {lines[-1] if lines else res.returncode}")


def load_kernels(module: str, library_path: Callable[[], Path], symbols: Sequence[str], cfuncs: Sequence[str],
                 make: Callable[..., Any], jit: Callable[[], list] | None = None) -> Any:
    """``make(kind, *functions, keep=...)`` over the ``void f(void *)`` entry points of the kernel module ``module``
    (``rmqdump.fast._x``): first from its shared library at ``library_path()`` (``symbols``; built once under
    :func:`build_lock` when missing), else numba's JIT cfuncs ``cfuncs`` of the module (no compiler, read-only cache,
    ``RMQDUMP_FAST_LIBRARY=0``, or ``make`` refusing the library); ``jit()``, when given, returns those entry points
    instead. ``keep``: the ctypes thunks to keep alive."""
    errors = []
    if os.environ.get("RMQDUMP_FAST_LIBRARY", "1") != "0":
        try:
            path = library_path()
            if not path.exists():
                with build_lock():
                    if not path.exists():  # another process may have built it meanwhile
                        build_kernel_library(module, path)
            lib = ctypes.CDLL(str(path))
            fns = []
            for name in symbols:
                fn = lib[name]
                fn.argtypes = [ctypes.c_void_p]
                fn.restype = None
                fns.append(fn)
            return make(f"shared library {path}", *fns)
        except Exception as e:  # no compiler, read-only cache: numba's JIT instead
            errors.append(f"{type(e).__name__}: {e}")
    if jit is not None:
        fns = jit()
    else:
        kernels = importlib.import_module(module)
        proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        fns = [proto(getattr(kernels, name).address) for name in cfuncs]
    return make("numba JIT" + (f" (library unavailable: {errors[0][:200]})" if errors else ""), *fns, keep=fns)


def build_library(path: Path) -> None:
    """Build the walk/verify kernels' shared library at ``path``."""
    build_kernel_library("rmqdump.fast._kernels", path)


_SYMBOLS = ("rmqdump_walk", "rmqdump_crc32", "rmqdump_info", "rmqdump_vscan")


def _make_backend(kind: str, *fns, keep=None) -> Backend:
    b = Backend(kind, *fns)
    if keep is not None:
        b._keep = keep  # keep the ctypes thunks alive
    return b


def _import_fastkernels():
    """Import rmqdump.fast._kernels (numba). numba's first compilation imports its whole target
    registry, which imports SciPy only to probe BLAS (unused here): 0.5-1 s and tens of MB.
    Unless SciPy is already imported (or ``RMQDUMP_NUMBA_SCIPY=1``) it is hidden meanwhile;
    numba then treats BLAS as unavailable in this process."""
    hide = "scipy" not in sys.modules and os.environ.get("RMQDUMP_NUMBA_SCIPY") != "1"
    if hide:
        sys.modules["scipy"] = None  # type: ignore[assignment]  # `import scipy` -> ImportError
    try:
        from rmqdump.fast import _kernels as _fastkernels

        proto = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
        fns = [proto(f.address) for f in (_fastkernels.walk_c, _fastkernels.crc32_c, _fastkernels.info_c,
                                          _fastkernels.vscan_c)]
        return _fastkernels, fns
    finally:
        if hide and sys.modules.get("scipy", 0) is None:
            del sys.modules["scipy"]


def backend() -> Backend:
    """Load the kernels once per process.

    First choice: the shared library in :func:`cache_dir` (no numba import: fast start, small
    RSS); when it is missing it is built once with numba and the C compiler (``cc`` or
    ``$CC``). Without a C compiler (or with ``RMQDUMP_FAST_LIBRARY=0``) numba's JIT-compiled
    cfuncs (numba's own cache) are used instead.
    """
    global _backend
    if _backend is not None:
        return _backend
    with _backend_lock:
        if _backend is not None:
            return _backend
        _numpy()
        _backend = load_kernels("rmqdump.fast._kernels", library_path, _SYMBOLS, (), _make_backend,
                                jit=lambda: _import_fastkernels()[1])
        return _backend


def fast_available() -> bool:
    """Whether the compiled path can run here (numba and numpy installed, little-endian host,
    not disabled with ``RMQDUMP_FAST=0``)."""
    if os.environ.get("RMQDUMP_FAST", "") == "0" or sys.byteorder != "little":
        return False
    if _backend is not None:
        return True
    return importlib.util.find_spec("numba") is not None and importlib.util.find_spec("numpy") is not None


def use_fast(nbytes: int, threshold: int | None = None, *, segments=()) -> bool:
    """Whether a job walking ``nbytes`` should take the compiled path (``RMQDUMP_FAST=1`` forces
    it, ``=0`` forbids it; otherwise jobs of at least ``threshold`` bytes use it when available).
    ``segments``: the files the job walks; a DLedger data file (entries wrapping records) is walked by the
    pure path only, whatever the flag says (the compiled walk knows no entry headers)."""
    if segments:
        from rmqdump.store.dledger.files import is_dledger_segment

        if any(is_dledger_segment(s) for s in segments):
            return False
    flag = os.environ.get("RMQDUMP_FAST", "")
    if flag == "0":
        return False
    if flag == "1":
        return fast_available()
    return nbytes >= (FAST_THRESHOLD if threshold is None else threshold) and fast_available()


def kernels() -> Backend:
    """Alias of :func:`backend` (load the kernels now, e.g. before starting threads)."""
    return backend()


def crc_mode() -> int:
    """The CRC implementation walks use here (``CRC_CLMUL`` or ``CRC_TABLE``; ``RMQDUMP_CRC=table``
    forces the table)."""
    if os.environ.get("RMQDUMP_CRC", "").lower() == "table":
        return CRC_TABLE
    return CRC_CLMUL if backend().clmul else CRC_TABLE


def crc32(data, mode: int | None = None) -> int:
    """``zlib.crc32(data)`` through the compiled CRC (``mode``: CRC_CLMUL, CRC_TABLE, None = best)."""
    b = backend()
    arr = _as_array(data)
    block = (ctypes.c_int64 * 4)(arr.ctypes.data if arr.size else 0, arr.size, -1 if mode is None else mode, 0)
    if mode == CRC_CLMUL and not b.clmul:
        raise ValueError("this build has no PCLMULQDQ CRC")
    b.crc32(ctypes.addressof(block))
    return block[3] & 0xFFFFFFFF


def _as_array(data) -> np.ndarray:
    """A read-only uint8 numpy view of a buffer (no copy)."""
    np = _numpy()
    arr = data if isinstance(data, np.ndarray) else np.frombuffer(data, dtype=np.uint8)
    if arr.dtype != np.uint8 or arr.ndim != 1:
        arr = arr.reshape(-1).view(np.uint8)
    if arr.flags.writeable:
        arr = arr.view()
        arr.flags.writeable = False
    return arr
