"""Tree attention as one Triton kernel per forward: for GPUs without FlashInfer.

Computes what ``attention.py``'s torch path computes — every new token of every span attends over its
request's extent slots ``[0, kv_len)`` where its boolean mask row allows — in one launch over all spans
(prompt chunks, glue chains, branch steps): a program per (query row, head), an online softmax over key
blocks, grouped-query heads mapped to their KV head. Masks (causal where a span has none) travel
flattened row-major as bytes. Checked against the torch path on a CPU under ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .attention import causal_tail_mask
from .kv_pool import KVPool
from .model_config import ModelConfig

NEG = tl.constexpr(-1.0e30)  # a compiled kernel reads only constexpr globals


@triton.jit
def _tree_attention_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, start_ptr, kvlen_ptr, moff_ptr, mask_ptr,
    stride_qr, stride_qh, stride_ks, stride_kh, stride_or, stride_oh, scale,
    GROUP: tl.constexpr, D: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    kvh = h // GROUP
    start = tl.load(start_ptr + r).to(tl.int64)
    kv_len = tl.load(kvlen_ptr + r)
    moff = tl.load(moff_ptr + r).to(tl.int64)
    d = tl.arange(0, D)
    q = tl.load(q_ptr + r * stride_qr + h * stride_qh + d).to(tl.float32)
    m_i = tl.full((), NEG, tl.float32)
    l_i = tl.zeros((), tl.float32)
    acc = tl.zeros((D,), tl.float32)
    for j in range(0, kv_len, BLOCK_N):
        offs = j + tl.arange(0, BLOCK_N)
        valid = offs < kv_len
        allowed = (tl.load(mask_ptr + moff + offs, mask=valid, other=0) != 0) & valid
        slots = (start + offs).to(tl.int64)
        kb = tl.load(k_ptr + slots[:, None] * stride_ks + kvh * stride_kh + d[None, :], mask=valid[:, None], other=0.0)
        vb = tl.load(v_ptr + slots[:, None] * stride_ks + kvh * stride_kh + d[None, :], mask=valid[:, None], other=0.0)
        s = tl.sum(kb.to(tl.float32) * q[None, :], axis=1) * scale
        s = tl.where(allowed, s, NEG)
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        p = tl.where(allowed, tl.exp(s - m_new), 0.0)
        alpha = tl.exp(m_i - m_new)
        acc = acc * alpha + tl.sum(p[:, None] * vb.to(tl.float32), axis=0)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        m_i = m_new
    out = acc / tl.maximum(l_i, 1e-30)
    tl.store(o_ptr + r * stride_or + h * stride_oh + d, out.to(o_ptr.dtype.element_ty))


@dataclass
class _TritonPlan:
    start: torch.Tensor  # int64 [N]: pool slot of each query row's extent
    kv_len: torch.Tensor  # int32 [N]
    mask_off: torch.Tensor  # int64 [N]: offset of the row's mask in ``mask``
    mask: torch.Tensor  # uint8, every span's [n, kv_len] mask row-major, concatenated


class TritonAttention:
    def __init__(self, cfg: ModelConfig, pool: KVPool, device: torch.device, block_n: int = 64) -> None:
        if cfg.head_dim & (cfg.head_dim - 1):
            raise ValueError(f"the Triton tree attention needs a power-of-two head_dim, got {cfg.head_dim}")
        self.cfg, self.pool, self.device, self.block_n = cfg, pool, device, block_n

    def plan(self, spans) -> _TritonPlan:
        starts, lens, offs, masks, off = [], [], [], [], 0
        for s in spans:
            m = s.mask if s.mask is not None else causal_tail_mask(s.n, s.kv_len, self.device)
            if tuple(m.shape) != (s.n, s.kv_len):
                raise ValueError(f"span mask must be [{s.n}, {s.kv_len}], got {tuple(m.shape)}")
            masks.append(m.to(self.device, torch.uint8).reshape(-1))
            starts += [s.start] * s.n
            lens += [s.kv_len] * s.n
            offs += [off + i * s.kv_len for i in range(s.n)]
            off += s.n * s.kv_len
        dev = self.device
        return _TritonPlan(
            torch.tensor(starts, dtype=torch.int64, device=dev),
            torch.tensor(lens, dtype=torch.int32, device=dev),
            torch.tensor(offs, dtype=torch.int64, device=dev),
            torch.cat(masks) if masks else torch.zeros(1, dtype=torch.uint8, device=dev),
        )

    def run(self, plan: _TritonPlan, layer: int, q: torch.Tensor, scale: float) -> torch.Tensor:
        """q ``[N, Hq, D]`` ⇒ attention output ``[N, Hq, D]``."""
        q = q.contiguous()
        out = torch.empty_like(q)
        k, v = self.pool.k[layer], self.pool.v[layer]  # [slots, Hkv, D]
        rows, hq, d = q.shape
        if rows == 0:
            return out
        _tree_attention_kernel[(rows, hq)](
            q, k, v, out, plan.start, plan.kv_len, plan.mask_off, plan.mask,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), out.stride(0), out.stride(1), scale,
            GROUP=hq // self.cfg.num_kv_heads, D=d, BLOCK_N=self.block_n,
        )  # fmt: skip
        return out
