"""Pre-speculation, the draft server's work between messages (async mode; docs/ALGORITHM.md §2).

After a reply the request's tree is built in the background: the glue chain (the tokens the target
will have committed), the forks F_0..F_K chosen from the glue's logits, then K branch steps, one batched
forward per :meth:`Prespeculator.step` across all requests, so that the server answers messages between
steps. The same forward carries background prefill (prompts longer than the inline budget), at most
``prefill_chunk`` tokens a step. A finished tree goes to the speculation cache (``spec_store.py``),
where the next round's lookup finds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from .backup import ensure_capacity
from .deadline import RoundDeadline
from .drafter import PlainDrafter
from .engine_config import EngineConfig
from .fanout_plan import FanoutPlanner
from .kv_pool import PoolExhausted
from .lifetime import RequestTable
from .model import DraftModel, Span
from .request import RequestState, Stage
from .spec_store import SpecStore
from .stats import EngineStats, Timer
from .tree import glue_span, select_forks, tree_capacity


class Prespeculator:
    """The work loop over the requests of ``table``; the engine owns it and everything it is given."""

    def __init__(self, model: DraftModel, cfg: EngineConfig, k: int, budget: int, table: RequestTable,
                 drafter: PlainDrafter, planner_for: Callable[[int], FanoutPlanner], store: SpecStore,
                 stats: EngineStats, deadline: RoundDeadline, forks: int) -> None:  # fmt: skip
        self.model, self.cfg, self.k, self.budget = model, cfg, k, budget
        self.table, self.drafter, self.store, self.stats = table, drafter, store, stats
        self.deadline = deadline  # learns each branch step's duration here
        self.planner_for = planner_for  # the planner over a K'-token speculation's outcomes
        self.forks = forks  # ΣF of the trees forked from now on (≤ budget, which sizes their KV)
        self._rr = 0  # round-robin start for capped work steps

    def has_work(self) -> bool:
        return bool(self.table.prespeculating() or self.table.prefilling())

    @staticmethod
    def branch_rows(requests: list[RequestState], filling: bool) -> int | None:
        """The rows of a step over ``requests`` that only grows trees (what the deadline learns and
        predicts); None when it carries glue or prefill."""
        if filling or any(r.stage is not Stage.TREE for r in requests):
            return None
        return sum(r.tree.num_branches for r in requests)

    def holdable_rows(self) -> int | None:
        """The branch rows of the next step when it only grows trees that have a step done already (a
        round arriving instead finds them partial hits); None otherwise."""
        active = self.table.prespeculating()
        if not active or any(r.stage is Stage.TREE and r.tree.steps_done == 0 for r in active):
            return None
        return self.branch_rows(active, bool(self.table.prefilling()))

    def step(self) -> None:
        """One batched forward: pending pre-speculation (glue chains and branch steps of all requests)
        and at most ``prefill_chunk`` tokens of background prefill."""
        batch, spans = self._step_batch()
        filling, fill_spans = self._prefill_batch()
        if not batch and not filling:
            return
        branch_rows = self.branch_rows(batch, bool(filling))
        t0 = time.perf_counter()
        with Timer(self.stats, "tree_step"):
            logits = self.model.forward(spans + fill_spans)
            for r, lg in zip(batch, logits):
                if r.stage is Stage.GLUE:
                    self._fork(r, lg)
                else:
                    self._grow(r, lg)
            for r, s in zip(filling, fill_spans):
                r.kv_len += s.n
                if r.kv_len == len(r.tokens) - 1:  # context ready: pre-speculate for the pending draft
                    r.stage = Stage.GLUE
        if branch_rows:
            self.deadline.observe_step(branch_rows, time.perf_counter() - t0)
        self.stats.count("step_tokens", sum(s.n for s in spans + fill_spans))
        self.stats.count("prefill_step_tokens", sum(s.n for s in fill_spans))

    def _prefill_batch(self) -> tuple[list[RequestState], list[Span]]:
        """The next background prefill chunks, oldest request first, ``prefill_chunk`` tokens in all.
        The last committed token is left out: it is every glue chain's first row (request.py)."""
        batch, spans, room = [], [], self.cfg.prefill_chunk
        for r in self.table.prefilling():
            if room <= 0:
                break
            end = min(len(r.tokens) - 1, r.kv_len + room)
            try:  # tokens committed while prefilling may need a longer extent
                ensure_capacity(self.model, r, tree_capacity(r, self.k, self.budget))
            except PoolExhausted:
                r.stage = Stage.IDLE  # no pre-speculation; its rounds are misses from here on
                self.stats.count("pool_pressure")
                continue
            if end <= r.kv_len:
                r.stage = Stage.GLUE
                continue
            pos = torch.arange(r.kv_len, end)
            spans.append(Span(r.extent[0], torch.tensor(r.tokens[r.kv_len : end]), pos, pos, end,
                              out_rows=torch.empty(0, dtype=torch.int64)))  # fmt: skip
            batch.append(r)
            room -= end - r.kv_len
        return batch, spans

    def _step_batch(self) -> tuple[list[RequestState], list[Span]]:
        """The requests and spans of the next work step, up to ``max_step_tokens`` tokens."""
        active = self.table.prespeculating()
        if not active:
            return [], []
        # Rotate the start so a token cap never starves the same requests.
        self._rr = (self._rr + 1) % len(active)
        active = active[self._rr :] + active[: self._rr]
        batch, spans, n_tok = [], [], 0
        for r in active:
            span = self._glue_span(r) if r.stage is Stage.GLUE else self.drafter.tree_span(r)
            if span is None:
                continue
            if batch and n_tok + span.n > self.cfg.max_step_tokens:
                break
            batch.append(r)
            spans.append(span)
            n_tok += span.n
        return batch, spans

    def _glue_span(self, r: RequestState) -> Span | None:
        """The glue chain, once the extent holds the whole round; None (no pre-speculation) if it can't."""
        try:
            ensure_capacity(self.model, r, tree_capacity(r, self.k, self.budget))
        except PoolExhausted:
            r.stage = Stage.IDLE  # its next round is a miss
            self.stats.count("pool_pressure")
            return None
        return glue_span(r)

    def _fork(self, r: RequestState, glue_logits: torch.Tensor) -> None:
        # Forks cover the outcomes of the speculation the target verifies: the whole budget over its
        # K' + 1 outcomes. K' is shorter than K after a backup or a partial hit (an empty speculation
        # puts every fork after k = 0, its only outcome) and longer on the round after a depth change.
        # The branches draft the current depth.
        kp = len(r.spec)
        r.plan = self.planner_for(max(kp, self.k)).plan(after_miss=r.after_miss, k=kp, budget=self.forks)
        r.tree = select_forks(r, glue_logits, r.plan, self.model, self.k)
        r.tree.sample_plan = self.planner_for(self.k).plan(after_miss=False, budget=self.forks)
        r.stage = Stage.TREE if r.tree.num_branches else Stage.READY
        r.ready_at = None if r.tree.num_branches else time.monotonic()

    def _grow(self, r: RequestState, logits: torch.Tensor) -> None:
        self.drafter.advance_tree(r, logits)
        if r.tree.steps_done == self.k:
            self.store.put(r)
            r.stage, r.ready_at = Stage.READY, time.monotonic()
