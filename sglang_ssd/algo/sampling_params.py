"""The target's sampling distribution p, exactly as a request samples from it.

SD is exact only if p in min(1, p/q) and max(0, p − q) is the *processed* distribution the request would
sample from without speculation. This module turns logits into that distribution, batched, following
SGLang 0.5.23's sampler semantics:

1. penalties (optional helper :func:`apply_penalties`; the verifier also accepts already-penalized
   logits): frequency and presence subtract, then repetition scales (÷ if > 0, × if < 0);
2. grammar: tokens outside ``allowed_mask`` get probability 0;
3. temperature: softmax(logits / T); T ≤ 1e-6 or top_k = 1 means greedy (p = point mass at argmax);
4. top-k, top-p, min-p applied *jointly* to the tempered probabilities (SGLang's "joint" order):
   in descending order a token survives iff its rank < top_k, the mass strictly before it ≤ top_p, and
   its probability ≥ min_p · max; the survivors are renormalized.

Shapes: logits ``[B, ..., V]`` with per-request parameters ``[B]`` broadcast over the middle dimensions
(e.g. ``[B, K+1, V]`` for the K+1 verified positions of a chain).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

#: Temperatures at or below this are greedy (SGLang's _SAMPLING_EPS).
GREEDY_EPS = 1e-6

Scalars = float | int | Sequence[float] | Sequence[int] | torch.Tensor | None


def _param(value: Scalars, batch: int, dtype: torch.dtype, device, name: str) -> torch.Tensor | None:
    if value is None:
        return None
    t = torch.as_tensor(value, dtype=dtype, device=device)
    if t.dim() == 0:
        t = t.expand(batch).clone()
    if t.shape != (batch,):
        raise ValueError(f"{name} must be a scalar or have shape ({batch},), got {tuple(t.shape)}")
    return t


@dataclass(frozen=True)
class SamplingBatch:
    """Per-request sampling settings for a batch of ``B`` requests.

    ``temperature``: float32 ``[B]``; ≤ 1e-6 means greedy.
    ``top_k``: int64 ``[B]`` or None (off for every row); a row value ≤ 0 or ≥ V is off for that row.
    ``top_p``: float32 ``[B]`` or None; a row value ≥ 1 is off.
    ``min_p``: float32 ``[B]`` or None; 0 is off.
    """

    temperature: torch.Tensor
    top_k: torch.Tensor | None = None
    top_p: torch.Tensor | None = None
    min_p: torch.Tensor | None = None

    @classmethod
    def make(
        cls,
        batch_size: int,
        temperature: Scalars = 1.0,
        top_k: Scalars = None,
        top_p: Scalars = None,
        min_p: Scalars = None,
        device: torch.device | str = "cpu",
    ) -> SamplingBatch:
        """Build from scalars (shared by every request) or per-request sequences / tensors."""
        out = cls(
            temperature=_param(temperature, batch_size, torch.float32, device, "temperature"),
            top_k=_param(top_k, batch_size, torch.int64, device, "top_k"),
            top_p=_param(top_p, batch_size, torch.float32, device, "top_p"),
            min_p=_param(min_p, batch_size, torch.float32, device, "min_p"),
        )
        out.validate(batch_size)
        return out

    @property
    def batch_size(self) -> int:
        return self.temperature.shape[0]

    @property
    def greedy(self) -> torch.Tensor:
        """Bool ``[B]``: rows that decode by argmax."""
        g = self.temperature <= GREEDY_EPS
        if self.top_k is not None:
            g = g | (self.top_k == 1)
        return g

    def select(self, index: torch.Tensor | slice) -> SamplingBatch:
        """The settings of a subset (or reordering) of the requests."""

        def pick(t):
            return None if t is None else t[index]

        return SamplingBatch(pick(self.temperature), pick(self.top_k), pick(self.top_p), pick(self.min_p))

    def validate(self, batch_size: int, name: str = "sampling") -> None:
        if not isinstance(self.temperature, torch.Tensor) or self.temperature.shape != (batch_size,):
            raise ValueError(f"{name}.temperature must have shape ({batch_size},)")
        for field in ("top_k", "top_p", "min_p"):
            t = getattr(self, field)
            if t is not None and t.shape != (batch_size,):
                raise ValueError(f"{name}.{field} must have shape ({batch_size},), got {tuple(t.shape)}")
        if bool((self.temperature < 0).any()) or not bool(torch.isfinite(self.temperature).all()):
            raise ValueError(f"{name}.temperature must be finite and ≥ 0")
        if self.top_p is not None and bool(((self.top_p <= 0) | (self.top_p > 1)).any()):
            raise ValueError(f"{name}.top_p must be in (0, 1]")
        if self.min_p is not None and bool(((self.min_p < 0) | (self.min_p > 1)).any()):
            raise ValueError(f"{name}.min_p must be in [0, 1]")


def _rows(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Reshape a per-request ``[B]`` tensor to broadcast against ``like`` ``[B, ..., V]``."""
    return t.to(like.device).view((t.shape[0],) + (1,) * (like.dim() - 1))


def mask_logits(logits: torch.Tensor, allowed_mask: torch.Tensor | None) -> torch.Tensor:
    """float32 logits with disallowed tokens at −inf. ``allowed_mask``: bool, True = allowed,
    shape ``[B, V]`` (same mask at every position) or the full shape of ``logits``."""
    out = logits.float()
    if allowed_mask is None:
        return out
    if allowed_mask.dim() == 2 and logits.dim() > 2:
        allowed_mask = allowed_mask.view(allowed_mask.shape[0], *(1,) * (logits.dim() - 2), -1)
    return out.masked_fill(~allowed_mask, float("-inf"))


