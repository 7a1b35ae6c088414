"""Interpreter-start hook for serving SGLang on a plain CPU.

`make install` puts a one-line `.pth` file into the environment's site-packages that imports this
module in every Python process, including the scheduler and detokenizer processes SGLang spawns. Those
processes import `sgl_kernel` at module level (before any SGLang plugin runs), so the kernel stand-ins
must be importable from the first instruction. The hook does nothing unless SGLang's CPU engine is
selected (`SGLANG_USE_CPU_ENGINE=1`), and it never raises: a broken hook must not break Python.
"""

import os

if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1" and os.environ.get("SGLANG_SSD_NO_STAND_INS") != "1":
    try:
        from sglang_ssd.cpu.stand_ins import install

        install()
    except Exception as exc:  # pragma: no cover - reported, never fatal
        import sys

        print(f"sglang_ssd: CPU stand-ins not installed: {exc}", file=sys.stderr)
