"""The kernel A/B tools still build and run: bench/kernel_ab.sh links three copies of linear.c into one
binary (every new global symbol needs a per-copy name there), and the call-overhead timer runs."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_kernel_ab_links_three_variants_and_finds_them_bit_identical():
    out = subprocess.run(["bash", str(ROOT / "bench" / "kernel_ab.sh"), "", "-DNO_NEXT", "-DLEAD=2", "1", "2"],
                         capture_output=True, text=True, timeout=600, check=True).stdout  # fmt: skip
    rows = re.findall(r"^ M=(\d+) .* (same|DIFF)$", out, flags=re.M)
    assert len(rows) == 5 * 2, out  # 5 target shapes x M = 1, 2
    assert all(verdict == "same" for _, verdict in rows), out


def test_call_overhead_times_each_case_and_a_second_checkout():
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "linear_call_overhead.py"), "--calls", "200",
                          "--repeats", "1", "--code-b", str(ROOT)],
                         capture_output=True, text=True, timeout=300, check=True).stdout  # fmt: skip
    lines = re.findall(r"^(.+?)\s+(\d+\.\d+) us per call", out, flags=re.M)
    names = [name.strip() for name, _ in lines]
    assert names == ["cpu.linear.linear", "bare ctypes call", "torch F.linear", f"linear of {ROOT}"], out
    assert all(float(t) > 0 for _, t in lines)
