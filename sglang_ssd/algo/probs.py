"""Probability containers and the small sampling primitives shared by the verifier and the drafter.

A proposal distribution q′ travels in one of two forms:

- dense: a float tensor ``[..., V]`` (rows sum to 1);
- :class:`SparseProbs`: ``indices [..., S]`` + ``probs [..., S]`` over a vocabulary of ``V`` tokens,
  the exact form of a distribution whose support has at most ``S`` tokens (a draft that samples from a
  truncated, top-S distribution). Padding entries carry probability 0; a repeated index adds up.

A deterministic proposal (fast backup: n-gram / random tokens) is the point mass δ_x; it needs no
tensor at all (see :func:`point_mass`).

All randomness is drawn up front as uniforms in [0, 1) (:func:`draw_uniforms`) and turned into tokens
by inverse-CDF lookup (:func:`sample_from_weights`), so one set of per-request generators makes a whole
batch reproducible while the arithmetic stays vectorized.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

Generators = torch.Generator | Sequence[torch.Generator] | None

#: How far a row of probabilities may be from summing to 1 before it is rejected as bad input.
SUM_TOLERANCE = 1e-3


@dataclass(frozen=True)
class SparseProbs:
    """A distribution over ``vocab_size`` tokens stored on its (at most ``S``-token) support.

    ``indices``: integer ``[..., S]``, token ids in ``[0, vocab_size)``.
    ``probs``: float ``[..., S]``, ``probs[..., j]`` is the probability of ``indices[..., j]``.
    """

    indices: torch.Tensor
    probs: torch.Tensor
    vocab_size: int

    # ---- shape ---------------------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        """Leading shape (everything but the support dimension)."""
        return self.indices.shape[:-1]

    @property
    def support(self) -> int:
        return self.indices.shape[-1]

    @property
    def device(self) -> torch.device:
        return self.indices.device

    def __getitem__(self, item) -> SparseProbs:
        """Index the leading dimensions (never the support dimension)."""
        return SparseProbs(self.indices[item], self.probs[item], self.vocab_size)

    def reshape(self, *shape: int) -> SparseProbs:
        """Reshape the leading dimensions (e.g. flat branches ``[N]`` to ``[B, K]``)."""
        return SparseProbs(
            self.indices.reshape(*shape, self.support),
            self.probs.reshape(*shape, self.support),
            self.vocab_size,
        )

    def to(self, device: torch.device | str) -> SparseProbs:
        return SparseProbs(self.indices.to(device), self.probs.to(device), self.vocab_size)

    # ---- constructors --------------------------------------------------------------------------
    @staticmethod
    def from_dense(probs: torch.Tensor, support: int, *, atol: float = SUM_TOLERANCE) -> SparseProbs:
        """Exact sparse form of a dense distribution whose support has at most ``support`` tokens.

        Raises ValueError when more than ``atol`` of a row's mass lies outside its top-``support``
        tokens (the sparse form would then be a different distribution, which breaks exactness).
        """
        if support < 1 or support > probs.shape[-1]:
            raise ValueError(f"support must be in [1, {probs.shape[-1]}], got {support}")
        values, indices = torch.topk(probs, support, dim=-1)
        lost = (probs.sum(-1) - values.sum(-1)).abs()
        if lost.numel() and float(lost.max()) > atol:
            raise ValueError(
                f"probs has mass {float(lost.max()):.3g} outside its top-{support} tokens; "
                "the sparse form would not be the distribution the tokens were drawn from"
            )
        return SparseProbs(indices, values, probs.shape[-1])

    # ---- use -----------------------------------------------------------------------------------
    def to_dense(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        out = torch.zeros(*self.shape, self.vocab_size, dtype=dtype, device=self.device)
        return out.scatter_add_(-1, self.indices.long(), self.probs.to(dtype))

    def prob_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """``q(tokens)`` for ``tokens`` of the leading shape; float32."""
        hit = self.indices.long() == tokens.long().unsqueeze(-1)
        return (self.probs.float() * hit).sum(-1)

    def subtract_from(self, dense: torch.Tensor) -> torch.Tensor:
        """``dense − q`` as a dense float32 tensor (``dense`` has the leading shape + ``[V]``)."""
        return dense.float().scatter_add(-1, self.indices.long(), -self.probs.float())

    def validate(self, name: str, *, atol: float = SUM_TOLERANCE) -> None:
        """ValueError naming ``name`` unless this is a well-formed distribution."""
        if self.indices.dtype.is_floating_point or self.indices.dtype == torch.bool:
            raise ValueError(f"{name}.indices must be an integer tensor, got {self.indices.dtype}")
        if not self.probs.dtype.is_floating_point:
            raise ValueError(f"{name}.probs must be a float tensor, got {self.probs.dtype}")
        if self.indices.shape != self.probs.shape:
            raise ValueError(
                f"{name}.indices {tuple(self.indices.shape)} and {name}.probs "
                f"{tuple(self.probs.shape)} must have the same shape"
            )
        if self.indices.numel() and (
            int(self.indices.min()) < 0 or int(self.indices.max()) >= self.vocab_size
        ):
            raise ValueError(f"{name}.indices has token ids outside [0, {self.vocab_size})")
        check_probs(self.probs, name, atol=atol)


def check_probs(probs: torch.Tensor, name: str, *, atol: float = SUM_TOLERANCE) -> None:
    """ValueError naming ``name`` unless every row of ``probs`` is ≥ 0 and sums to 1 (± ``atol``)."""
    if not probs.dtype.is_floating_point:
        raise ValueError(f"{name} must be a float tensor, got {probs.dtype}")
    if probs.numel() == 0:
        return
    if not bool(torch.isfinite(probs).all()):
        raise ValueError(f"{name} has non-finite entries")
    if float(probs.min()) < 0:
        raise ValueError(f"{name} has negative probabilities")
    err = float((probs.float().sum(-1) - 1).abs().max())
    if err > atol:
        raise ValueError(f"{name} rows must sum to 1, worst row is off by {err:.3g}")


def point_mass(tokens: torch.Tensor, vocab_size: int) -> SparseProbs:
    """δ_x for each token: the proposal of a deterministic (fast-backup) drafter."""
    return SparseProbs(
        tokens.long().unsqueeze(-1),
        torch.ones(*tokens.shape, 1, dtype=torch.float32, device=tokens.device),
        vocab_size,
    )


def draw_uniforms(
    batch: int, n: int, generator: Generators = None, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """``[batch, n]`` float32 uniforms in [0, 1).

    ``generator``: one generator for the whole batch, or one per row (reproducible per request no matter
    which batch the request lands in), or None for torch's default generator.
    """
    if generator is None or isinstance(generator, torch.Generator):
        gdev = generator.device if generator is not None else device
        return torch.rand(batch, n, generator=generator, device=gdev).to(device)
    if len(generator) != batch:
        raise ValueError(f"generator: got {len(generator)} generators for a batch of {batch}")
    if batch == 0:
        return torch.empty(0, n, device=device)
    # One small draw per request is the price of per-request reproducibility; the math stays batched.
    rows = [torch.rand(n, generator=g, device=g.device) for g in generator]
    return torch.stack([r.to(device) for r in rows])


def sample_from_weights(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw: index ``t`` with probability ``weights[..., t] / weights.sum(-1)``.

    ``weights``: ``[..., V]`` non-negative (need not be normalized); ``u``: ``[...]`` uniforms in [0, 1).
    A zero-weight index is never returned (up to a rounding fallback to the heaviest index).
    """
    w = weights.float()
    cdf = w.cumsum(-1)
    x = (u.float() * cdf[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, x, right=True).clamp_(max=w.shape[-1] - 1)
    bad = w.gather(-1, idx) <= 0  # only when u·total rounds up to total
    idx = torch.where(bad, w.argmax(-1, keepdim=True), idx)
    return idx.squeeze(-1)


def sample_proposal(q: torch.Tensor | SparseProbs, u: torch.Tensor) -> torch.Tensor:
    """One token per row of a dense or sparse distribution, from uniforms ``u`` of the leading shape."""
    if isinstance(q, SparseProbs):
        j = sample_from_weights(q.probs, u)
        return q.indices.gather(-1, j.unsqueeze(-1)).squeeze(-1).long()
    return sample_from_weights(q, u)
