"""The draft's proposal q′ and its reproducible sampling.

q′ for a row = Saguaro σ_{F+1,C} applied to the request's processed distribution (draft temperature,
top-k / top-p / min-p as the target samples), optionally truncated to a top-S support (then carried as
:class:`SparseProbs`, exact). Work happens in the head vocabulary (V_sub rows of a reduced head).

Randomness is counter-based: the uniform for the token at absolute position ``pos`` of a request with
seed ``seed`` is a fixed hash of (seed, pos). A drafted token is therefore a deterministic function of
(seed, position, context), so a branch decoded inside the tree equals plain autoregressive decoding of
that branch's true context, and a neural backup on the same context yields the same tokens. Reusing a
uniform at a position whose earlier draw was discarded is harmless: a round's outcome depends only on
the draws at or before its first rejection, and those positions are never drafted again.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..algo.probs import SparseProbs, sample_proposal
from ..algo.saguaro import saguaro_probs
from ..algo.sampling_params import GREEDY_EPS, filter_probs

#: Separates the draft's stream from any other use of the same seed (e.g. the verifier's coins).
_DOMAIN = np.uint64(0x5D2AF17B3C9E0A41)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on uint64 arrays (wrap-around arithmetic is numpy's uint64 semantics)."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


#: Independent streams of the same (seed, position): the draft's own draws (0), a recursive chain's
#: acceptance coins at L1 and L0's own draws (``draft/l0.py``).
STREAM_DRAFT, STREAM_L1_COIN, STREAM_L0_DRAW = 0, 1, 2


def counter_uniforms(seed: int, positions: torch.Tensor, stream: int = STREAM_DRAFT) -> torch.Tensor:
    """float32 uniforms in [0, 1) on a 2⁻²⁴ grid, a pure function of (seed, position, stream) per element.

    ``seed``: int in [0, 2⁶³); ``positions``: int64 ``[N]`` ≥ 0. Returns float32 ``[N]`` on the CPU.
    """
    pos = positions.detach().to("cpu", torch.int64).numpy().astype(np.uint64)
    with np.errstate(over="ignore"):
        key = _splitmix64(np.array([seed], dtype=np.uint64) ^ _DOMAIN)
        if stream:
            key = _splitmix64(key ^ np.uint64(stream))
        h = _splitmix64(key ^ _splitmix64(pos))
    return torch.from_numpy((h >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / (1 << 24)))


@dataclass(frozen=True)
class RowParams:
    """How one request's draft samples. ``support`` None ⇒ dense q′; S ⇒ q′ truncated to top-S."""

    temperature: float
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    c: float = 1.0
    support: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= GREEDY_EPS or self.top_k == 1

    @property
    def filters(self) -> bool:
        return self.top_k > 0 or self.top_p < 1.0 or self.min_p > 0.0


def row_params(p, c: float, q_support: int, sparse_top_k: int) -> RowParams:
    """A request's :class:`RowParams` from its ``DraftParams`` and the server's settings: the draft
    mirrors the target's processing at its own temperature; q′ is sparse when it is truncated anyway
    (greedy, top-k ≤ ``sparse_top_k``) or when the server truncates it (``q_support`` > 0)."""
    temp = p.temperature if p.draft_temperature is None else p.draft_temperature
    support = None
    if temp <= GREEDY_EPS or p.top_k == 1:
        support = 1
    elif q_support > 0:
        support = q_support if p.top_k <= 0 else min(q_support, p.top_k)
    elif 0 < p.top_k <= sparse_top_k:
        support = p.top_k
    return RowParams(temp, p.top_k, p.top_p, p.min_p, c, support)


def proposal(logits: torch.Tensor, params: RowParams, num_top: int) -> torch.Tensor | SparseProbs:
    """q′ for rows of one request: ``logits`` float ``[N, V_head]`` ⇒ dense ``[N, V_head]`` or
    :class:`SparseProbs` ``[N, S]`` over head rows. ``num_top``: Saguaro's top set (F + 1)."""
    vocab = logits.shape[-1]
    support = None if params.support is None else min(params.support, vocab)
    if params.greedy:
        # Point mass at the argmax: C and the filters cannot change it.
        top = logits.argmax(-1, keepdim=True)
        ones = torch.ones(top.shape, dtype=torch.float32, device=logits.device)
        if support is not None:
            return SparseProbs(top, ones, vocab)
        return torch.zeros(logits.shape, dtype=torch.float32, device=logits.device).scatter_(-1, top, ones)
    c = params.c if num_top > 0 else 1.0
    num_top = min(num_top, vocab) if c < 1.0 else 0
    if support is not None:
        support = max(support, num_top)
    if not params.filters:
        if num_top == 0:
            return _plain(logits.float() / params.temperature, support, vocab)
        return saguaro_probs(logits, params.temperature, num_top=num_top, C=c, support=support)
    n = logits.shape[0]
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    probs = filter_probs(
        probs,
        torch.full((n,), params.top_k, dtype=torch.int64, device=logits.device) if params.top_k > 0 else None,
        torch.full((n,), params.top_p, device=logits.device) if params.top_p < 1.0 else None,
        torch.full((n,), params.min_p, device=logits.device) if params.min_p > 0.0 else None,
    )
    # log of the filtered distribution at temperature 1 is that distribution again under softmax.
    if num_top == 0:
        return _plain(probs.log(), support, vocab)
    return saguaro_probs(probs.log(), 1.0, num_top=num_top, C=c, support=support)


def _plain(z: torch.Tensor, support: int | None, vocab: int) -> torch.Tensor | SparseProbs:
    """softmax(z), over the top-``support`` entries only when set: σ_{F,C} with C = 1, without the
    passes over V that only matter for C < 1 (this is the hot path of a tree step at large V)."""
    if support is None:
        return torch.softmax(z, dim=-1)
    top, idx = torch.topk(z, support, dim=-1)
    return SparseProbs(idx, torch.softmax(top, dim=-1), vocab)


def sample(q: torch.Tensor | SparseProbs, seed: int, positions: torch.Tensor) -> torch.Tensor:
    """Head-row indices ``[N]`` drawn from q′ rows with the counter uniforms of (seed, positions ``[N]``)."""
    u = counter_uniforms(seed, positions).to(q.device if isinstance(q, torch.Tensor) else q.indices.device)
    return sample_proposal(q, u)


def cat_q(parts: list[torch.Tensor | SparseProbs]) -> torch.Tensor | SparseProbs:
    """Concatenate q′ chunks along dim 0 (all dense, or all sparse; sparse supports are padded)."""
    if not isinstance(parts[0], SparseProbs):
        return torch.cat(parts)
    width = max(p.support for p in parts)
    idx = [torch.nn.functional.pad(p.indices, (0, width - p.support)) for p in parts]
    val = [torch.nn.functional.pad(p.probs, (0, width - p.support)) for p in parts]
    return SparseProbs(torch.cat(idx), torch.cat(val), parts[0].vocab_size)
