"""Start and stop the draft server process(es) that an SSD launch needs."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time

from sglang_ssd.sglang.config import SSDConfig

READY_TIMEOUT_S = 600.0


class DraftFleetError(RuntimeError):
    pass


def draft_server_command(config: SSDConfig, endpoint: str) -> list[str]:
    """The draft server's argv: where and what to load as flags, the draft settings as one JSON argument."""
    model = config.draft_chain[1] if config.draft_chain else config.draft_model_path
    l0 = ["--l0", config.draft_chain[0]] if config.draft_chain else []
    return [
        sys.executable, "-m", "sglang_ssd.draft_server",
        "--model", str(model), "--bind", endpoint, "--device", config.draft_device, "--threads", "1", *l0,
        "--settings", config.draft_settings().to_json(),
    ]  # fmt: skip


def spawn_draft_server(
    command: list[str], log_path: str, cores: set[int] | None = None, env: dict | None = None
) -> subprocess.Popen:
    """Start a draft server and wait for its `READY` line; its stderr goes to `log_path`."""
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=open(log_path, "w"),
        env={**(env or os.environ), "OMP_NUM_THREADS": "1"},
        text=True,
        preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("READY"):
            # Keep draining stdout so the server never blocks on a full pipe.
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc
        if not line and proc.poll() is not None:
            with open(log_path) as f:
                tail = f.read()[-2000:]
            raise DraftFleetError(f"draft server exited with code {proc.returncode}:\n{tail}")
    proc.kill()
    raise DraftFleetError(f"draft server not ready after {READY_TIMEOUT_S:.0f} s (log: {log_path})")


def stop_process(proc: subprocess.Popen, timeout: float = 20.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout)


class DraftFleet:
    """Owns the draft servers started for one SGLang launch (none if endpoints were given)."""

    def __init__(self, config: SSDConfig):
        self.config = config
        self.procs: list[subprocess.Popen] = []

    def start(self, env: dict[str, str]) -> SSDConfig:
        """Start one draft server unless endpoints were given; returns the config with endpoints set."""
        if self.config.draft_endpoints:
            return self.config
        tmp = tempfile.gettempdir()
        endpoint = f"ipc://{tmp}/sglang-ssd-draft-{os.getpid()}.sock"
        log_path = f"{tmp}/sglang-ssd-draft-{os.getpid()}.log"
        cores = set(self.config.draft_cores) or None
        self.procs.append(spawn_draft_server(draft_server_command(self.config, endpoint), log_path, cores, env))
        return dataclasses.replace(self.config, draft_endpoints=[endpoint])

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc)
        self.procs.clear()
