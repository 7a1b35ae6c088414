"""SGLang plugin entry point (`sglang.srt.plugins`): runs in every SGLang process."""

from __future__ import annotations

import os


def register_ssd() -> None:
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.speculative.spec_registry import get_spec

    from sglang_ssd.target import metrics, serving_guards
    from sglang_ssd.target.spec_algo import SSDSpecAlgo, validate_server_args, worker_factory

    if get_spec("SSD") is None:
        SpeculativeAlgorithm.register(
            "SSD", supports_overlap=False, validate_server_args=validate_server_args, spec_class=SSDSpecAlgo
        )(worker_factory)
    metrics.register_hooks()
    serving_guards.register()


def load() -> None:
    """Called by `sglang.srt.plugins.load_plugins()` in each SGLang process."""
    if os.environ.get("SGLANG_USE_CPU_ENGINE") == "1":
        from sglang_ssd.cpu import install_cpu_support

        install_cpu_support()
    register_ssd()
