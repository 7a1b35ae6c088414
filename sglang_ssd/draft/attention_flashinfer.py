"""Tree attention on CUDA with FlashInfer: one paged prefill kernel with a custom mask per forward.

A request's extent is a run of consecutive pages of the pool (``KVPool`` hands out page-aligned
extents), so its page list is ``range(start / page, ceil((start + kv_len) / page))``. All spans of a
forward — prompt chunks, glue chains, branch steps — go in one ``BatchPrefillWithPagedKVCacheWrapper``
plan with their masks flattened (row-major ``[n, kv_len]`` per span, concatenated). Imported lazily and
only on CUDA; the torch path (``attention.py``) is the reference it is checked against.
"""

from __future__ import annotations

import torch

from .attention import causal_tail_mask
from .kv_pool import KVPool
from .model_config import ModelConfig

WORKSPACE_BYTES = 256 << 20


class FlashInferAttention:
    def __init__(self, cfg: ModelConfig, pool: KVPool, device: torch.device) -> None:
        import flashinfer  # CUDA-only; imported when the FlashInfer path is chosen

        self.cfg, self.pool, self.device = cfg, pool, device
        self.workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)
        self.wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(self.workspace, kv_layout="NHD")

    def plan(self, spans) -> None:
        ps = self.pool.page_size
        qo, kv_indptr, indices, last, masks = [0], [0], [], [], []
        for s in spans:
            if s.start % ps:
                raise ValueError("extent start must be page aligned for the paged kernel")
            first = s.start // ps
            pages = -(-s.kv_len // ps)
            indices.extend(range(first, first + pages))
            kv_indptr.append(kv_indptr[-1] + pages)
            last.append(s.kv_len - (pages - 1) * ps)
            qo.append(qo[-1] + s.n)
            m = s.mask if s.mask is not None else causal_tail_mask(s.n, s.kv_len, self.device)
            masks.append(m.to(self.device, torch.bool).reshape(-1))

        def i32(x):
            return torch.tensor(x, dtype=torch.int32, device=self.device)

        self.wrapper.plan(
            i32(qo),
            i32(kv_indptr),
            i32(indices),
            i32(last),
            self.cfg.num_heads,
            self.cfg.num_kv_heads,
            self.cfg.head_dim,
            ps,
            custom_mask=torch.cat(masks),
            q_data_type=self.pool.k.dtype,
            kv_data_type=self.pool.k.dtype,
            sm_scale=self.cfg.head_dim**-0.5,
        )

    def run(self, plan, layer: int, q: torch.Tensor, scale: float) -> torch.Tensor:
        ps = self.pool.page_size
        shape = (-1, ps, self.cfg.num_kv_heads, self.cfg.head_dim)
        k = self.pool.k[layer].view(shape)
        v = self.pool.v[layer].view(shape)
        return self.wrapper.run(q.contiguous(), (k, v))
