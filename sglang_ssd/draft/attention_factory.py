"""Which attention backend the draft runner uses: ``make_attention`` picks the torch reference
(``attention.py``), the C kernel (``attention_c.py``), FlashInfer (``attention_flashinfer.py``) or Triton
(``attention_triton.py``) from the requested kind and the device. The backends are imported on demand:
FlashInfer and Triton are optional, and the C route builds its kernels on first use.
"""

from __future__ import annotations

import torch

from .attention import TorchAttention
from .kv_pool import KVPool
from .model_config import ModelConfig


def make_attention(kind: str, cfg: ModelConfig, pool: KVPool, device: torch.device):
    """"torch", "c", "flashinfer", "triton", or "auto" (on CUDA FlashInfer when it imports, else Triton,
    else torch; on a CPU the C kernel for an fp32 pool on the kernel route, else torch)."""
    if kind not in ("auto", "torch", "c", "flashinfer", "triton"):
        raise ValueError(f"attention must be auto, torch, c, flashinfer or triton, got {kind!r}")
    if kind in ("c", "auto") and device.type != "cuda":
        from .attention_c import CAttention, c_attention_kernel

        fn = c_attention_kernel(cfg, pool, device)
        if fn is not None:
            return CAttention(cfg, pool, device, fn)
        if kind == "c":
            raise ValueError("attention='c' needs a CPU fp32 pool and the C kernel route (SGLANG_SSD_CPU_LINEAR)")
    if kind == "torch" or (kind == "auto" and device.type != "cuda"):
        return TorchAttention(cfg, pool, device)
    if kind == "triton":  # also on a CPU under TRITON_INTERPRET=1 (how the tests check it)
        from .attention_triton import TritonAttention

        return TritonAttention(cfg, pool, device)
    if device.type != "cuda":
        raise ValueError("attention='flashinfer' needs a cuda device")
    try:
        from .attention_flashinfer import FlashInferAttention
    except ImportError:
        if kind == "flashinfer":
            raise
        try:
            from .attention_triton import TritonAttention
        except ImportError:
            return TorchAttention(cfg, pool, device)
        return TritonAttention(cfg, pool, device)
    return FlashInferAttention(cfg, pool, device)
