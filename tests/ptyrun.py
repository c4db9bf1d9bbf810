"""Run a command with its output on a real pseudo-terminal of a given width (the terminal tests' one runner)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import tempfile
import termios
import time


def run_on_pty(argv: list[str], *, width: int = 200, timeout: float = 60.0, cwd=None,
               stderr_on_pty: bool = True) -> tuple[int | None, str, str]:
    """``argv`` with stdout (and stdin and stderr, with ``stderr_on_pty``) on a ``width``-column pty (window
    size and COLUMNS both say so, colour allowed): (exit code or None on timeout, what the terminal got,
    stderr when it went to a file instead)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, width, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(width), LINES="50")
    env.pop("NO_COLOR", None)
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(argv, cwd=cwd, stdin=slave if stderr_on_pty else subprocess.DEVNULL, stdout=slave,
                             stderr=slave if stderr_on_pty else err, env=env, close_fds=True,
                             start_new_session=True)
        os.close(slave)
        out = bytearray()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if not ready:
                if p.poll() is not None:
                    break  # exited, and nothing more was written
                continue
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        try:
            rc = p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            rc = None
        os.close(master)
        err.seek(0)
        stderr = err.read().decode("utf-8", "replace")
    return rc, out.decode("utf-8", "replace"), stderr
