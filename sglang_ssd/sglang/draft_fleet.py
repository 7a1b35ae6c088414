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
AUTO_K_MAX = 7  # with --ssd-k auto the draft server drafts up to this many tokens


class DraftFleetError(RuntimeError):
    pass


class DraftFleet:
    """Owns the draft servers started for one SGLang launch (none if endpoints were given)."""

    def __init__(self, config: SSDConfig):
        self.config = config
        self.procs: list[subprocess.Popen] = []
        self.log_paths: list[str] = []

    def command(self, endpoint: str) -> list[str]:
        c = self.config
        k = AUTO_K_MAX if c.k == "auto" else c.k
        return [
            sys.executable, "-m", "sglang_ssd.draft_server",
            "--model", str(c.draft_model_path), "--bind", endpoint, "--device", c.draft_device,
            "--k", str(max(k, 1)), "--fanout", c.fanout, "--budget", str(c.budget),
            "--saguaro-c", str(c.saguaro_c), "--backup", c.backup, "--mode", c.mode, "--threads", "1",
        ]  # fmt: skip

    def start(self, env: dict[str, str]) -> SSDConfig:
        """Start one draft server unless endpoints were given; returns the config with endpoints set."""
        if self.config.draft_endpoints:
            return self.config
        endpoint = f"ipc://{tempfile.gettempdir()}/sglang-ssd-draft-{os.getpid()}.sock"
        cores = set(self.config.draft_cores)
        log_path = f"{tempfile.gettempdir()}/sglang-ssd-draft-{os.getpid()}.log"
        proc = subprocess.Popen(
            self.command(endpoint),
            stdout=subprocess.PIPE,
            stderr=open(log_path, "w"),
            env={**env, "OMP_NUM_THREADS": "1"},
            text=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        )
        self.procs.append(proc)
        self.log_paths.append(log_path)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                if proc.poll() is not None:
                    tail = open(log_path).read()[-2000:]
                    raise DraftFleetError(f"draft server exited with code {proc.returncode}:\n{tail}")
                continue
            if line.startswith("READY"):
                break
        else:
            self.stop()
            raise DraftFleetError(f"draft server not ready after {READY_TIMEOUT_S:.0f} s (log: {log_path})")
        # Keep draining stdout so the server never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
        return dataclasses.replace(self.config, draft_endpoints=[endpoint])

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.procs.clear()
