"""The model folders the tests read, and what a missing one means.

`make test` builds them first and sets SSD_REQUIRE_MODELS=1: there a missing folder is a failure (a
skip would hide a broken build or a moved path). Elsewhere (`make test-fast`, a bare pytest run
before `make models`) it is a skip that says how to build it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TARGET = ROOT / "models" / "target"
DRAFT = ROOT / "models" / "draft"


def require_model(path: Path, file: str = "config.json") -> Path:
    """``path`` if ``path/file`` exists; else fail under `make test`, skip otherwise."""
    if (path / file).is_file():
        return path
    msg = f"{path / file} is missing: run `make models` (make test builds it)"
    if os.environ.get("SSD_REQUIRE_MODELS") == "1":
        pytest.fail(msg)
    pytest.skip(msg)
