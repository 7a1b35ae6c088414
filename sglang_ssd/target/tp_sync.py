"""SSD under tensor parallelism: one rank speaks to the draft server, every rank decides the same.

With ``--tp-size N`` SGLang runs N scheduler processes that execute the same batch in lock-step. Only
the group's first rank (the *source*) owns a draft link — N links would open every request N times.
Each round the source broadcasts the stacked speculation (tokens, counts, q′ and the hit flags) over
the TP group's CPU (gloo) group, every rank verifies it against its own, identical, target logits, and
the source broadcasts its verification result so that an accept/reject coin can never differ between
ranks (non-seeded requests draw from each process's RNG). Only fixed-layout tensors cross the group, no Python objects.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from sglang_ssd.algo.probs import SparseProbs
from sglang_ssd.algo.verify import ChainVerifyResult
from sglang_ssd.target.proposals import BatchProposal

_SPARSE, _DENSE = 0, 1


class TPSync:
    """``group``: a torch.distributed process group (CPU-capable); ``src``: the global rank of its source."""

    def __init__(self, group, src: int, rank_in_group: int) -> None:
        self.group, self.src, self.rank_in_group = group, src, rank_in_group

    @property
    def is_source(self) -> bool:
        return self.rank_in_group == 0

    @classmethod
    def from_sglang(cls, server_args) -> TPSync | None:
        if int(getattr(server_args, "tp_size", 1) or 1) <= 1:
            return None
        from sglang.srt.distributed.parallel_state import get_tp_group

        g = get_tp_group()
        return cls(g.cpu_group, g.ranks[0], g.rank_in_group)

    def _bcast(self, t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        dist.broadcast(t, src=self.src, group=self.group)
        return t

    def proposal(self, prop: BatchProposal | None, hits: list[int] | None) -> tuple[BatchProposal, list[int]]:
        """The source's proposal and hit flags on every rank (others pass None, None)."""
        if self.is_source:
            sparse = isinstance(prop.q, SparseProbs)
            b, k = prop.tokens.shape
            width = prop.q.support if sparse else prop.q.shape[-1]
            vocab = prop.q.vocab_size if sparse else width
            header = torch.tensor([_SPARSE if sparse else _DENSE, b, k, width, vocab], dtype=torch.int64)
        else:
            header = torch.zeros(5, dtype=torch.int64)
        kind, b, k, width, vocab = self._bcast(header).tolist()
        src = self.is_source

        def take(t: torch.Tensor | None, shape, dtype) -> torch.Tensor:
            return self._bcast(t.to(dtype) if src else torch.empty(shape, dtype=dtype))

        tokens = take(prop.tokens if src else None, (b, k), torch.int64)
        num = take(prop.num_draft if src else None, (b,), torch.int64)
        det = take(prop.deterministic if src else None, (b,), torch.bool)
        flags = take(torch.tensor(hits, dtype=torch.int64) if src else None, (b,), torch.int64)
        if kind == _SPARSE:
            idx = take(prop.q.indices if src else None, (b, k, width), torch.int64)
            val = take(prop.q.probs if src else None, (b, k, width), torch.float32)
            q = SparseProbs(idx, val, vocab)
        else:
            q = take(prop.q if src else None, (b, k, width), torch.float32)
        return BatchProposal(tokens, num, q, det), flags.tolist()

    def outcome(self, result: ChainVerifyResult) -> ChainVerifyResult:
        """The source's accept/reject decisions on every rank (shapes are the same on all ranks)."""
        dev = result.tokens.device
        # Copies: a CPU tensor's .cpu() is itself, and broadcasting into it would rewrite the caller's result.
        return ChainVerifyResult(
            self._bcast(result.accept_len.cpu().clone()).to(dev),
            self._bcast(result.tokens.cpu().clone()).to(dev),
            self._bcast(result.bonus.cpu().clone()).to(dev),
        )
