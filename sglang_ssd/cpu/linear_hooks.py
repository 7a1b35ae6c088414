"""Route SGLang's CPU linears and logits head through ``sglang_ssd.cpu.linear``.

Installed through SGLang's hook registry as AROUND hooks (like the TARGET_VERIFY attention hook):
- ``UnquantizedLinearMethod.apply``: every unquantized ``nn.Linear`` of the target (QKV, O, gate/up,
  down), which SGLang otherwise runs with ``F.linear``;
- ``LogitsProcessor._compute_lm_head``: the logits head, which SGLang runs with ``torch.matmul``.
Anything the kernel does not take (CUDA tensors, AMX-packed weights, LoRA or quantized heads, bf16)
goes to SGLang's own code untouched. ``SGLANG_SSD_CPU_LINEAR=torch`` turns the route off. The
route is decided, and printed to the process's stderr, at the first call that reaches it.
"""

from __future__ import annotations

import torch

from sglang_ssd.cpu import clib
from sglang_ssd.cpu import linear as cpu_linear
from sglang_ssd.hooks import register_once

LINEAR_TARGET = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply"
HEAD_TARGET = "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head"


def linear_apply_hook(original, method, layer, x, bias=None, **kwargs):
    if not x.is_cpu or getattr(layer, "use_intel_amx_backend", False):
        return original(method, layer, x, bias, **kwargs)
    return cpu_linear.linear(x, layer.weight, bias)


# The head's quant methods that are a plain weight matrix (tied embeddings carry one).
PLAIN_HEAD_METHODS = (None, "UnquantizedEmbeddingMethod", "UnquantizedLinearMethod")


def lm_head_hook(original, processor, hidden_states, lm_head, embedding_bias=None, **kwargs):
    weight = getattr(lm_head, "weight", None)
    method = getattr(lm_head, "quant_method", None)
    plain = (
        weight is not None
        and weight.dtype == torch.float32  # fp32 logits as SGLang's own fp32 path gives them
        and hidden_states.is_cpu
        and embedding_bias is None
        and not getattr(lm_head, "use_intel_amx_backend", False)  # AMX-packed weights are not [V, H]
        and not hasattr(lm_head, "set_lora")
        and getattr(processor, "rl_on_policy_target", None) is None
        and (method is None or type(method).__name__ in PLAIN_HEAD_METHODS)
    )
    if not plain:
        return original(processor, hidden_states, lm_head, embedding_bias, **kwargs)
    return cpu_linear.linear(hidden_states.to(weight.dtype), weight)


def register() -> None:
    clib.setting()  # a bad SGLANG_SSD_CPU_LINEAR fails here, at start-up, not at the first forward
    register_once(LINEAR_TARGET, linear_apply_hook)
    register_once(HEAD_TARGET, lm_head_hook)
