"""Entry point: ``python -m sglang_ssd.draft_server --model PATH --bind ENDPOINT ...`` (see draft/cli.py)."""

from __future__ import annotations

import sys

from .draft.cli import main

if __name__ == "__main__":
    sys.exit(main())
