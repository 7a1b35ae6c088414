"""A wheel of the project carries every C/C++ source of ``sglang_ssd/cpu/csrc``: an installed package
builds its kernels and compiled entry from them on first use (``cpu/clib.py``), so a missing one (the
entry's ``entry.cpp``, a header) would only show on a machine that installed the wheel.

The wheel is built from a copy of what the build reads (``pyproject.toml``, ``README.md``,
``sglang_ssd/``) with this interpreter's setuptools and no network (``--no-build-isolation
--no-index``), so the checkout gets no ``build/`` or ``*.egg-info``. Skipped where pip or setuptools
is not importable.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CSRC = ROOT / "sglang_ssd" / "cpu" / "csrc"


@pytest.mark.skipif(
    importlib.util.find_spec("pip") is None or importlib.util.find_spec("setuptools") is None,
    reason="pip wheel needs pip and setuptools in this interpreter (no build isolation offline)",
)
def test_the_wheel_carries_every_c_source(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "sglang_ssd", src / "sglang_ssd", ignore=shutil.ignore_patterns("_build", "__pycache__"))
    out = tmp_path / "wheel"
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "--no-build-isolation", "--no-index", "-q",
         "-w", str(out)],
        cwd=src, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    wheels = list(out.glob("sglang_ssd-*.whl"))
    assert len(wheels) == 1, wheels
    names = set(zipfile.ZipFile(wheels[0]).namelist())
    sources = sorted(p.relative_to(ROOT).as_posix() for p in CSRC.iterdir() if p.is_file())
    assert {"sglang_ssd/cpu/csrc/linear.c", "sglang_ssd/cpu/csrc/entry.cpp"} <= set(sources)
    missing = [s for s in sources if s not in names]
    assert not missing, f"the wheel lacks {missing}: add their pattern to pyproject.toml's package data"
