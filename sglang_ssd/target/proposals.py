"""Stack per-request speculations (as received from the draft server) into batched proposals."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_ssd.algo.probs import Generators, SparseProbs
from sglang_ssd.algo.sampling_params import SamplingBatch
from sglang_ssd.algo.verify import ChainVerifyResult, verify_chain
from sglang_ssd.wire.speculation import Speculation


@dataclass
class BatchProposal:
    """Drafts for a verify batch of ``B`` requests, padded to ``K``.

    ``tokens`` int64 ``[B, K]``; ``num_draft`` int64 ``[B]`` (0 = nothing to verify but the bonus);
    ``q`` SparseProbs ``[B, K, S]`` or dense float32 ``[B, K, V]``: the distribution each token was drawn
    from (padding rows are point masses, never used); ``deterministic`` bool ``[B]``: point-mass rows.
    """

    tokens: torch.Tensor
    num_draft: torch.Tensor
    q: SparseProbs | torch.Tensor
    deterministic: torch.Tensor

    def verify(self, target_logits: torch.Tensor, sampling: SamplingBatch, *,
               allowed_mask: torch.Tensor | None = None, generator: Generators = None) -> ChainVerifyResult:
        """Exact rejection sampling of these drafts against the target's processed logits ``[B, K+1, V]``
        (on their device), with the q′ each draft was drawn from."""
        dev = target_logits.device
        return verify_chain(
            target_logits,
            self.tokens.to(dev),
            self.q.to(dev),
            sampling,
            allowed_mask=allowed_mask,
            deterministic=self.deterministic.to(dev),
            num_draft=self.num_draft.to(dev),
            generator=generator,
            check=False,
        )


def stack_proposals(specs: list[Speculation | None], k: int, vocab_size: int) -> BatchProposal:
    b = len(specs)
    tokens = torch.zeros(b, k, dtype=torch.int64)
    num = torch.zeros(b, dtype=torch.int64)
    det = torch.ones(b, dtype=torch.bool)
    any_dense = False
    support = 1
    for i, s in enumerate(specs):
        if s is None or len(s.tokens) == 0:
            continue
        n = min(len(s.tokens), k)
        tokens[i, :n] = s.tokens[:n]
        num[i] = n
        if s.q is not None:
            det[i] = False
            if isinstance(s.q, SparseProbs):
                support = max(support, s.q.support)
            else:
                any_dense = True
    if any_dense:
        q = torch.zeros(b, k, vocab_size)
        q.scatter_(-1, tokens.unsqueeze(-1), 1.0)  # point masses for padding / deterministic rows
        for i, s in enumerate(specs):
            if s is not None and s.q is not None and num[i] > 0:
                n = int(num[i])
                q[i, :n] = s.q[:n].to_dense() if isinstance(s.q, SparseProbs) else s.q[:n].float()
        return BatchProposal(tokens, num, q, det)
    idx = tokens.unsqueeze(-1).repeat(1, 1, support)
    val = torch.zeros(b, k, support)
    val[:, :, 0] = 1.0
    for i, s in enumerate(specs):
        if s is not None and s.q is not None and num[i] > 0:
            n, sup = int(num[i]), s.q.support
            idx[i, :n, :sup] = s.q.indices[:n].long()
            idx[i, :n, sup:] = s.q.indices[:n, :1].long()  # padding: a support token with probability 0
            val[i, :n] = 0.0
            val[i, :n, :sup] = s.q.probs[:n].float()
    return BatchProposal(tokens, num, SparseProbs(idx, val, vocab_size), det)


def chain_tree(seq_lens: torch.Tensor, d: int) -> tuple[torch.Tensor, ...]:
    """The verify-tree metadata of ``bs`` chains of ``d`` tokens, what SGLang's
    ``reconstruct_indices_from_tree_mask`` derives from their lower-triangular masks, written down
    directly (on CPU the generic derivation took 171 µs for one 5-token chain, this 25 µs): token i
    of chain b sits at position seq_lens[b] + i, has index b * d + i, its next token i + 1 (−1 for the
    last) and no sibling. ⇒ positions [bs * d], retrieve_index, retrieve_next_token, retrieve_next_sibling [bs, d]."""
    bs, dev = seq_lens.shape[0], seq_lens.device
    step = torch.arange(d, dtype=torch.int64, device=dev)
    positions = (seq_lens.to(torch.int64)[:, None] + step).flatten()
    retrieve_index = torch.arange(bs * d, dtype=torch.int64, device=dev).view(bs, d)
    next_token = torch.where(step + 1 < d, step + 1, -1).expand(bs, d).contiguous()
    return positions, retrieve_index, next_token, torch.full((bs, d), -1, dtype=torch.int64, device=dev)
