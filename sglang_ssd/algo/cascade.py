"""Multi-level (recursive) verification: M0 → M1 → M2, smallest to target (docs/ALGORITHM.md §9).

M1 verifies M0's chain with the SD rule, so M1's emitted block y_1..y_J (J = k+1: accepted drafts and
the bonus) has exactly M1's law. That block is then a draft for M2 whose proposal at position j is
**M1's own processed sampling distribution** p_1(· | c, y_<j) — computed in M1's verification pass —
not the residual M1 drew a corrected token from. M2 accepts with min(1, p_2/p_1), draws its bonus from
norm(max(0, p_2 − p_1)) (or p_2 after all J). Exact by induction: given the past and that the block
goes on, y_j ~ p_1(· | c, y_<j) whether y_j was an accepted M0 token or M1's bonus.

If a level samples from a modified distribution (its own temperature, Saguaro), that modified
distribution is the q the level above must use — pass the probabilities the level actually used.

The draft server's L1 verifies its L0 with :func:`verify_level_probs` (``draft/recursive.py``), so the
statistical cases of ``tests/algo`` check the rule it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch

from .probs import Generators
from .sampling_params import SamplingBatch, process_logits
from .verify import Backend, ChainVerifyResult, Proposal, verify_chain, verify_chain_probs


@dataclass(frozen=True)
class CascadeDraft:
    """A lower level's verified block, as a draft for the level above.

    ``tokens``: int64 ``[B, K+1]``, y_1..y_J then ``pad_token``; ``probs``: float ``[B, K+1, V]``, the
    lower level's processed distribution at each position (its q); ``num_draft``: int64 ``[B]``, J.
    """

    tokens: torch.Tensor
    probs: torch.Tensor
    num_draft: torch.Tensor


def verify_level(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Proposal,
    sampling: SamplingBatch,
    *,
    allowed_mask: torch.Tensor | None = None,
    num_draft: torch.Tensor | None = None,
    generator: Generators = None,
    backend: Backend = "auto",
    check: bool = True,
) -> tuple[ChainVerifyResult, torch.Tensor]:
    """Verify at one level and also return that level's processed distribution ``[B, K+1, V]``."""
    probs = process_logits(logits, sampling, allowed_mask)
    result = verify_level_probs(
        probs,
        draft_tokens,
        draft_probs,
        greedy=sampling.greedy,
        num_draft=num_draft,
        generator=generator,
        backend=backend,
        check=check,
    )
    return result, probs


def verify_level_probs(
    probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Proposal,
    *,
    greedy: torch.Tensor | None = None,
    num_draft: torch.Tensor | None = None,
    generator: Generators = None,
    uniforms: torch.Tensor | None = None,
    draws: torch.Tensor | None = None,
    backend: Backend = "auto",
    check: bool = True,
) -> ChainVerifyResult:
    """The SD rule at one level on the distributions it samples from, ``probs [B, K+1, V]`` (these,
    not the residual, are its q for the level above). Arguments as for ``verify_chain_probs``, plus:

    ``draws``: float ``[B, K+1]``, the uniform of the token drawn at each position; the token emitted
    after k acceptances is drawn with ``draws[:, k]`` and ``uniforms[:, :K]`` are the coins (its last
    column is unused). The draft server's L1 takes its uniforms per position this way, so its draw at
    a position is the one a plain step there would make.
    """
    run = partial(verify_chain_probs, probs, draft_tokens, draft_probs, greedy=greedy, num_draft=num_draft,
                  generator=generator, backend=backend, check=check)  # fmt: skip
    if draws is None:
        return run(uniforms=uniforms)
    if uniforms is None or tuple(draws.shape) != tuple(uniforms.shape):
        raise ValueError("draws needs uniforms (the coins) of the same shape [B, K+1]")
    # One draw per row, at a position only known once the coins have set k: the coins alone set k,
    # so the second pass, with the same coins and draws[:, k], accepts the same tokens.
    num = draft_tokens.shape[1]
    first = run(uniforms=torch.cat([uniforms[:, :num], draws[:, num:]], 1))
    if bool((first.accept_len == num).all()):
        return first
    return run(uniforms=torch.cat([uniforms[:, :num], draws.gather(1, first.accept_len[:, None])], 1))


def cascade_draft(result: ChainVerifyResult, level_probs: torch.Tensor, pad_token: int = 0) -> CascadeDraft:
    """Turn a level's verification (``result``, and the ``level_probs [B, K+1, V]`` it verified with)
    into the draft for the next level: J = k+1 tokens with q_j = level_probs[:, j]."""
    if level_probs.dim() != 3 or tuple(level_probs.shape[:2]) != tuple(result.tokens.shape):
        raise ValueError(
            f"level_probs must be [B, K+1, V] matching tokens {tuple(result.tokens.shape)}, "
            f"got {tuple(level_probs.shape)}"
        )
    tokens = torch.where(result.tokens < 0, pad_token, result.tokens)
    return CascadeDraft(tokens, level_probs, result.num_emitted)


def verify_cascade(
    upper_logits: torch.Tensor,
    draft: CascadeDraft,
    sampling: SamplingBatch,
    *,
    allowed_mask: torch.Tensor | None = None,
    generator: Generators = None,
    backend: Backend = "auto",
    check: bool = True,
) -> ChainVerifyResult:
    """Verify a lower level's block at the level above. ``upper_logits``: ``[B, K+2, V]``, the upper
    model's logits after each prefix of ``draft.tokens`` (positions past J are ignored)."""
    return verify_chain(
        upper_logits,
        draft.tokens,
        draft.probs,
        sampling,
        allowed_mask=allowed_mask,
        num_draft=draft.num_draft,
        generator=generator,
        backend=backend,
        check=check,
    )
