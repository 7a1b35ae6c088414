"""The speculation cache: (request slot, k, bonus token) → (K draft tokens, the q′ they came from).

While round T is verified, the draft server pre-speculates round T+1 for every likely outcome
v = (k, t*): for each fork k it branches on F_k candidate bonus tokens and decodes K tokens per branch.
When v arrives, one batched lookup answers every request: hit ⇒ reply with the cached tokens and q′ at
once; miss ⇒ the backup drafts.

Storage is a fixed set of tensors (bounded memory, allocated once), one row per request slot:
``keys [slots, K+1, F_max]`` (bonus token or −1), ``tokens [slots, K+1, F_max, K]`` and q′ either
sparse (``[.., K, S]`` indices + probs — the exact q′ of a draft that samples from its top-S tokens) or
dense (``[.., K, V]``). Storing a slot's new speculation replaces the old one; finishing or preempting
a request clears its slot.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .probs import SparseProbs


@dataclass(frozen=True)
class CacheLookup:
    """Per request: ``hit [B]`` bool; ``tokens [B, K]`` int64 and ``q`` (``[B, K, V]`` dense or
    :class:`SparseProbs` ``[B, K, S]``) — meaningful only where ``hit``."""

    hit: torch.Tensor
    tokens: torch.Tensor
    q: torch.Tensor | SparseProbs


def _dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def bytes_per_round(
    K: int,
    vocab_size: int,
    support: int | None = None,
    *,
    prob_dtype: torch.dtype = torch.float32,
    index_dtype: torch.dtype = torch.int32,
    token_dtype: torch.dtype = torch.int32,
) -> dict[str, int]:
    """Bytes of one request's reply per round (K draft tokens + q′), for each wire form of q′.

    ``dense``: K·V probabilities. ``sparse``: K·S (index, probability) pairs — only available (and
    exact) when the draft samples from its top-``support`` tokens; ``point``: a deterministic proposal,
    tokens only.
    """
    tokens = K * _dtype_bytes(token_dtype)
    out = {
        "dense": tokens + K * vocab_size * _dtype_bytes(prob_dtype),
        "point": tokens,
    }
    if support is not None:
        out["sparse"] = tokens + K * support * (_dtype_bytes(index_dtype) + _dtype_bytes(prob_dtype))
    return out


class SpeculationCache:
    """Tensor table of pre-speculated continuations for up to ``num_slots`` live requests.

    ``K``: draft tokens per round; ``max_fanout``: bonus candidates per fork (F_max ≥ every F_k);
    ``support``: S for sparse q′ (None ⇒ dense ``[K, V]`` q′ per branch); ``max_bytes``: refuse to
    allocate more than this.
    """

    def __init__(
        self,
        num_slots: int,
        K: int,
        max_fanout: int,
        vocab_size: int,
        *,
        support: int | None = None,
        prob_dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        max_bytes: int | None = None,
    ) -> None:
        if min(num_slots, K, max_fanout, vocab_size) < 1:
            raise ValueError("num_slots, K, max_fanout and vocab_size must be ≥ 1")
        if support is not None and not 1 <= support <= vocab_size:
            raise ValueError(f"support must be in [1, {vocab_size}], got {support}")
        self.num_slots, self.K, self.max_fanout, self.vocab_size = num_slots, K, max_fanout, vocab_size
        self.support = support
        self.device = torch.device(device)
        need = self.bytes_for(num_slots, K, max_fanout, vocab_size, support, prob_dtype)
        if max_bytes is not None and need > max_bytes:
            raise ValueError(
                f"a speculation cache of {num_slots} slots needs {need} bytes > max_bytes = {max_bytes}"
            )
        shape = (num_slots, K + 1, max_fanout)
        self.keys = torch.full(shape, -1, dtype=torch.int64, device=self.device)
        self.tokens = torch.zeros(*shape, K, dtype=torch.int32, device=self.device)
        if support is None:
            self.q_dense = torch.zeros(*shape, K, vocab_size, dtype=prob_dtype, device=self.device)
        else:
            self.q_indices = torch.zeros(*shape, K, support, dtype=torch.int32, device=self.device)
            self.q_probs = torch.zeros(*shape, K, support, dtype=prob_dtype, device=self.device)

    @staticmethod
    def bytes_for(num_slots, K, max_fanout, vocab_size, support=None, prob_dtype=torch.float32) -> int:
        """Memory of a cache with these dimensions."""
        branches = num_slots * (K + 1) * max_fanout
        per_branch = 8 + 4 * K
        p = _dtype_bytes(prob_dtype)
        per_branch += K * vocab_size * p if support is None else K * support * (4 + p)
        return branches * per_branch

    @property
    def nbytes(self) -> int:
        tensors = [self.keys, self.tokens]
        tensors += [self.q_dense] if self.support is None else [self.q_indices, self.q_probs]
        return sum(t.numel() * t.element_size() for t in tensors)

    # ---- writes ---------------------------------------------------------------------------------
    def clear(self, slots: torch.Tensor | int | list[int]) -> None:
        """Forget everything speculated for these request slots (request finished, preempted, or
        about to store a new round)."""
        self.keys[torch.as_tensor(slots, dtype=torch.long, device=self.device)] = -1

    def store(
        self,
        slots: torch.Tensor,
        k: torch.Tensor,
        bonus: torch.Tensor,
        tokens: torch.Tensor,
        q: torch.Tensor | SparseProbs,
        *,
        replace: bool = True,
    ) -> None:
        """Store N branches at once. ``replace``: the slots involved drop what they held before (a
        new round); False appends to it (a round stored in several calls).

        ``slots``, ``k``, ``bonus``: int ``[N]`` (branch n speculates outcome (k[n], bonus[n]) of the
        request in ``slots[n]``); ``tokens``: int ``[N, K]``; ``q``: ``[N, K, V]`` or SparseProbs
        ``[N, K, S]`` (dense q′ is compacted to the cache's support — it must fit exactly).
        """
        dev = self.device
        slots, k, bonus = (t.to(dev).long() for t in (slots, k, bonus))
        n = slots.shape[0]
        if k.shape != (n,) or bonus.shape != (n,):
            raise ValueError(f"slots, k and bonus must all have shape ({n},)")
        if tuple(tokens.shape) != (n, self.K):
            raise ValueError(f"tokens must have shape {(n, self.K)}, got {tuple(tokens.shape)}")
        if n and (int(slots.min()) < 0 or int(slots.max()) >= self.num_slots):
            raise ValueError(f"slots must be in [0, {self.num_slots})")
        if n and (int(k.min()) < 0 or int(k.max()) > self.K):
            raise ValueError(f"k must be in [0, {self.K}]")
        if n and (int(bonus.min()) < 0 or int(bonus.max()) >= self.vocab_size):
            raise ValueError(f"bonus must be a token id in [0, {self.vocab_size})")
        q = self._to_form(q, n)
        if replace:
            self.clear(slots.unique())
        if n == 0:
            return
        # Position of each branch among the branches of its (slot, k): rank within its group.
        group = slots * (self.K + 1) + k
        order = torch.sort(group, stable=True).indices
        sorted_group = group[order]
        first = torch.searchsorted(sorted_group, sorted_group)
        pos = torch.empty_like(group)
        pos[order] = torch.arange(n, device=dev) - first
        if not replace:
            pos += (self.keys[slots, k] >= 0).sum(-1)
        if int(pos.max()) >= self.max_fanout:
            raise ValueError(f"more than max_fanout = {self.max_fanout} branches for one (slot, k)")
        self.keys[slots, k, pos] = bonus
        self.tokens[slots, k, pos] = tokens.to(dev, torch.int32)
        if self.support is None:
            self.q_dense[slots, k, pos] = q.to(dev, self.q_dense.dtype)
        else:
            self.q_indices[slots, k, pos] = q.indices.to(dev, torch.int32)
            self.q_probs[slots, k, pos] = q.probs.to(dev, self.q_probs.dtype)

    def _to_form(self, q: torch.Tensor | SparseProbs, n: int) -> torch.Tensor | SparseProbs:
        if isinstance(q, SparseProbs):
            if tuple(q.shape) != (n, self.K) or q.vocab_size != self.vocab_size:
                raise ValueError(f"q must cover [N, K] = {(n, self.K)} over V = {self.vocab_size}")
            if self.support is None:
                return q.to_dense()
            if q.support > self.support:
                return SparseProbs.from_dense(q.to_dense(), self.support)
            if q.support < self.support:  # pad with zero-probability entries
                pad = self.support - q.support
                return SparseProbs(
                    torch.cat([q.indices, q.indices.new_zeros(n, self.K, pad)], -1),
                    torch.cat([q.probs, q.probs.new_zeros(n, self.K, pad)], -1),
                    self.vocab_size,
                )
            return q
        if tuple(q.shape) != (n, self.K, self.vocab_size) or not q.dtype.is_floating_point:
            raise ValueError(f"q must be a float tensor of shape {(n, self.K, self.vocab_size)}")
        return q if self.support is None else SparseProbs.from_dense(q, self.support)

    # ---- reads ----------------------------------------------------------------------------------
    def lookup(self, slots: torch.Tensor, k: torch.Tensor, bonus: torch.Tensor) -> CacheLookup:
        """Batched lookup of verification outcomes (k, bonus) for the requests in ``slots`` (``[B]``)."""
        dev = self.device
        slots, k, bonus = (t.to(dev).long() for t in (slots, k, bonus))
        if not (slots.shape == k.shape == bonus.shape) or slots.dim() != 1:
            raise ValueError("slots, k and bonus must be 1-D tensors of the same length")
        if slots.numel() and (int(slots.min()) < 0 or int(slots.max()) >= self.num_slots):
            raise ValueError(f"slots must be in [0, {self.num_slots})")
        if k.numel() and (int(k.min()) < 0 or int(k.max()) > self.K):
            raise ValueError(f"k must be in [0, {self.K}]")
        match = (self.keys[slots, k] == bonus[:, None]) & (bonus[:, None] >= 0)  # [B, F_max]
        hit = match.any(1)
        j = match.int().argmax(1)
        tokens = self.tokens[slots, k, j].long()
        if self.support is None:
            q = self.q_dense[slots, k, j]
        else:
            q = SparseProbs(self.q_indices[slots, k, j], self.q_probs[slots, k, j], self.vocab_size)
        return CacheLookup(hit, tokens, q)
