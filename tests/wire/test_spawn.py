"""spawn_until_ready (sglang_ssd/wire/spawn.py), with stand-in processes: no model loads."""

from __future__ import annotations

import sys
import time

import pytest

from sglang_ssd.wire.spawn import SpawnError, spawn_until_ready, stop_process


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_ready_line_gives_the_endpoint_and_later_output_is_drained(tmp_path):
    code = "import sys, time\nprint('READY tcp://127.0.0.1:5999', flush=True)\nsys.stdout.write('x' * 200000)\ntime.sleep(30)"
    proc, endpoint = spawn_until_ready(python(code), tmp_path / "log", timeout_s=30)
    try:
        assert endpoint == "tcp://127.0.0.1:5999" and proc.poll() is None
    finally:
        assert stop_process(proc, timeout=5) is not None


def test_exit_before_ready_reports_the_log(tmp_path):
    with pytest.raises(SpawnError, match=r"exited with code 3:\n.*boom"):
        spawn_until_ready(python("import sys; sys.stderr.write('boom'); sys.exit(3)"), tmp_path / "log", timeout_s=30)


def test_a_silent_process_hits_the_deadline_and_is_stopped(tmp_path):
    start = time.monotonic()
    with pytest.raises(SpawnError, match="not ready after 1 s"):
        spawn_until_ready(python("import time; time.sleep(60)"), tmp_path / "log", timeout_s=1)
    assert time.monotonic() - start < 20
