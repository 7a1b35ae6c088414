"""The values the worker sees (:class:`Outcome`, :class:`Speculation`) and their wire form.

q′ travels in its most compact exact form: :class:`SparseProbs` when every row has at most S non-zero
entries with S small against V (truncated draft sampling, greedy point masses), dense otherwise, and
nothing at all for deterministic fast-backup tokens (point mass, ``q = None``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from msgspec import Struct

from ..algo.probs import SparseProbs
from .messages import SpecMsg
from .tensors import FrameReader, FrameWriter, WireError

#: Dense rows go sparse when their support is at most this fraction of the vocabulary
#: (a sparse entry costs 8 bytes: int32 index + float32 probability, a dense one 4).
SPARSE_FRACTION = 0.25


class Outcome(Struct, frozen=True):
    """Round T's verification result for request ``rid``: ``accepted`` = k, ``bonus`` = t*."""

    rid: str
    accepted: int
    bonus: int


@dataclass
class Speculation:
    """Round T+1's draft for ``rid``.

    ``tokens``: int64 ``[K']`` (K' ≤ K; 0 when there is nothing to propose).
    ``q``: the distributions the tokens were drawn from — :class:`SparseProbs` ``[K', S]`` or float32
    ``[K', V]`` — or None for deterministic tokens (point mass δ_x, the fast backup).
    ``hit``: the bonus was predicted by the speculation cache (no draft latency).
    ``error``: set when the server could not serve this request (unknown id, out of sync, bad outcome);
    tokens are then empty and the request should be re-opened.
    ``spec_id``: the server's id of this speculation, echoed with its outcome.
    """

    rid: str
    hit: bool
    tokens: torch.Tensor
    q: SparseProbs | torch.Tensor | None
    error: str | None = None
    spec_id: int = 0

    @property
    def ok(self) -> bool:
        return self.error is None


def compact_q(q: SparseProbs | torch.Tensor | None) -> SparseProbs | torch.Tensor | None:
    """The smaller exact form of q′: dense rows whose support is small become :class:`SparseProbs`."""
    if q is None or isinstance(q, SparseProbs) or q.numel() == 0:
        return q
    support = int((q > 0).sum(-1).max())
    if support > SPARSE_FRACTION * q.shape[-1]:
        return q
    values, indices = torch.topk(q, max(support, 1), dim=-1)
    return SparseProbs(indices, values, q.shape[-1])


def spec_to_msg(spec: Speculation, writer: FrameWriter) -> SpecMsg:
    msg = SpecMsg(rid=spec.rid, hit=spec.hit, spec_id=spec.spec_id, error=spec.error)
    msg.tokens = writer.add(spec.tokens.to(torch.int32))
    q = compact_q(spec.q)
    if isinstance(q, SparseProbs):
        msg.q_kind = "sparse"
        msg.q_indices = writer.add(q.indices.to(torch.int32))
        msg.q_probs = writer.add(q.probs.float())
        msg.vocab_size = q.vocab_size
    elif q is not None:
        msg.q_kind = "dense"
        msg.q_probs = writer.add(q.float())
        msg.vocab_size = q.shape[-1]
    return msg


def msg_to_spec(msg: SpecMsg, reader: FrameReader) -> Speculation:
    """Decode one :class:`SpecMsg`; raises :class:`WireError` when shapes disagree."""
    name = f"spec[{msg.rid}]"
    tokens = (
        reader.get(msg.tokens, f"{name}.tokens").long()
        if msg.tokens is not None
        else torch.empty(0, dtype=torch.long)
    )
    if tokens.dim() != 1:
        raise WireError("bad_message", f"{name}.tokens must be 1-D")
    k = tokens.shape[0]
    q: SparseProbs | torch.Tensor | None = None
    if msg.q_kind != "none":
        if msg.q_probs is None or msg.vocab_size <= 0:
            raise WireError("bad_message", f"{name}: q_kind {msg.q_kind} needs q_probs and vocab_size")
        probs = reader.get(msg.q_probs, f"{name}.q_probs").float()
        if msg.q_kind == "sparse":
            if msg.q_indices is None:
                raise WireError("bad_message", f"{name}: sparse q needs q_indices")
            indices = reader.get(msg.q_indices, f"{name}.q_indices").long()
            if indices.shape != probs.shape or indices.dim() != 2 or indices.shape[0] != k:
                raise WireError("bad_message", f"{name}: sparse q must be [K', S] like its indices")
            if indices.numel() and (int(indices.min()) < 0 or int(indices.max()) >= msg.vocab_size):
                raise WireError("bad_message", f"{name}: q_indices outside the vocabulary")
            q = SparseProbs(indices, probs, msg.vocab_size)
        else:
            if probs.shape != (k, msg.vocab_size):
                raise WireError("bad_message", f"{name}: dense q must be [K', V]")
            q = probs
    return Speculation(msg.rid, msg.hit, tokens, q, msg.error, msg.spec_id)
