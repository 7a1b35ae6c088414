"""Start a draft server process and wait until it serves.

`python -m sglang_ssd.draft_server` prints one line `READY <endpoint>` on stdout once it serves and
nothing else there (its log goes to stderr). The launcher (target/draft_fleet.py), the tests and the
benchmarks all start it through `spawn_until_ready`, which reads that line; `DraftServerProcess` is the
same with the usual command line and a context manager. Standard library only.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

READY = "READY"  # the draft server's first stdout line: "READY <endpoint>"


class SpawnError(RuntimeError):
    """The process exited, or stayed silent, before its READY line."""


def _log_tail(log_path: str | Path, chars: int = 4000) -> str:
    try:
        return Path(log_path).read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _drain(stream) -> None:
    # Keep reading stdout so the server never blocks on a full pipe; ends at EOF or when closed.
    try:
        for _ in stream:
            pass
    except (OSError, ValueError):
        pass


def spawn_until_ready(command: list[str], log_path: str | Path, *, timeout_s: float, cores: set[int] | None = None,
                      env: dict | None = None) -> tuple[subprocess.Popen, str]:  # fmt: skip
    """Run `command` (stderr → `log_path`, pinned to `cores` if given) and wait for its READY line.

    Returns the process and the endpoint it reported (for `tcp://host:*` the port it bound). On an exit
    or a timeout the process is gone and `SpawnError` carries the end of its log."""
    env = {**(env or os.environ), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    with open(log_path, "w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, env=env, text=True,
                                preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None)  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        # select, not a bare readline: a server that hangs silently must still hit the deadline.
        if select.select([proc.stdout], [], [], 0.2)[0]:
            line = proc.stdout.readline()
            if line.startswith(READY + " "):
                threading.Thread(target=_drain, args=(proc.stdout,), daemon=True).start()
                return proc, line.split()[1]
            if line:
                continue
        if proc.poll() is not None:
            raise SpawnError(f"draft server exited with code {proc.returncode}:\n{_log_tail(log_path)}")
    stop_process(proc)
    raise SpawnError(f"draft server not ready after {timeout_s:.0f} s (log: {log_path}):\n{_log_tail(log_path)}")


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> int | None:
    """SIGTERM, then SIGKILL if it has not exited after `timeout` seconds; returns the exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)
    return proc.returncode


def ipc_endpoint() -> str:
    """A fresh ipc:// endpoint under /tmp (ipc paths must stay short: sun_path is ~107 bytes)."""
    return f"ipc:///tmp/ssd-{uuid.uuid4().hex[:10]}.sock"


class DraftServerProcess:
    """``python -m sglang_ssd.draft_server --model MODEL --bind BIND *args``, started and READY;
    a context manager that stops it and removes its log."""

    def __init__(self, model: str | Path, bind: str, *args: str, ready_timeout_s: float = 60.0) -> None:
        fd, self.log_path = tempfile.mkstemp(prefix="draft-server-", suffix=".log")
        os.close(fd)
        cmd = [sys.executable, "-m", "sglang_ssd.draft_server", "--model", str(model), "--bind", bind, *args]
        try:
            self.proc, self.endpoint = spawn_until_ready(cmd, self.log_path, timeout_s=ready_timeout_s)
        except SpawnError:
            Path(self.log_path).unlink(missing_ok=True)
            raise

    def stderr(self) -> str:
        return _log_tail(self.log_path)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        code = stop_process(self.proc, timeout=10.0)
        self.proc.stdout.close()
        return code

    def __enter__(self) -> DraftServerProcess:
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.stop()
        if exc_type is not None:  # the server's side of a failure: its log, before it is removed
            print(f"--- draft server log ({self.log_path}) ---\n{self.stderr()}", file=sys.stderr)
        Path(self.log_path).unlink(missing_ok=True)
