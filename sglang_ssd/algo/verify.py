"""Exact chain verification (Leviathan et al. 2023 / Chen et al. 2023) for a batch of requests.

Per request b the draft proposed ``s_1..s_K`` with proposals ``q_1..q_K``; the target gave p_1..p_{K+1}
(processed sampling distributions, see :mod:`.sampling_params`). Accept s_i while u_i·q_i(s_i) < p_i(s_i)
(i.e. with probability min(1, p/q)); at the first rejection i = k+1 the **bonus** token is drawn from
norm(max(p_{k+1} − q_{k+1}, 0)); if all K are accepted, from p_{K+1}. Greedy rows: accept while
s_i = argmax p_i, bonus = argmax p_{k+1}.

Proposal kinds, all exact:

- dense q′ ``[B, K, V]`` (the draft sampled from it);
- :class:`~.probs.SparseProbs` ``[B, K, S]`` (the draft sampled from a truncated q′; this *is* q′);
- None: deterministic tokens (fast backup) ⇒ q = δ_x: accept with probability p(x), bonus from
  norm(p with x removed). ``deterministic [B]`` marks such rows inside a batch whose other rows carry
  sampled proposals.

The accept coins are fresh uniforms (independent of the drafting randomness), drawn per request when a
list of generators is given. On CUDA, with FlashInfer importable and no per-request generators, the
fused ``flashinfer.sampling.chain_speculative_sampling`` kernel runs the same rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from .probs import (
    Generators,
    SparseProbs,
    check_probs,
    draw_uniforms,
    sample_from_weights,
)
from .sampling_params import SamplingBatch, mask_logits, process_logits

Proposal = torch.Tensor | SparseProbs | None
Backend = Literal["auto", "torch", "flashinfer", "triton"]


@dataclass(frozen=True)
class ChainVerifyResult:
    """Outcome v = (k, t*) of one verification round for each of ``B`` requests.

    ``accept_len``: int64 ``[B]``, k = accepted draft tokens.
    ``tokens``: int64 ``[B, K+1]``, the emitted tokens ``s_1..s_k, t*`` left-aligned, −1 after.
    ``bonus``: int64 ``[B]``, t* (= ``tokens[b, k]``).
    """

    accept_len: torch.Tensor
    tokens: torch.Tensor
    bonus: torch.Tensor

    @property
    def num_emitted(self) -> torch.Tensor:
        """k + 1 per request (SGLang's ``accept_lens`` counts the bonus token)."""
        return self.accept_len + 1


def verify_chain(
    target_logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Proposal,
    sampling: SamplingBatch,
    *,
    allowed_mask: torch.Tensor | None = None,
    deterministic: torch.Tensor | None = None,
    num_draft: torch.Tensor | None = None,
    generator: Generators = None,
    uniforms: torch.Tensor | None = None,
    backend: Backend = "auto",
    check: bool = True,
) -> ChainVerifyResult:
    """Verify one chain per request from the target's raw logits.

    ``target_logits``: float ``[B, K+1, V]`` (penalties already applied, if the request has any: the
    server applies SGLang's speculative rule, ``target/target_logits.py``; the per-position rule is
    :func:`.sampling_params.apply_penalties`). ``draft_tokens``: integer ``[B, K]``.
    ``draft_probs``: the proposal (see module doc). ``sampling``: the requests' settings.
    ``allowed_mask``: grammar, bool ``[B, V]`` or ``[B, K+1, V]``, True = allowed.
    ``check``: validate shapes, dtypes and values (costs a device sync; the hot path may turn it off
    once its inputs are trusted — shapes and dtypes are always checked).
    Other arguments: see :func:`verify_chain_probs`.
    """
    if not isinstance(target_logits, torch.Tensor) or not target_logits.dtype.is_floating_point:
        raise ValueError("target_logits must be a float tensor")
    if target_logits.dim() != 3:
        raise ValueError(f"target_logits must be [B, K+1, V], got {tuple(target_logits.shape)}")
    batch = target_logits.shape[0]
    if not isinstance(sampling, SamplingBatch):
        raise ValueError("sampling must be a SamplingBatch")
    if sampling.batch_size != batch:
        raise ValueError(f"sampling is for {sampling.batch_size} requests, target_logits for {batch}")
    if allowed_mask is not None:
        if allowed_mask.dtype != torch.bool:
            raise ValueError(f"allowed_mask must be bool, got {allowed_mask.dtype}")
        shapes = ((batch, target_logits.shape[-1]), tuple(target_logits.shape))
        if tuple(allowed_mask.shape) not in shapes:
            raise ValueError(f"allowed_mask must have shape {shapes[0]} or {shapes[1]}")
        if check and not bool(allowed_mask.any(-1).all()):
            raise ValueError("allowed_mask has a row that allows no token")
    if check:
        sampling.validate(batch)
    if bool(sampling.greedy.all()):  # T = 0 batches: the argmax rule on the logits, no distributions
        _check_chain(target_logits, draft_tokens, draft_probs, None, deterministic, num_draft, uniforms,
                     check=check, target_checked=True)  # fmt: skip
        best = mask_logits(target_logits, allowed_mask).argmax(-1)
        return _greedy_chain(best, draft_tokens, num_draft)
    target_probs = process_logits(target_logits, sampling, allowed_mask)
    return verify_chain_probs(
        target_probs,
        draft_tokens,
        draft_probs,
        greedy=sampling.greedy,
        deterministic=deterministic,
        num_draft=num_draft,
        generator=generator,
        uniforms=uniforms,
        backend=backend,
        check=check,
        _target_checked=True,
    )


def verify_chain_probs(
    target_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_probs: Proposal,
    *,
    greedy: torch.Tensor | None = None,
    deterministic: torch.Tensor | None = None,
    num_draft: torch.Tensor | None = None,
    generator: Generators = None,
    uniforms: torch.Tensor | None = None,
    backend: Backend = "auto",
    check: bool = True,
    _target_checked: bool = False,
) -> ChainVerifyResult:
    """The SD rule on already-processed target distributions ``target_probs [B, K+1, V]``.

    ``greedy``: bool ``[B]``, rows verified by argmax. ``deterministic``: bool ``[B]``, rows whose draft
    tokens are point masses whatever ``draft_probs`` holds for them. ``num_draft``: int ``[B]`` ≤ K,
    rows whose chain is shorter (positions ≥ num_draft are not drafts; if all num_draft are accepted
    the bonus comes from p at that position) — the multi-level form needs this.
    ``generator``: one generator, one per request (reproducible per request), or None.
    ``uniforms``: float ``[B, K+1]`` in [0, 1) to use instead of drawing (coins, then the bonus draw).
    ``backend``: "auto" picks FlashInfer on CUDA when it can, else torch; "triton" runs the rule as
    one Triton kernel on the caller's (or freshly drawn) uniforms (``verify_triton.py``).
    """
    _check_chain(
        target_probs,
        draft_tokens,
        draft_probs,
        greedy,
        deterministic,
        num_draft,
        uniforms,
        check=check,
        target_checked=_target_checked,
    )
    batch, positions, _vocab = target_probs.shape
    kernel = None
    if backend not in ("torch", "triton"):
        usable = (
            (target_probs.is_cuda or backend == "flashinfer")
            and uniforms is None
            and (generator is None or isinstance(generator, torch.Generator))
        )
        kernel = _flashinfer_kernel() if usable else None
        if backend == "flashinfer" and kernel is None:
            raise ValueError(
                "backend='flashinfer' needs flashinfer importable, one generator at most, and no uniforms"
            )
    if greedy is not None and bool(greedy.all()):  # T = 0 batches: the argmax rule alone, no coins
        return _greedy_chain(target_probs.argmax(-1), draft_tokens, num_draft)
    if kernel is not None:
        result = _chain_flashinfer(
            kernel, target_probs, draft_tokens, draft_probs, deterministic, num_draft, generator
        )
    else:
        if uniforms is None:
            uniforms = draw_uniforms(batch, positions, generator, target_probs.device)
        if backend == "triton" and positions > 1:  # with nothing drafted the torch rule is the bonus alone
            from .verify_triton import chain_verify_triton

            qd = dense_proposal(draft_probs, draft_tokens, _vocab, deterministic)
            k, bonus = chain_verify_triton(target_probs, draft_tokens, qd, num_draft, uniforms)
            result = _emitted(draft_tokens, k, bonus)
        else:
            result = _chain_torch(target_probs, draft_tokens, draft_probs, deterministic, num_draft, uniforms)
    if greedy is not None and bool(greedy.any()):
        result = _merge(greedy, _greedy_chain(target_probs.argmax(-1), draft_tokens, num_draft), result)
    return result


# ---- the rule ------------------------------------------------------------------------------------


def _emitted(draft_tokens: torch.Tensor, k: torch.Tensor, bonus: torch.Tensor) -> ChainVerifyResult:
    batch, num = draft_tokens.shape
    pos = torch.arange(num + 1, device=draft_tokens.device)
    tokens = torch.cat([draft_tokens.long(), draft_tokens.new_full((batch, 1), -1).long()], 1)
    tokens = torch.where(pos == k[:, None], bonus[:, None], tokens)
    tokens = torch.where(pos > k[:, None], -1, tokens)
    return ChainVerifyResult(k, tokens, bonus)


def _accept_len(accept: torch.Tensor, num_draft: torch.Tensor | None) -> torch.Tensor:
    if num_draft is not None:
        accept = accept & (torch.arange(accept.shape[1], device=accept.device) < num_draft[:, None])
    return accept.long().cumprod(1).sum(1)


def _prob_of(q: Proposal, s: torch.Tensor) -> torch.Tensor:
    """q_i(s_i) as float32 ``[B, K]``; 1 for point masses."""
    if q is None:
        return torch.ones(s.shape, device=s.device)
    if isinstance(q, SparseProbs):
        return q.prob_of(s)
    return q.gather(-1, s.unsqueeze(-1)).squeeze(-1).float()


def _chain_torch(p, draft_tokens, q, deterministic, num_draft, u) -> ChainVerifyResult:
    batch, positions, _vocab = p.shape
    num = positions - 1
    s = draft_tokens.long()
    p_s = p[:, :num].gather(-1, s.unsqueeze(-1)).squeeze(-1).float()
    q_s = _prob_of(q, s)
    if deterministic is not None:
        q_s = torch.where(deterministic[:, None], 1.0, q_s)
    k = _accept_len(u[:, :num].float() * q_s < p_s, num_draft)

    rows = torch.arange(batch, device=p.device)
    p_k = p[rows, k].float()  # [B, V]: the target at the bonus position
    weights = p_k
    if num > 0:
        # Residual at the rejection position; it is only used where a rejection happened.
        kk = k.clamp(max=num - 1)
        if q is None or deterministic is not None:
            point = p_k.scatter(-1, s[rows, kk][:, None], 0.0)  # max(p − δ_x, 0): p without x
        if q is None:
            resid = point
        else:
            q_k = q[rows, kk]
            diff = q_k.subtract_from(p_k) if isinstance(q, SparseProbs) else p_k - q_k.float()
            resid = diff.clamp_min(0.0)
            if deterministic is not None:
                resid = torch.where(deterministic[:, None], point, resid)
        full = k == (num if num_draft is None else num_draft)
        weights = torch.where(full[:, None], p_k, resid)
        # p_k = q_k makes a rejection impossible in exact arithmetic; rounding may still land here.
        weights = torch.where(weights.sum(-1, keepdim=True) > 0, weights, p_k)
    bonus = sample_from_weights(weights, u[:, num])
    return _emitted(draft_tokens, k, bonus)


def _greedy_chain(best, draft_tokens, num_draft) -> ChainVerifyResult:
    """The greedy rule from the target's argmax at every position, ``best [B, K+1]``."""
    k = _accept_len(draft_tokens.long() == best[:, :-1], num_draft)
    return _emitted(draft_tokens, k, best.gather(1, k[:, None]).squeeze(1))


def _merge(rows: torch.Tensor, a: ChainVerifyResult, b: ChainVerifyResult) -> ChainVerifyResult:
    """``a`` where ``rows``, else ``b``."""
    return ChainVerifyResult(
        torch.where(rows, a.accept_len, b.accept_len),
        torch.where(rows[:, None], a.tokens, b.tokens),
        torch.where(rows, a.bonus, b.bonus),
    )


# ---- FlashInfer ----------------------------------------------------------------------------------


def _flashinfer_kernel():
    """``flashinfer.sampling.chain_speculative_sampling`` or None (imported lazily: CPU CI lacks it)."""
    try:
        from flashinfer.sampling import chain_speculative_sampling
    except Exception:  # ImportError, or a broken CUDA install raising anything at import
        return None
    return chain_speculative_sampling


def dense_proposal(
    draft_probs: Proposal,
    draft_tokens: torch.Tensor,
    vocab_size: int,
    deterministic: torch.Tensor | None = None,
) -> torch.Tensor:
    """Any proposal as a dense float32 ``[B, K, V]`` tensor (point masses one-hot)."""
    s = draft_tokens.long()
    one_hot = torch.zeros(*s.shape, vocab_size, device=s.device).scatter_(-1, s.unsqueeze(-1), 1.0)
    if draft_probs is None:
        return one_hot
    dense = draft_probs.to_dense() if isinstance(draft_probs, SparseProbs) else draft_probs.float()
    if deterministic is not None:
        dense = torch.where(deterministic[:, None, None], one_hot, dense)
    return dense


def _chain_flashinfer(kernel, p, draft_tokens, q, deterministic, num_draft, generator) -> ChainVerifyResult:
    """The fused kernel: same rule, its own coins. Point masses become one-hot rows, for which the
    kernel's min(1, p/q) and max(p − q, 0) are exactly the point-mass rule. Shorter chains
    (``num_draft``): the kernel's coins at live positions stand; a row that accepted every live draft
    gets its bonus drawn afresh from p at position num_draft (what follows there is padding)."""
    batch, positions, vocab = p.shape
    qd = dense_proposal(q, draft_tokens, vocab, deterministic).contiguous()
    accepted = torch.zeros(batch, dtype=torch.int32, device=p.device)
    emitted = torch.zeros(batch, dtype=torch.int32, device=p.device)
    out = kernel(
        qd,
        draft_tokens.int().contiguous(),
        p.float().contiguous(),
        accepted,
        emitted,
        deterministic=True,
        generator=generator,
    )
    k = emitted.long()
    bonus = out.long().gather(1, k[:, None]).squeeze(1)
    if num_draft is not None:
        n = num_draft.long()
        over = k >= n
        u = torch.rand(batch, device=p.device, generator=generator)
        fresh = sample_from_weights(p[torch.arange(batch, device=p.device), n].float(), u)
        k = torch.where(over, n, k)
        bonus = torch.where(over, fresh, bonus)
    return _emitted(draft_tokens, k, bonus)


# ---- input checks --------------------------------------------------------------------------------


def _check_chain(p, s, q, greedy, deterministic, num_draft, uniforms, *, check, target_checked) -> None:
    """ValueError naming the argument that does not fit. Shapes/dtypes always; values if ``check``."""
    if not isinstance(p, torch.Tensor) or not p.dtype.is_floating_point or p.dim() != 3:
        raise ValueError("target_probs must be a float [B, K+1, V] tensor")
    batch, positions, vocab = p.shape
    num = positions - 1
    if not isinstance(s, torch.Tensor) or s.dtype.is_floating_point or s.dtype == torch.bool:
        raise ValueError(f"draft_tokens must be an integer tensor, got {getattr(s, 'dtype', type(s))}")
    if tuple(s.shape) != (batch, num):
        raise ValueError(f"draft_tokens must have shape {(batch, num)}, got {tuple(s.shape)}")
    if isinstance(q, SparseProbs):
        if q.vocab_size != vocab or tuple(q.shape) != (batch, num):
            raise ValueError(
                f"draft_probs (sparse) must cover [B, K] = {(batch, num)} over V = {vocab}, "
                f"got {tuple(q.shape)} over V = {q.vocab_size}"
            )
    elif q is not None:
        if not isinstance(q, torch.Tensor) or not q.dtype.is_floating_point:
            raise ValueError("draft_probs must be a float tensor, a SparseProbs or None")
        if tuple(q.shape) != (batch, num, vocab):
            raise ValueError(f"draft_probs must have shape {(batch, num, vocab)}, got {tuple(q.shape)}")
    for name, t in (("greedy", greedy), ("deterministic", deterministic)):
        if t is not None and (t.dtype != torch.bool or tuple(t.shape) != (batch,)):
            raise ValueError(f"{name} must be a bool tensor of shape ({batch},)")
    if num_draft is not None and (num_draft.dtype.is_floating_point or tuple(num_draft.shape) != (batch,)):
        raise ValueError(f"num_draft must be an integer tensor of shape ({batch},)")
    if uniforms is not None and (
        not uniforms.dtype.is_floating_point or tuple(uniforms.shape) != (batch, positions)
    ):
        raise ValueError(f"uniforms must be a float tensor of shape ({batch}, {positions})")
    if not check:
        return
    if s.numel() and (int(s.min()) < 0 or int(s.max()) >= vocab):
        raise ValueError(f"draft_tokens has token ids outside the vocabulary [0, {vocab})")
    if not target_checked:
        check_probs(p, "target_probs")
    if (
        num_draft is not None
        and num_draft.numel()
        and (int(num_draft.min()) < 0 or int(num_draft.max()) > num)
    ):
        raise ValueError(f"num_draft must be in [0, {num}]")
    if q is None or not s.numel():
        return
    # Only positions whose token was sampled from q must carry a distribution (greedy and point-mass
    # rows ignore q; positions past num_draft are not drafts).
    used = torch.ones_like(s, dtype=torch.bool)
    for t in (greedy, deterministic):
        if t is not None:
            used &= ~t[:, None]
    if num_draft is not None:
        used &= torch.arange(num, device=s.device) < num_draft[:, None]
    if isinstance(q, SparseProbs):
        q_used = SparseProbs(q.indices[used], q.probs[used], q.vocab_size)
        q_used.validate("draft_probs")
        q_s = q_used.prob_of(s[used])
    else:
        check_probs(q[used], "draft_probs")
        q_s = q[used].gather(-1, s[used].long()[:, None]).squeeze(-1)
    # A sampled token must lie in the support of the distribution it was sampled from.
    if bool((q_s <= 0).any()):
        raise ValueError("draft_probs gives probability 0 to a draft token it should have produced")
