"""Start the draft server as a separate process through its CLI, as the SGLang worker's host would."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path


def ipc_endpoint() -> str:
    # ipc paths must stay short (sun_path is ~107 bytes).
    return f"ipc:///tmp/ssd-{uuid.uuid4().hex[:10]}.sock"


class ServerProc:
    """``python -m sglang_ssd.draft_server --model MODEL --bind BIND *args``; waits for ``READY``."""

    def __init__(self, model: str | Path, bind: str, *args: str, ready_timeout_s: float = 60.0) -> None:
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self.log = tempfile.NamedTemporaryFile("w+", prefix="draft-server-", suffix=".log", delete=False)
        cmd = [sys.executable, "-m", "sglang_ssd.draft_server", "--model", str(model), "--bind", bind, *args]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env)
        deadline = time.monotonic() + ready_timeout_s
        line = ""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.2)
            if ready:
                line = self.proc.stdout.readline()
                if line.startswith("READY ") or not line:
                    break
            if self.proc.poll() is not None:
                break
        if not line.startswith("READY "):
            self.stop()
            raise RuntimeError(f"draft server did not start: {line!r}\n{self.stderr()}")
        self.endpoint = line.split()[1]

    def stderr(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-4000:]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout:
            self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self) -> ServerProc:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        Path(self.log.name).unlink(missing_ok=True)
