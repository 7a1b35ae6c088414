"""Attention over the KV pool for a batch of spans: the torch reference path (CPU and any device).

Each span attends over its own extent slots ``[0, kv_len)`` (a strided view of the pool, no copy) with
its own boolean mask, through ``scaled_dot_product_attention`` (grouped-query heads handled natively).
The FlashInfer path (``attention_flashinfer.py``) computes the same thing with one paged kernel call,
the Triton path (``attention_triton.py``) with one Triton kernel, the C path (``attention_c.py``, the
CPU default) with one C call per layer. ``attention_factory.py`` picks one of them; the backends import
this module (the reference, the shared mask), never the factory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .kv_pool import KVPool
from .model_config import ModelConfig


def causal_tail_mask(n: int, kv_len: int, device) -> torch.Tensor:
    """bool ``[n, kv_len]``: new token i (written at slot kv_len − n + i) sees slots ``[0, kv_len − n + i]``."""
    rows = torch.arange(n, device=device).unsqueeze(1) + (kv_len - n)
    return torch.arange(kv_len, device=device).unsqueeze(0) <= rows


@dataclass
class _SpanPlan:
    row: int  # first row of the span in the batch
    n: int
    start: int
    kv_len: int
    mask: torch.Tensor | None  # bool [1, 1, n, kv_len] or None (attend to everything)


class TorchAttention:
    """Per-span SDPA; the reference every other backend is checked against."""

    def __init__(self, cfg: ModelConfig, pool: KVPool, device: torch.device) -> None:
        self.pool = pool
        self.device = device

    def plan(self, spans) -> list[_SpanPlan]:
        out, row = [], 0
        for s in spans:
            mask = s.mask
            if mask is None and s.n > 1:
                mask = causal_tail_mask(s.n, s.kv_len, self.device)
            if mask is not None:
                if tuple(mask.shape) != (s.n, s.kv_len):
                    raise ValueError(f"span mask must be [{s.n}, {s.kv_len}], got {tuple(mask.shape)}")
                mask = mask.to(self.device).view(1, 1, s.n, s.kv_len)
            out.append(_SpanPlan(row, s.n, s.start, s.kv_len, mask))
            row += s.n
        return out

    def run(self, plan: list[_SpanPlan], layer: int, q: torch.Tensor, scale: float) -> torch.Tensor:
        """q ``[N, Hq, D]`` ⇒ attention output ``[N, Hq, D]``."""
        out = torch.empty_like(q)
        kl, vl = self.pool.k[layer], self.pool.v[layer]
        for p in plan:
            qs = q[p.row : p.row + p.n].transpose(0, 1).unsqueeze(0)
            ks = kl[p.start : p.start + p.kv_len].transpose(0, 1).unsqueeze(0)
            vs = vl[p.start : p.start + p.kv_len].transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=p.mask, scale=scale, enable_gqa=True)
            out[p.row : p.row + p.n] = o[0].transpose(0, 1)
        return out

