"""The CPU malloc policy (sglang_ssd/cpu/allocator.py): applied once per process, switchable, checked.

Each case runs in a fresh interpreter: the policy is process-wide and applied at most once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import ctypes
from sglang_ssd.cpu.allocator import keep_freed_memory

calls, real = [], ctypes.CDLL


class Spy:  # the C library, with its mallopt calls recorded
    def __init__(self, *args, **kwargs):
        lib = real(*args, **kwargs)

        def mallopt(param, value):
            calls.append((param, value))
            return lib.mallopt(param, value)

        self.mallopt = mallopt


ctypes.CDLL = Spy
first, second = keep_freed_memory(), keep_freed_memory()
print(first, second, sorted(calls))
"""


def _probe(setting: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "SGLANG_SSD_CPU_MALLOC"}
    if setting is not None:
        env["SGLANG_SSD_CPU_MALLOC"] = setting
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_the_default_keeps_freed_memory_once_per_process():
    run = _probe(None)
    assert run.returncode == 0, run.stderr
    # M_TRIM_THRESHOLD (-1) off in practice, M_MMAP_THRESHOLD (-3) at glibc's 32 MB ceiling; set once.
    assert run.stdout.split() == ["True", "True", "[(-3,", "33554432),", "(-1,", "1073741824)]"], run.stdout
    assert run.stderr.count("CPU malloc keeps freed memory") == 1


def test_default_leaves_glibc_alone():
    run = _probe("default")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False", "[]"], run.stdout
    assert "CPU malloc" not in run.stderr


def test_a_bad_setting_is_one_clear_error():
    run = _probe("tcmalloc")
    assert run.returncode != 0
    assert "SGLANG_SSD_CPU_MALLOC='tcmalloc': expected keep or default" in run.stderr
