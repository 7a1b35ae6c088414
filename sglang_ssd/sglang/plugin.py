"""SGLang plugin entry point (`sglang.srt.plugins`): runs in every SGLang process."""

from __future__ import annotations

import logging
import os

logger = logging.getLogger(__name__)


def load() -> None:
    """Called by `sglang.srt.plugins.load_plugins()` in each SGLang process."""
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        from sglang_ssd.cpu import install_cpu_support

        install_cpu_support()
