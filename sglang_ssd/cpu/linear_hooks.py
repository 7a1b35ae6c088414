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

from sglang_ssd.cpu import linear as cpu_linear

LINEAR_TARGET = "sglang.srt.layers.quantization.unquant.UnquantizedLinearMethod.apply"
HEAD_TARGET = "sglang.srt.layers.logits_processor.LogitsProcessor._compute_lm_head"


def linear_apply_hook(original, method, layer, x, bias=None, **kwargs):
    if x.is_cuda or getattr(layer, "use_intel_amx_backend", False):
        return original(method, layer, x, bias, **kwargs)
    return cpu_linear.linear(x, layer.weight, bias)


_rules: dict = {}


def _head_is_quantized(lm_head, quant_method) -> bool:
    """SGLang's own rule (it knows which quant methods are plain heads, e.g. tied embeddings), looked
    up at the first call rather than at plugin load, when SGLang's layers may be half-imported."""
    rule = _rules.get("head")
    if rule is None:
        try:
            from sglang.srt.layers.logits_processor import should_apply_lm_head_quant_method as rule
        except ImportError:  # outside a server (unit tests): any quant method means SGLang's path
            rule = lambda head, method: method is not None  # noqa: E731
        _rules["head"] = rule
    return rule(lm_head, quant_method)


def lm_head_hook(original, processor, hidden_states, lm_head, embedding_bias=None, **kwargs):
    weight = getattr(lm_head, "weight", None)
    plain = (
        weight is not None
        and not hidden_states.is_cuda
        and embedding_bias is None
        and getattr(processor, "rl_on_policy_target", None) is None
        and not hasattr(lm_head, "set_lora")
        and not _head_is_quantized(lm_head, getattr(lm_head, "quant_method", None))
    )
    if not plain:
        return original(processor, hidden_states, lm_head, embedding_bias, **kwargs)
    return cpu_linear.linear(hidden_states.to(weight.dtype), weight)


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target, hook in ((LINEAR_TARGET, linear_apply_hook), (HEAD_TARGET, lm_head_hook)):
        if not any(h is hook for _, h, _ in HookRegistry._hooks.get(target, [])):
            HookRegistry.register(target, hook, HookType.AROUND)
