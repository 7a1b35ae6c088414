"""Start, query and stop a real SGLang server process (used by tests, the demo and benchmarks)."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

# Flags that make SGLang serve on a plain CPU (docs/CPU_ROUTE.md). Most are also the
# launcher's CPU defaults; spelled out here, they pin the configuration of every benchmark server,
# including `run_sweep --code-b` servers of older commits whose launcher lacked some of them.
CPU_SERVER_ARGS = (
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--disable-cuda-graph",
    "--max-total-tokens", "4096",
    "--skip-server-warmup",
    "--dtype", "float32",
    "--sleep-on-idle",  # idle schedulers otherwise spin a core each; several servers share 2 cores here
)  # fmt: skip


def free_port(low: int = 10000, high: int = 21999) -> int:
    """A free loopback port for a server to bind later, from below the kernel's ephemeral range (and
    below the 22000-29999 SGLang picks its own such ports from). A port from bind(0) is an ephemeral one,
    which the kernel may hand to any outgoing connection or bind(0) of the server's own startup before
    the server binds it: seen as "address already in use" on the HTTP port, in a sweep and in a test."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = min(high, int(f.read().split()[0]) - 1)
    except (OSError, ValueError, IndexError):
        pass
    for port in random.sample(range(low, high + 1), min(64, max(high - low + 1, 0))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # nothing free down there: an ephemeral port, as before
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerError(RuntimeError):
    pass


class SGLangServer:
    """One SGLang HTTP server in its own process group, on a free loopback port.

    `argv` are the launch arguments after the module name (model path, device, ...). The server is
    launched through `sglang_ssd.launch_server` so `--ssd-*` flags work; it passes plain SGLang
    arguments through unchanged.
    """

    def __init__(
        self,
        argv: list[str],
        *,
        log_path: Path | str | None = None,
        cpu_cores: set[int] | None = None,
        env: dict[str, str] | None = None,
        start_timeout: float = 600.0,
    ):
        self.port = free_port()
        self.argv = [*argv, "--host", "127.0.0.1", "--port", str(self.port)]
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/sglang_ssd_server_{self.port}.log")
        self.cpu_cores = cpu_cores
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.start_seconds: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> SGLangServer:
        cores = self.cpu_cores
        log = open(self.log_path, "w")
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sglang_ssd.launch_server", *self.argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            preexec_fn=(lambda: os.sched_setaffinity(0, cores)) if cores else None,
        )
        deadline = t0 + self.start_timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"server exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as r:
                    if r.status == 200:
                        self.start_seconds = time.perf_counter() - t0
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1.0)
        self.stop()
        raise ServerError(f"server not ready after {self.start_timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        keep = [ln for ln in text if "Ignore import error" not in ln]
        return "\n".join(keep[-lines:])

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait(timeout=10)

    def __enter__(self) -> SGLangServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- HTTP helpers -------------------------------------------------------------------------
    def post(self, path: str, payload: dict, timeout: float = 600.0) -> dict:
        req = urllib.request.Request(
            f"{self.url}{path}", data=json.dumps(payload).encode(), headers={"content-type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())

    def get(self, path: str, timeout: float = 60.0) -> dict:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=timeout) as r:
            return json.loads(r.read())

    def generate(self, input_ids: list[int] | list[list[int]], sampling_params: dict, **extra) -> dict | list:
        return self.post("/generate", {"input_ids": input_ids, "sampling_params": sampling_params, **extra})
