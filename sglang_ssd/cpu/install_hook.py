"""Install the interpreter-start hook (`sglang_ssd_cpu.pth`) into the current environment.

    python -m sglang_ssd.cpu.install_hook           # install (idempotent)
    python -m sglang_ssd.cpu.install_hook --remove  # uninstall

The hook only acts when `SGLANG_USE_CPU_ENGINE=1` (see `sglang_ssd/cpu/autoload.py`).
"""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path

PTH_NAME = "sglang_ssd_cpu.pth"
PTH_LINE = "import sglang_ssd.cpu.autoload\n"


def pth_path() -> Path:
    return Path(sysconfig.get_paths()["purelib"]) / PTH_NAME


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    path = pth_path()
    if "--remove" in argv:
        path.unlink(missing_ok=True)
        print(f"removed {path}")
        return 0
    if not path.is_file() or path.read_text() != PTH_LINE:
        path.write_text(PTH_LINE)
    print(f"CPU serving hook: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
