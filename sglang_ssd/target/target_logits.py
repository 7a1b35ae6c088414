"""SGLang ↔ the project's types, for the target worker: every conversion in one place.

In: SGLang's batch becomes the verifier's inputs — the processed verify logits, the `SamplingBatch`,
the seeded generators, the verify chain — and a request's sampling parameters the draft server's
`DraftParams`. Out: the verifier's `ChainVerifyResult` becomes SGLang's accept layout.

The verify logits are processed as SGLang processes them before sampling. Logit bias is the same at
every position of the chain; penalties are the committed context's, which is exact because a request
with penalties drafts nothing (`drafts_allowed`); the grammar mask is walked along the chain (xgrammar
via SGLang's `build_grammar_vocab_mask`), so a token the grammar forbids has p = 0 at that position and can be
neither accepted nor sampled as the bonus.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_ssd.algo.sampling_params import SamplingBatch
from sglang_ssd.algo.verify import ChainVerifyResult
from sglang_ssd.wire.messages import DraftParams

# ---- SGLang → the project -------------------------------------------------------------------------


def processed_logits(batch, logits: torch.Tensor, chain: torch.Tensor, width: int):
    """`logits` [bs*width, V] in place ⇒ (logits, allowed_mask or None); `chain` [bs, width] ids."""
    info = batch.sampling_info
    if info.acc_additive_penalties is not None:
        logits.add_(torch.repeat_interleave(info.acc_additive_penalties, width, dim=0))
    if info.acc_scaling_penalties is not None:
        from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties

        apply_scaling_penalties(logits, torch.repeat_interleave(info.acc_scaling_penalties, width, dim=0))
    if info.logit_bias is not None:
        logits.add_(torch.repeat_interleave(info.logit_bias, width, dim=0))
    if batch.has_grammar:
        from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask

        mask = build_grammar_vocab_mask(
            reqs=batch.reqs,
            tree=GrammarTree.from_linear_chain(chain.cpu()),
            sampling_info=info,
            device=logits.device,
            barrier=None,
        )
        if mask is not None:
            mask.apply(logits)
    return logits, None


def verify_chain_ids(batch, draft_tokens: torch.Tensor) -> torch.Tensor:
    """[bs, K+1] int64 on the CPU: each request's last committed token, then its drafts."""
    last = torch.tensor([req.output_ids[-1] for req in batch.reqs], dtype=torch.int64)
    return torch.cat([last[:, None], draft_tokens], dim=1)


def sampling_batch(batch) -> SamplingBatch:
    info = batch.sampling_info
    return SamplingBatch(
        temperature=info.temperatures.reshape(-1).float(),
        top_k=info.top_ks.reshape(-1).long(),
        top_p=info.top_ps.reshape(-1).float(),
        min_p=info.min_ps.reshape(-1).float() if info.need_min_p_sampling else None,
    )


def request_generators(batch):
    """Per-request generators for requests with a sampling seed (reproducible accept coins)."""
    seeds = [getattr(req.sampling_params, "sampling_seed", None) for req in batch.reqs]
    if all(s is None for s in seeds):
        return None
    gens = []
    for req, seed in zip(batch.reqs, seeds):
        g = torch.Generator(device="cpu")
        # Fresh coins each round, reproducible from (seed, position).
        g.manual_seed((int(seed or 0) * 1_000_003 + len(req.output_ids)) % (1 << 63))
        gens.append(g)
    return gens


def drafts_allowed(req) -> bool:
    """Whether a request's rounds may carry drafts and stay exact.

    SGLang folds a request's penalties in one token a step (the last committed one), and applies the
    min-new-tokens EOS mask from the length at the round's start, to every position of a chain: with
    several tokens a round, position j would see a history that lacks the drafts before it. A request
    with penalties or min_new_tokens is therefore decoded one token a round (nothing drafted), which
    keeps its law exactly AR's."""
    sp = req.sampling_params
    return (sp.frequency_penalty == 0 and sp.presence_penalty == 0 and sp.repetition_penalty == 1
            and not sp.min_new_tokens)


def draft_params(req) -> DraftParams:
    sp = req.sampling_params
    greedy = sp.top_k == 1 or sp.temperature <= 1e-6
    return DraftParams(
        temperature=0.0 if greedy else float(sp.temperature),
        top_k=0 if sp.top_k in (None, -1) or sp.top_k >= 1 << 30 else int(sp.top_k),
        top_p=float(sp.top_p),
        min_p=float(sp.min_p),
        seed=getattr(sp, "sampling_seed", None),
    )


def sampled_outcome(next_token_ids: torch.Tensor) -> ChainVerifyResult:
    """A plain DECODE step's token, drawn by SGLang's own sampler, as a round that drafted nothing."""
    bonus = next_token_ids.to(torch.int64)
    return ChainVerifyResult(torch.zeros_like(bonus), bonus[:, None], bonus)


# ---- the project → SGLang -------------------------------------------------------------------------


@dataclass
class AcceptLayout:
    """A verified round in the layout SGLang's scheduler and KV helpers read (``bs`` requests, chain
    width ``d``, the scheduler's stride ``width``)."""

    predict: torch.Tensor  # int32 [bs*d]: emitted tokens, 0 after
    tokens: torch.Tensor  # int32 [bs*width]: the same at the scheduler's fixed stride
    index: torch.Tensor  # [bs, d]: flat chain slot of each kept token (drafts + bonus), -1 after
    lens: torch.Tensor  # int32 [bs]: k + 1, the bonus included
    new_seq_lens: torch.Tensor


def accept_layout(outcome: ChainVerifyResult, seq_lens: torch.Tensor, d: int, width: int,
                  device) -> AcceptLayout:
    k = outcome.accept_len
    bs = k.shape[0]
    lens = (k + 1).to(torch.int32)
    emitted = outcome.tokens.clamp(min=0)
    predict = torch.zeros(bs, d, dtype=torch.int32, device=device)
    predict[:, : emitted.shape[1]] = emitted.to(torch.int32)
    slots = torch.arange(d, device=device)
    flat = torch.arange(bs, device=device)[:, None] * d + slots
    index = torch.where(slots[None, :] <= k[:, None], flat, -1)
    # The scheduler reads each request's emitted tokens at a fixed stride of `width`.
    tokens = torch.zeros(bs, width, dtype=torch.int32, device=device)
    tokens[:, :d] = predict
    return AcceptLayout(predict.flatten(), tokens.flatten(), index, lens, seq_lens + lens)
