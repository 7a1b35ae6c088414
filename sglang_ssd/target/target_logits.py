"""The target's verify logits, processed as SGLang processes them before sampling.

Penalties and logit bias follow SGLang's speculative convention (the accumulated penalties of the
committed context, the same for every position of the chain); the grammar mask is walked along the
chain (xgrammar via SGLang's `build_grammar_vocab_mask`), so a token the grammar forbids has p = 0 at
that position and can be neither accepted nor sampled as the bonus.
"""

from __future__ import annotations

import torch


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
