"""Tree attention through the C kernel (``cpu/csrc/attention.c``) for small spans: the CPU fp32 default.

Computes what ``attention.py``'s torch path computes: every new token of every span attends over the
extent slots its mask row allows (causal over the span's tail where it has none). The kernel reads K/V
through a token table, so each query row becomes its own one-token "request" whose table row lists the
pool slots it may see; one call per layer then covers every small span of the forward, where the torch
path runs an SDPA per span (about 130 µs each for a one-token decode, most of it setup). The tables are
built once per forward in ``plan`` and reused by every layer. Spans of more than ``SMALL_SPAN`` tokens
(prefill chunks, wide tree steps) stay on SDPA: the kernel reads every key once per (query, head) pair,
where SDPA shares each key read among a span's queries, and from about 6 rows on that costs more than
the per-call setup it saves (``bench/draft_forward.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_ssd.cpu import clib
from sglang_ssd.cpu.sglang_attention import attend

from .attention import TorchAttention
from .kv_pool import KVPool
from .model_config import ModelConfig

SMALL_SPAN = 4  # spans of at most this many tokens go to the C kernel (measured, see the docstring)


@dataclass
class _Plan:
    index: torch.Tensor  # int64 [rows]: batch rows of the small spans, in order
    table: torch.Tensor  # int32 [rows, width]: row r's visible pool slots
    lens: torch.Tensor  # int64 [rows]: how many of its table entries row r sees
    large: list  # TorchAttention plans of the other spans
    requests: torch.Tensor  # int64 [rows]: 0 .. rows - 1, each row its own table row


def visible_slots(span) -> tuple[torch.Tensor, torch.Tensor]:
    """(extent-relative slots [n, width] with each row's visible ones first, counts [n]) of one span."""
    n, kv_len = span.n, span.kv_len
    j = torch.arange(kv_len)
    if span.mask is None:  # causal tail: row i sees slots [0, kv_len - n + i]
        return j.expand(n, kv_len), torch.arange(kv_len - n + 1, kv_len + 1)
    mask = span.mask.to("cpu", torch.bool)
    if tuple(mask.shape) != (n, kv_len):
        raise ValueError(f"span mask must be [{n}, {kv_len}], got {tuple(mask.shape)}")
    # Visible slots sort before hidden ones (key kv_len), in slot order.
    keys = torch.where(mask, j, kv_len).sort(dim=1).values
    return keys, mask.sum(1)


class CAttention:
    """Small spans' rows in one C call per layer, larger spans through SDPA; K/V are already in the pool."""

    def __init__(self, cfg: ModelConfig, pool: KVPool, device: torch.device, fn,
                 small_span: int = SMALL_SPAN) -> None:  # fmt: skip
        self.pool = pool
        self.fn = fn
        self.small_span = small_span
        self.kv_heads = cfg.num_kv_heads
        self.torch = TorchAttention(cfg, pool, device)

    def plan(self, spans) -> _Plan:
        sdpa = self.torch.plan(spans)  # every span's batch rows (and mask checks); the large ones run here
        small = [(s, p.row) for s, p in zip(spans, sdpa) if s.n <= self.small_span]
        parts = [visible_slots(s) for s, _ in small]
        rows = sum(s.n for s, _ in small)
        width = max((slots.shape[1] for slots, _ in parts), default=1)
        table = torch.zeros((rows, width), dtype=torch.int32)
        r = 0
        for (s, _), (slots, _) in zip(small, parts):
            table[r : r + s.n, : slots.shape[1]] = slots + s.start
            r += s.n
        lens = torch.cat([count for _, count in parts]).to(torch.int64) if parts else torch.empty(0, dtype=torch.int64)
        if rows and int(lens.min()) < 1:  # the kernel's decode layout: every row sees at least one slot
            raise ValueError("every span row must see at least one slot")
        index = torch.cat([torch.arange(row, row + s.n) for s, row in small]) if small else lens
        return _Plan(index, table, lens, [p for p in sdpa if p.n > self.small_span], torch.arange(rows))

    def run(self, plan: _Plan, layer: int, q: torch.Tensor, scale: float) -> torch.Tensor:
        """q ``[N, Hq, D]`` ⇒ attention output ``[N, Hq, D]``."""
        out = self.torch.run(plan.large, layer, q, scale)
        if plan.index.numel():
            rows = q[plan.index].reshape(plan.index.numel(), -1)
            o = attend(self.fn, rows, self.pool.k[layer], self.pool.v[layer], plan.table,
                       plan.requests, plan.lens, 1, self.kv_heads, scale, decode=True)  # fmt: skip
            if o is None:
                raise RuntimeError("the C attention refused the draft pool's layout")
            out[plan.index] = o.view(-1, *q.shape[1:])
        return out


def c_attention_kernel(cfg: ModelConfig, pool: KVPool, device: torch.device):
    """The C kernel when it applies to this pool (CPU, fp32, equal K/V strides), else None."""
    if device.type != "cpu" or pool.k.dtype is not torch.float32:
        return None
    k, v = pool.k[0], pool.v[0]
    if k.stride() != v.stride() or k.stride()[1:] != (cfg.head_dim, 1) or cfg.num_heads % cfg.num_kv_heads:
        return None
    return clib.attention_kernel()
