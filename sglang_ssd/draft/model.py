"""The draft's compact model runner: a Llama-family decoder over a flat KV pool.

One :meth:`DraftModel.forward` runs any mix of token groups (:class:`Span` s) from different requests —
a prompt chunk, a glue chain, all the branches of a tree step, a backup decode token — as ONE batch:
the dense parts (projections, MLP) see all N tokens at once, attention sees each span's own keys
(its extent's slots ``[0, kv_len)``) under its own mask. Positions are explicit per token, so a branch
token gets the RoPE position of its place in its own context, not of its place in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from sglang_ssd.cpu.linear import linear

from .attention_factory import make_attention
from .kv_pool import KVPool
from .model_config import ModelConfig
from .rope import Rope
from .weights import ModelWeights, compact_linears, load_weights


@dataclass
class Span:
    """New tokens of one request inside a batched forward.

    ``start``: first pool slot of the request's extent. ``tokens``, ``positions``, ``write``: int64 ``[n]``
    (token ids, absolute RoPE positions, extent-relative slots that receive their K/V).
    ``kv_len``: the span attends over extent slots ``[0, kv_len)`` (its own new slots included).
    ``mask``: bool ``[n, kv_len]`` (True = attend) or None for causal: token i sees slots
    ``[0, kv_len − n + i]`` (new tokens written contiguously at the end).
    ``out_rows``: rows whose logits are wanted (int64 indices into ``[0, n)``), None = all.
    """

    start: int
    tokens: torch.Tensor
    positions: torch.Tensor
    write: torch.Tensor
    kv_len: int
    mask: torch.Tensor | None = None
    out_rows: torch.Tensor | None = None

    @property
    def n(self) -> int:
        return self.tokens.shape[0]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class DraftModel:
    """Weights + RoPE + KV pool + attention backend for one model folder.

    ``device``: "cpu" or "cuda:N". ``dtype``: defaults to float32 on CPU, bfloat16 on CUDA.
    ``kv_slots``: pool size in tokens (all layers); 0 ⇒ as many as ``kv_mem_mb`` MiB hold. ``attention``: "torch", "flashinfer", "triton" or "auto"
    (FlashInfer on CUDA when importable, torch otherwise).
    """

    def __init__(
        self,
        folder: str | Path | None,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        kv_slots: int = 0,
        attention: str = "auto",
        kv_mem_mb: float = 1024.0,
        *,
        parts: tuple[ModelConfig, ModelWeights] | None = None,
    ) -> None:
        """``parts``: an already built (config, weights) pair instead of a folder (random-weight benches)."""
        self.device = torch.device(device)
        self.dtype = dtype or (torch.float32 if self.device.type == "cpu" else torch.bfloat16)
        if parts is not None:
            self.cfg, self.w = parts
            self.folder = None
        else:
            self.cfg = ModelConfig.from_folder(folder)
            self.folder = Path(folder)
            self.w = load_weights(folder, self.cfg, self.dtype, self.device)
        if self.dtype is torch.float32:
            compact_linears(self.w)  # bf16-exact weights stream at half the bytes, same results
        self.rope = Rope(self.cfg, self.device, self.dtype)
        if kv_slots <= 0:
            kv_slots = max(1024, int(kv_mem_mb * (1 << 20)) // KVPool.slot_bytes(self.cfg, self.dtype))
        self.pool = KVPool(self.cfg, kv_slots, self.dtype, self.device)
        self.attn = make_attention(attention, self.cfg, self.pool, self.device)
        self.scale = self.cfg.head_dim**-0.5

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @property
    def head_vocab_size(self) -> int:
        return self.cfg.head_vocab_size

    @property
    def head_token_ids(self) -> torch.Tensor | None:
        return self.w.head_token_ids

    # ---- vocabulary mapping -------------------------------------------------------------------------
    def to_full_ids(self, head_ids: torch.Tensor) -> torch.Tensor:
        """Head-row indices → full-vocabulary token ids (identity without a reduced head)."""
        ids = self.w.head_token_ids
        return head_ids if ids is None else ids[head_ids]

    def to_head_ids(self, full_ids: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary ids → head rows; −1 for tokens the reduced head cannot produce."""
        ids = self.w.head_token_ids
        if ids is None:
            return full_ids
        table = torch.full((self.vocab_size,), -1, dtype=torch.int64, device=ids.device)
        table[ids] = torch.arange(ids.shape[0], device=ids.device)
        return table[full_ids.to(ids.device)]

    def full_logits(self, head_logits: torch.Tensor) -> torch.Tensor:
        """``[..., V_head]`` → ``[..., V]`` (−inf for tokens outside a reduced head)."""
        ids = self.w.head_token_ids
        if ids is None:
            return head_logits
        out = head_logits.new_full((*head_logits.shape[:-1], self.vocab_size), float("-inf"))
        out[..., ids] = head_logits
        return out

    # ---- forward ------------------------------------------------------------------------------------
    def prefill(self, prompts: list[tuple[int, list[int]]], chunk: int) -> None:
        """Write the KV of (extent start, prompt) pairs from position 0, in forwards of at most ``chunk``
        tokens: wave w holds chunk w of every prompt that has one, so a prompt's chunks go in order and
        never two in one forward (each attends over what the earlier ones wrote)."""
        waves = max(-(-len(prompt) // chunk) for _, prompt in prompts)
        none = torch.empty(0, dtype=torch.int64)
        for a in range(0, waves * chunk, chunk):
            spans, size = [], 0
            for start, prompt in prompts:
                if a >= len(prompt):
                    continue
                pos = torch.arange(a, min(a + chunk, len(prompt)))
                if spans and size + len(pos) > chunk:
                    self.forward(spans)
                    spans, size = [], 0
                spans.append(Span(start, torch.tensor(prompt[a : a + chunk]), pos, pos, int(pos[-1]) + 1, out_rows=none))
                size += len(pos)
            if spans:
                self.forward(spans)

    @torch.inference_mode()
    def forward(self, spans: list[Span]) -> list[torch.Tensor]:
        """Run all spans as one batch; returns float32 head logits ``[n_out, V_head]`` per span."""
        if not spans:
            return []
        dev = self.device
        tokens = torch.cat([s.tokens for s in spans]).to(dev)
        positions = torch.cat([s.positions for s in spans]).to(dev)
        slots = torch.cat([s.write + s.start for s in spans]).to(dev)
        cfg, w = self.cfg, self.w
        nq, nkv, d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        plan = self.attn.plan(spans)
        cos, sin = self.rope.tables(positions)
        h = w.embed[tokens]
        for i, lw in enumerate(w.layers):
            x = rms_norm(h, lw.attn_norm, cfg.rms_norm_eps)
            qkv = linear(x, lw.wqkv, lw.bqkv)
            q, k, v = qkv.split([nq * d, nkv * d, nkv * d], dim=-1)
            q, k, v = q.view(-1, nq, d), k.view(-1, nkv, d), v.view(-1, nkv, d)
            if lw.q_norm is not None:
                q = rms_norm(q, lw.q_norm, cfg.rms_norm_eps)
                k = rms_norm(k, lw.k_norm, cfg.rms_norm_eps)
            q, k = self.rope.apply(q, k, cos, sin)
            self.pool.k[i].index_copy_(0, slots, k)
            self.pool.v[i].index_copy_(0, slots, v)
            o = self.attn.run(plan, i, q, self.scale)
            h = h + linear(o.reshape(-1, nq * d), lw.wo, lw.bo)
            x = rms_norm(h, lw.mlp_norm, cfg.rms_norm_eps)
            gate, up = linear(x, lw.w_gate_up, lw.b_gate_up).chunk(2, dim=-1)
            h = h + linear(F.silu(gate) * up, lw.w_down, lw.b_down)
        rows, offset = [], 0
        for s in spans:
            r = torch.arange(s.n, device=dev) if s.out_rows is None else s.out_rows.to(dev)
            rows.append(r + offset)
            offset += s.n
        sel = torch.cat(rows)
        logits = linear(rms_norm(h[sel], w.norm, cfg.rms_norm_eps), w.lm_head).float()
        return list(logits.split([r.shape[0] for r in rows]))
