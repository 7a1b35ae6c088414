"""Where a finished tree waits for its outcome: the speculation cache.

Requests whose q′ is sparse with at most S support entries (greedy: S = 1; ``--q-support S``) go to the
algorithm core's :class:`SpeculationCache` — a fixed tensor table keyed by (slot, k, bonus) with one
batched lookup per round. A request the table cannot hold (dense q′: [K, V] per branch would make the
table V times larger; more live requests than table slots) keeps its finished tree as its cache entry
and is looked up there; both give the same answer for the same outcome.
"""

from __future__ import annotations

import torch

from ..algo.cache import SpeculationCache
from ..algo.probs import SparseProbs
from .model import DraftModel
from .request import RequestState
from .tree import q_to_full, stack_steps


class SpecStore:
    """``k``: the deepest draft (the configured K). A tree drafts the engine's current depth (auto-K on
    the target may steer it lower) and forks on the outcomes of the speculation it follows, which a
    depth change leaves up to ``k`` long: the table holds ``k`` tokens a branch and remembers each
    slot's depth."""

    def __init__(self, model: DraftModel, k: int, budget: int, q_support: int, max_slots: int, max_bytes: int) -> None:
        self.model, self.k = model, k
        self.support = q_support if q_support > 0 else 1
        fan = max(1, budget)
        per_slot = SpeculationCache.bytes_for(1, k, fan, model.vocab_size, self.support)
        slots = max(1, min(max_slots, max_bytes // per_slot))
        self.table = SpeculationCache(slots, k, fan, model.vocab_size, support=self.support, device=model.device)
        self.depth = torch.full((slots,), k, dtype=torch.int64)  # tokens a branch of the slot's tree

    def uses_table(self, req: RequestState) -> bool:
        s = req.params.support
        return s is not None and s <= self.support and req.slot < self.table.num_slots

    def branch(self, req: RequestState, b: int, steps: int) -> tuple[torch.Tensor, torch.Tensor | SparseProbs | None]:
        """Tokens ``[steps]`` and q′ ``[steps, ·]`` (full vocabulary) of branch ``b`` of the live tree."""
        t = req.tree
        tokens = t.tokens[b, :steps].clone()
        if steps == 0:
            return tokens, None
        q = stack_steps([qs[b : b + 1] for qs in t.q[:steps]])[0]
        return tokens, q_to_full(q, self.model)

    def put(self, req: RequestState) -> None:
        """Store a finished tree (all K steps done)."""
        t = req.tree
        if not self.uses_table(req):
            return
        if t.num_branches == 0:
            self.clear(req)
            return
        q = q_to_full(stack_steps(t.q), self.model)
        slots = torch.full((t.num_branches,), req.slot, dtype=torch.int64)
        depth = t.tokens.shape[1]
        self.table.store(slots, t.fork_k, t.fork_tok, *self._pad(t.tokens, q), replace=True)
        self.depth[req.slot] = depth
        t.q = []  # the table holds them now

    def lookup(self, items: list[tuple[RequestState, int, int]]) -> list[tuple[torch.Tensor, object] | None]:
        """Finished trees only: (tokens [K], q′ [K, ·]) per (request, k, bonus), or None for a miss."""
        out: list[tuple[torch.Tensor, object] | None] = [None] * len(items)
        in_table = [i for i, (r, _, _) in enumerate(items) if self.uses_table(r)]
        if in_table:
            def col(j):
                return torch.tensor([items[i][j] if j else items[i][0].slot for i in in_table])

            found = self.table.lookup(col(0), col(1), col(2))
            for row, i in enumerate(in_table):
                if bool(found.hit[row]):
                    d = int(self.depth[items[i][0].slot])
                    out[i] = (found.tokens[row, :d].cpu(), found.q[row][:d])
        for i, (r, k, bonus) in enumerate(items):
            if not self.uses_table(r):
                b = r.tree.find(k, bonus)
                if b is not None:
                    out[i] = self.branch(r, b, r.tree.tokens.shape[1])
        return out

    def _pad(self, tokens: torch.Tensor, q):
        """A shallower tree's tokens ``[N, d]`` and q′ ``[N, d, ·]`` widened to the table's K columns
        (zeros past ``d``; the slot's depth keeps them from ever being read)."""
        n, d = tokens.shape
        if d == self.k:
            return tokens, q
        tokens = torch.cat([tokens, tokens.new_zeros(n, self.k - d)], 1)
        if isinstance(q, SparseProbs):
            pad = (n, self.k - d, q.support)
            q = SparseProbs(torch.cat([q.indices, q.indices.new_zeros(pad)], 1),
                            torch.cat([q.probs, q.probs.new_zeros(pad)], 1), q.vocab_size)  # fmt: skip
        else:
            q = torch.cat([q, q.new_zeros(n, self.k - d, q.shape[-1])], 1)
        return tokens, q

    def clear(self, req: RequestState) -> None:
        if req.slot < self.table.num_slots:
            self.table.clear([req.slot])

    def nbytes(self) -> int:
        return self.table.nbytes
