"""Start and stop the draft server process(es) that an SSD launch needs."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile

from sglang_ssd.target.ssd_config import SSDConfig
from sglang_ssd.wire.spawn import SpawnError, spawn_until_ready, stop_process

# spawn_draft_server and stop_process are also how tests/e2e starts and stops its own draft servers.
__all__ = ["DraftFleet", "SpawnError", "draft_server_command", "spawn_draft_server", "stop_process"]

READY_TIMEOUT_S = 600.0


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
    return spawn_until_ready(command, log_path, timeout_s=READY_TIMEOUT_S, cores=cores, env=env)[0]


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
