"""Where a target forward's time goes, by part of the model and chain width: a diagnostic, off by default.

With ``SGLANG_SSD_MODULE_TIMERS=1`` in the server's environment the SSD worker wraps the ``forward`` of
the target's parts (each decoder layer, its norms, projections, rotary embedding, attention and MLP
pieces; the layer stack; the logits processor; the whole model) with a wall-clock timer, and sums the
seconds and calls per part and per chain width of the step (1: a plain step, K + 1: a verify; 0: a
prefill). ``/server_info`` then carries them as ``ssd_module_s`` and ``ssd_module_calls`` (keys
``part@width``); ``bench/forward_breakdown.py`` reads them and prints how a verify step's extra time
splits over the parts. Parts nest (a layer holds its attention), so their times do not add up.

Why a timer per part and not a sampling profiler: in the server, py-spy's attribution of time spent
in C calls was wrong by factors (its samples land on the wrong Python line), and perf sees the C
kernels but not which Python part called them. A wrapper costs about a microsecond a call, on both
sides of a comparison. Off, nothing is wrapped.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict

ENV = "SGLANG_SSD_MODULE_TIMERS"

# part -> attribute path under each decoder layer (Llama-style names; a model without one skips it)
LAYER_PARTS = {
    "layer": "",
    "norm_in": "input_layernorm",
    "self_attn": "self_attn",
    "qkv": "self_attn.qkv_proj",
    "rope": "self_attn.rotary_emb",
    "attention": "self_attn.attn",
    "o": "self_attn.o_proj",
    "norm_post": "post_attention_layernorm",
    "mlp": "mlp",
    "gate_up": "mlp.gate_up_proj",
    "act": "mlp.act_fn",
    "down": "mlp.down_proj",
}
# part -> attribute path under the model
MODEL_PARTS = {"model": "", "layers": "model", "logits": "logits_processor"}


def enabled() -> bool:
    return os.environ.get(ENV, "").strip() == "1"


def _attr(obj, path: str):
    for name in filter(None, path.split(".")):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


class ModuleTimers:
    """Wall-clock seconds and calls per ``part@width``; ``width`` is set by the worker per step."""

    def __init__(self, model) -> None:
        self.width = 0
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        wrapped: set[int] = set()  # a module shared by every layer (the rotary embedding) is wrapped once
        targets = [(part, _attr(model, path)) for part, path in MODEL_PARTS.items()]
        for layer in getattr(_attr(model, "model"), "layers", None) or []:
            targets += [(part, _attr(layer, path)) for part, path in LAYER_PARTS.items()]
        for part, module in targets:
            if module is not None and hasattr(module, "forward") and id(module) not in wrapped:
                wrapped.add(id(module))
                self._wrap(module, part)

    def _wrap(self, module, part: str) -> None:
        inner = module.forward

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                key = f"{part}@{self.width}"
                self.seconds[key] += time.perf_counter() - t0
                self.calls[key] += 1

        module.forward = timed  # the instance attribute shadows the class's forward

    def snapshot(self) -> dict:
        return {"ssd_module_s": dict(self.seconds), "ssd_module_calls": dict(self.calls)}