def _sorted_prefix(
    probs: torch.Tensor, width: int, top_p: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The most probable tokens in descending order (values, indices): enough of them to hold every
    token the filters can keep. Only the top ``width`` (= max top_k) can survive top-k; under top-p a
    token is dropped once the mass before it exceeds top_p, so if the top w tokens already hold more
    than top_p in every row, nothing past them survives — a partial top-w beats sorting V tokens."""
    vocab = probs.shape[-1]
    if top_p is not None:
        w = min(width, 64)
        while w < width:
            values, indices = probs.topk(w, dim=-1)
            mass = values.sum(-1)
            if bool((mass > _rows(top_p.float(), mass)).all()):
                return values, indices
            w *= 8
    if width < vocab:
        return probs.topk(width, dim=-1)
    return probs.sort(dim=-1, descending=True, stable=True)


def filter_probs(
    probs: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Joint top-k / top-p / min-p truncation of ``probs [B, ..., V]``, renormalized (float32).

    A filter that is off for every row costs nothing (SGLang hands every request a top_k and top_p,
    mostly "off"); otherwise only as many top tokens are sorted as the filters can keep.
    """
    vocab = probs.shape[-1]
    k = None
    if top_k is not None:
        k = top_k.long().to(probs.device)
        k = torch.where((k <= 0) | (k > vocab), vocab, k)
        if bool((k >= vocab).all()):
            k = None
    if top_p is not None and bool((top_p >= 1).all()):
        top_p = None
    if min_p is not None and bool((min_p <= 0).all()):
        min_p = None
    if k is None and top_p is None and min_p is None:
        return probs
    sorted_p, order = _sorted_prefix(probs.float(), int(k.max()) if k is not None else vocab, top_p)
    keep = torch.ones_like(sorted_p, dtype=torch.bool)
    if k is not None:
        keep &= torch.arange(sorted_p.shape[-1], device=probs.device) < _rows(k, probs)
    if top_p is not None:
        tp = _rows(top_p.float(), probs)
        before = sorted_p.cumsum(-1) - sorted_p
        keep &= (before <= tp) | (tp >= 1)
    if min_p is not None:
        keep &= sorted_p >= _rows(min_p.float(), probs) * sorted_p[..., :1]
    kept = torch.zeros(probs.shape, dtype=torch.float32, device=probs.device)
    kept.scatter_(-1, order, sorted_p * keep)
    return kept / kept.sum(-1, keepdim=True)


def process_logits(
    logits: torch.Tensor, sampling: SamplingBatch, allowed_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The processed sampling distribution p, float32 ``[B, ..., V]``.

    Greedy rows come out as the point mass at the argmax of the (masked) logits, so that the SD rule
    applied to them is the greedy rule.
    """
    z = mask_logits(logits, allowed_mask)
    if bool(sampling.greedy.all()):  # T = 0 batches: the point masses alone (softmax and filters unused)
        return torch.zeros_like(z).scatter_(-1, z.argmax(-1, keepdim=True), 1.0)
    greedy = _rows(sampling.greedy, z)
    temp = torch.where(greedy, 1.0, _rows(sampling.temperature, z).clamp_min(GREEDY_EPS))
    probs = torch.softmax(z / temp, dim=-1)
    probs = filter_probs(probs, sampling.top_k, sampling.top_p, sampling.min_p)
    if bool(sampling.greedy.any()):
        one_hot = torch.zeros_like(probs).scatter_(-1, z.argmax(-1, keepdim=True), 1.0)
        probs = torch.where(greedy, one_hot, probs)
    return probs


def apply_penalties(
    logits: torch.Tensor,
    draft_tokens: torch.Tensor,
    output_counts: torch.Tensor,
    *,
    frequency: torch.Tensor | None = None,
    presence: torch.Tensor | None = None,
    repetition: torch.Tensor | None = None,
) -> torch.Tensor:
    """Penalize the K+1 verified positions of a chain, each against its own history.

    ``logits``: ``[B, P, V]`` with P ≤ K+1; position i's history is the request's output so far
    (``output_counts [B, V]``, token counts) plus the draft tokens ``s_1..s_i`` before it
    (``draft_tokens [B, K]``). ``frequency``/``presence``/``repetition``: float ``[B]``.
    Returns float32 logits (a new tensor). SGLang order: additive penalties, then repetition scaling.

    This per-position rule keeps the AR law under penalties. The SGLang worker does not use it: SGLang
    folds one committed token a step into its penalty state, so the worker drafts nothing for a request
    with penalties (``target/target_logits.py``, ``drafts_allowed``) and one token a round is AR's step.
    """
    batch, positions, vocab = logits.shape
    out = logits.float().clone()
    if frequency is None and presence is None and repetition is None:
        return out
    history = torch.zeros(batch, positions, vocab, device=logits.device)
    if positions > 1:
        drafts = torch.zeros(batch, positions - 1, vocab, device=logits.device)
        drafts.scatter_(-1, draft_tokens[:, : positions - 1, None].long(), 1.0)
        history[:, 1:] = drafts.cumsum(1)
    counts = history + output_counts.float().unsqueeze(1)
    if frequency is not None:
        out -= _rows(frequency.float(), out) * counts
    if presence is not None:
        out -= _rows(presence.float(), out) * (counts > 0)
    if repetition is not None:
        scale = torch.where(counts > 0, _rows(repetition.float(), out), 1.0)
        out = torch.where(out < 0, out * scale, out / scale)
    return out
