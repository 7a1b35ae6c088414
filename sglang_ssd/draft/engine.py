"""The draft engine: requests, the per-round SSD loop (docs/ALGORITHM.md §2), backups, pre-speculation.

A round for a batch of outcomes v = (k, t*):
1. lookup first: the speculation cache (the finished tree) holds a branch for (k, t*) ⇒ **hit**;
   a tree still being decoded that already forked on (k, t*) ⇒ **partial hit** (its first steps are
   done; the rest is decoded for that branch alone, or the done steps are sent as they are when the
   round uses the fast backup); otherwise **miss** ⇒ backup (neural: K tokens drafted now, batched over
   the round's misses; fast: context-lookup tokens, point mass);
2. commit the accepted tokens (their KV is the glue's, already exact) and make the reply the request's
   new speculation;
3. async mode: the request is queued for pre-speculation — glue, forks, K branch steps — which
   :meth:`work_step` advances one batched forward at a time so the server can answer between steps.

No sockets here (see ``draft/server.py``); everything is driven by method calls, which is how the
exactness tests use it.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

import torch
from msgspec.structs import replace

from ..wire.messages import DraftParams, OutcomeMsg
from ..wire.settings import DraftSettings
from ..wire.speculation import Speculation
from .backup import ensure_capacity, fast_draft, neural_draft
from .kv_pool import PoolExhausted
from .l0 import L0Level
from .level_temps import TemperatureCalibrator
from .model import DraftModel, Span
from .planning import BackupChooser, FanoutPlanner
from .recursive import l0_advance_tree, l0_neural_draft, l0_tree_span
from .request import RequestState, Stage
from .sampler import row_params
from .spec_store import SpecStore
from .stats import EngineStats, Timer
from .tree import (
    advance_tree,
    glue_span,
    select_forks,
    tree_capacity,
    tree_capacity_for,
    tree_span,
)


@dataclass
class EngineConfig(DraftSettings):
    """The draft settings (wire/settings.py: K, fan-out, budget, Saguaro C, backup, mode, q-support, the
    temperatures) plus limits only this server has. The engine drafts ``draft_k`` tokens per round (K,
    AUTO_K_MAX under ``k="auto"``, at least 1). ``fanout_list``: a fixed F_0..F_K that replaces
    ``fanout``/``budget``. ``sparse_top_k``: a request whose own top-k is at most this keeps q′ sparse
    even with ``q_support`` 0."""

    fanout_list: list[int] | None = None
    sparse_top_k: int = 1024
    max_requests: int = 1024
    idle_timeout_s: float = 600.0
    prefill_chunk: int = 512
    max_step_tokens: int = 4096
    cache_mem_mb: float = 256.0


class RequestError(ValueError):
    """A per-request problem (unknown id, out of sync, bad outcome); reported in that request's reply."""


class DraftEngine:
    """``l0``: a smaller drafter for the draft model itself (recursive chain L0 → L1 → target); every
    K-token draft — tree branches and neural backups alike — is then L0-proposed and L1-verified."""

    def __init__(self, model: DraftModel, cfg: EngineConfig, l0: L0Level | None = None) -> None:
        cfg.validate()
        self.model, self.cfg, self.k, self.l0 = model, cfg, cfg.draft_k, l0
        kind = "fixed" if cfg.fanout_list is not None else cfg.fanout
        budget = sum(cfg.fanout_list) if cfg.fanout_list is not None else cfg.budget
        self.budget = budget
        self.planner = FanoutPlanner(kind, self.k, budget, cfg.fanout_list)
        self.backup = BackupChooser("neural" if cfg.mode == "sync" else cfg.backup, self.k)
        self.requests: dict[str, RequestState] = {}
        self._rng = random.Random()
        self._next_slot = 0
        self._free_slots: list[int] = []
        self._rr = 0  # round-robin start for capped work steps
        self._last_reply: float | None = None
        self._t_backup: float | None = None
        self.store = SpecStore(model, self.k, budget, cfg.q_support, cfg.max_requests, int(cfg.cache_mem_mb * (1 << 20)))
        self.stats = EngineStats()
        m = cfg.draft_temperature
        self.tau1 = None if m is None else TemperatureCalibrator(multiplier=None if m == "auto" else float(m))

    # ---- request lifetime ---------------------------------------------------------------------------
    def _check_tokens(self, tokens: list[int], name: str) -> None:
        v = self.model.vocab_size
        if any(t >= v for t in tokens):
            raise RequestError(f"{name} has token ids ≥ the vocabulary size {v}")

    def open(self, rid: str, prompt: list[int], first_token: int, params: DraftParams, owner: str = "") -> Speculation:
        """Prefill ``prompt`` and return the first speculation (a forced miss: backup-drafted)."""
        self._check_tokens(prompt, "prompt_tokens")
        self._check_tokens([first_token], "first_token")
        if rid in self.requests:
            self.close([rid])
        if len(self.requests) >= self.cfg.max_requests:
            raise RequestError(f"server is full ({self.cfg.max_requests} requests)")
        try:
            extent = self.model.pool.alloc(tree_capacity_for(len(prompt), self.k, self.budget))
        except PoolExhausted as e:
            raise RequestError(str(e)) from None
        slot = self._free_slots.pop() if self._free_slots else self._next_slot
        self._next_slot = max(self._next_slot, slot + 1)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        rp = row_params(params, self.cfg.saguaro_c, self.cfg.q_support, self.cfg.sparse_top_k)
        req = RequestState(rid, owner, slot, rp, seed, list(prompt) + [first_token], extent)
        req.draft_params = params
        self._set_tau1(req)
        self.requests[rid] = req
        try:
            with Timer(self.stats, "prefill"):
                self._prefill(req, prompt)
            req.lookup.update(req.tokens)
            kind = self.backup.choose(1)
            tokens, q = self._backups([req], kind)[0]
        except Exception:
            self.close([rid])  # never keep a half-opened request
            raise
        self.stats.count("forced_miss")
        return self._finish(req, tokens, q, origin=kind)

    def _set_tau1(self, req: RequestState) -> None:
        """Pick the draft temperature multiplier for the request's next drafts (sampled requests whose
        client did not fix the draft temperature)."""
        p = req.draft_params
        if self.tau1 is None or p is None or p.draft_temperature is not None or req.params.greedy:
            return
        m = self.tau1.choose()
        req.tau1_mult = m
        req.params = row_params(replace(p, draft_temperature=p.temperature * m), self.cfg.saguaro_c,
                                self.cfg.q_support, self.cfg.sparse_top_k)  # fmt: skip

    def _prefill(self, req: RequestState, prompt: list[int]) -> None:
        chunk = self.cfg.prefill_chunk
        for a in range(0, len(prompt), chunk):
            pos = torch.arange(a, min(a + chunk, len(prompt)))
            span = Span(req.extent[0], torch.tensor(prompt[a : a + chunk]), pos, pos, int(pos[-1]) + 1,
                        out_rows=torch.empty(0, dtype=torch.int64))  # fmt: skip
            self.model.forward([span])
        req.kv_len = len(prompt)

    def close(self, rids: list[str]) -> int:
        closed = 0
        for rid in rids:
            req = self.requests.pop(rid, None)
            if req is None:
                continue
            self.model.pool.release(*req.extent)
            self.store.clear(req)
            self._free_slots.append(req.slot)
            closed += 1
        self.stats.count("closed", closed)
        return closed

    def close_owner(self, owner: str) -> int:
        return self.close([r.rid for r in self.requests.values() if r.owner == owner])

    def expire_idle(self, now: float) -> int:
        old = [r.rid for r in self.requests.values() if now - r.last_active > self.cfg.idle_timeout_s]
        self.stats.count("expired", len(old))
        return self.close(old)

    # ---- rounds ---------------------------------------------------------------------------------------
    def _get(self, rid: str) -> RequestState:
        req = self.requests.get(rid)
        if req is None:
            raise RequestError(f"unknown request id {rid!r} (never opened, closed, or expired)")
        return req

    def round(self, outcomes: list[OutcomeMsg]) -> list[Speculation]:
        """Answer round T's outcomes with round T+1's speculations (same order)."""
        results: list[Speculation | None] = [None] * len(outcomes)
        valid: list[tuple[int, RequestState, OutcomeMsg]] = []
        seen: set[str] = set()
        for i, o in enumerate(outcomes):
            try:
                if o.rid in seen:
                    raise RequestError(f"request {o.rid!r} appears twice in one round")
                seen.add(o.rid)
                req = self._get(o.rid)
                if o.spec_id is not None and o.spec_id != req.spec_id:
                    raise RequestError(
                        f"request {o.rid!r} is out of sync (outcome for speculation {o.spec_id}, "
                        f"pending is {req.spec_id}); re-open it"
                    )
                if o.accepted > len(req.spec):
                    raise RequestError(f"accepted={o.accepted} exceeds the {len(req.spec)} drafted tokens")
                self._check_tokens([o.bonus], "bonus")
            except RequestError as e:
                results[i] = Speculation(o.rid, False, torch.empty(0, dtype=torch.int64), None, str(e))
                self.stats.count("request_errors")
                continue
            req.touch()
            valid.append((i, req, o))
        kind = self.backup.choose(len(valid))
        t_arrive = time.monotonic()
        ready, partial, missed = [], [], []
        # Lookups first: hits are answered from the cache before any backup work starts.
        with Timer(self.stats, "lookup"):
            for i, req, o in valid:
                if req.stage is Stage.READY:
                    ready.append((i, req, o))
                    continue
                b = req.tree.find(o.accepted, o.bonus) if req.stage is Stage.TREE else None
                (missed if b is None else partial).append((i, req, o) if b is None else (i, req, o, b))
            found = self.store.lookup([(req, o.accepted, o.bonus) for _, req, o in ready])
            hits = []
            for (i, req, o), f in zip(ready, found):
                (missed if f is None else hits).append((i, req, o) if f is None else (i, req, o, f))
            for _i, req, o, *_ in hits + partial:
                self._observe(req, o, True)
            for _i, req, o in missed:
                self._observe(req, o, False)
            self._observe_policy(valid, t_arrive)
            for i, req, o, (tokens, q) in hits:
                self._commit(req, o)
                results[i] = self._finish(req, tokens, q, origin="hit")
        self.stats.count("hits", len(hits))
        if partial:
            self._serve_partial(partial, kind, results)
        for _, req, o in missed:
            self._commit(req, o)
        t0 = time.monotonic()
        drafts = self._backups([req for _, req, _ in missed], kind)
        self._t_backup = time.monotonic() - t0 if missed else None
        for (i, req, _), (tokens, q) in zip(missed, drafts):
            results[i] = self._finish(req, tokens, q, origin=kind)
        self.stats.count("misses", len(missed))
        self._last_reply = time.monotonic()
        return results

    def _observe_policy(self, valid, now: float) -> None:
        """Feed the backup policy: what the speculations verified this round came from and yielded."""
        origins = [(req.spec_origin, o.accepted + 1, req) for _, req, o in valid]
        from_hit = [n for origin, n, _ in origins if origin == "hit"]
        from_backup = [(origin, n) for origin, n, _ in origins if origin != "hit"]
        kinds = [origin for origin, _ in from_backup]
        t_spec = [(r.ready_at or now) - r.replied_at for _, _, r in origins if r.replied_at]
        self.backup.observe(
            hits=len(from_hit),
            requests=len(origins),
            tokens_hit=float(sum(from_hit)),
            tokens_miss=float(sum(n for _, n in from_backup)),
            backup=max(set(kinds), key=kinds.count) if kinds else None,
            t_verify=now - self._last_reply if self._last_reply else None,
            t_spec=sum(t_spec) / len(t_spec) if t_spec else None,
            t_backup=self._t_backup,
        )

    def draft(self, rids: list[str]) -> list[Speculation]:
        """Synchronous drafting: K tokens now from each request's committed context."""
        results: list[Speculation | None] = [None] * len(rids)
        reqs = []
        for i, rid in enumerate(rids):
            req = self.requests.get(rid)
            if req is None or rid in {r.rid for _, r in reqs}:
                err = f"unknown request id {rid!r}" if req is None else f"request {rid!r} appears twice"
                results[i] = Speculation(rid, False, torch.empty(0, dtype=torch.int64), None, err)
                continue
            req.touch()
            reqs.append((i, req))
        drafts = self._backups([r for _, r in reqs], "neural")
        for (i, req), (tokens, q) in zip(reqs, drafts):
            results[i] = self._finish(req, tokens, q, origin="neural")
        self.stats.count("sync_drafts", len(reqs))
        return results

    def _observe(self, req: RequestState, o: OutcomeMsg, hit: bool) -> None:
        if self.tau1 is not None:
            self.tau1.observe(req.spec_tau1, o.accepted, len(req.spec))
        plan = req.plan
        fan = None
        if plan and req.stage in (Stage.TREE, Stage.READY):
            fan = plan[o.accepted] if o.accepted < len(req.spec) else plan[-1]
        self.planner.observe(o.accepted, len(req.spec), after_miss=req.after_miss, fanout=fan, hit=hit)
        # Realized k and hits per k: what the fan-out plan is judged against (bench/README.md).
        self.stats.count(f"outcome_k{o.accepted}")
        self.stats.count(f"hit_k{o.accepted}", int(hit))
        if fan is not None:
            self.stats.count(f"fanout_k{o.accepted}", fan)
        self.stats.count("accepted_tokens", o.accepted)
        self.stats.count("drafted_tokens", len(req.spec))

    def _commit(self, req: RequestState, o: OutcomeMsg) -> None:
        glued = req.stage in (Stage.TREE, Stage.READY)
        req.tokens += req.spec[: o.accepted] + [o.bonus]
        if glued:
            # Glue rows up to r0 + k (last token, s_1..s_k) hold exactly the committed context's KV.
            req.kv_len = len(req.tokens) - 1
        req.lookup.update(req.tokens)

    def _finish(self, req: RequestState, tokens: torch.Tensor, q, *, origin: str) -> Speculation:
        """Make ``tokens`` the pending speculation and queue its pre-speculation.
        ``origin``: "hit" (from the speculation cache) or the backup that drafted it."""
        req.spec = tokens.tolist()
        req.spec_id += 1
        req.spec_tau1 = req.tau1_mult  # the multiplier these tokens were drafted with
        req.spec_params = req.params
        self._set_tau1(req)  # and the one the next tree (and backup) will use
        req.spec_origin = origin
        self.store.clear(req)  # whatever was cached belongs to the previous context
        req.after_miss = origin != "hit"
        req.tree = None
        req.stage = Stage.GLUE if self.cfg.mode == "async" else Stage.IDLE
        req.replied_at, req.ready_at = time.monotonic(), None
        return Speculation(req.rid, origin == "hit", tokens, q, None, req.spec_id)

    def cached(self, req: RequestState, b: int) -> tuple[torch.Tensor, object]:
        """Branch ``b`` of the request's finished tree as the speculation cache holds it."""
        t = req.tree
        found = self.store.lookup([(req, int(t.fork_k[b]), int(t.fork_tok[b]))])[0]
        if found is None:
            raise KeyError(f"branch {b} of {req.rid!r} is not in the speculation cache")
        return found

    def _serve_partial(self, partial, kind: str, results) -> None:
        """Hits on a tree still in progress: finish the one branch, or send the done steps (fast)."""
        finishing = []
        for i, req, o, b in partial:
            done = req.tree.steps_done
            if kind == "fast" and done > 0:
                tokens, q = self.store.branch(req, b, done)
                self._commit(req, o)
                results[i] = self._finish(req, tokens, q, origin="hit")
            elif kind == "fast":
                self._commit(req, o)
                tokens, q = self._backups([req], "fast")[0]
                results[i] = self._finish(req, tokens, q, origin="fast")
                self.stats.count("misses")
                continue
            else:
                req.tree = req.tree.only(b)
                finishing.append((i, req, o))
            self.stats.count("partial_hits")
            self.stats.count("hits")
        with Timer(self.stats, "partial_finish"):
            while True:
                todo = [req for _, req, _ in finishing if req.tree.steps_done < self.k]
                if not todo:
                    break
                logits = self.model.forward([self._tree_span(r) for r in todo])
                for r, lg in zip(todo, logits):
                    self._advance_tree(r, lg)
        for i, req, o in finishing:
            tokens, q = self.store.branch(req, 0, self.k)
            self._commit(req, o)
            results[i] = self._finish(req, tokens, q, origin="hit")

    # ---- backups --------------------------------------------------------------------------------------
    def _backups(self, reqs: list[RequestState], kind: str) -> list[tuple[torch.Tensor, object]]:
        """Backup drafts in the order of ``reqs``; a request whose KV cannot grow gets the fast one."""
        out: list = [None] * len(reqs)
        neural = []
        for i, r in enumerate(reqs):
            if kind == "neural":
                try:
                    ensure_capacity(self.model, r, len(r.tokens) + self.k + 1)
                    neural.append(i)
                    continue
                except PoolExhausted:
                    self.stats.count("pool_pressure")
            out[i] = fast_draft([r], self.k)[0]
        self.stats.count("backup_fast", len(reqs) - len(neural))
        if neural:
            self.stats.count("backup_neural", len(neural))
            # These tokens will be verified as a speculation drafted by a backup: fork them as such.
            plan = self.planner.plan(after_miss=True)
            with Timer(self.stats, "backup_neural"):
                chosen = [reqs[i] for i in neural]
                if self.l0 is None:
                    drafts = neural_draft(self.model, chosen, self.k, plan, self.cfg.saguaro_c)
                else:
                    drafts = l0_neural_draft(self.model, chosen, self.k, plan, self.cfg.saguaro_c, self.l0, self.stats)
            for i, d in zip(neural, drafts):
                out[i] = d
        return out

    # ---- pre-speculation ------------------------------------------------------------------------------
    def _tree_span(self, r: RequestState):
        return tree_span(r) if self.l0 is None else l0_tree_span(r, self.l0, self.model, self.k)

    def _advance_tree(self, r: RequestState, logits: torch.Tensor) -> None:
        if self.l0 is None:
            advance_tree(r, logits, self.model, self.cfg.saguaro_c)
        else:
            l0_advance_tree(r, logits, self.model, self.l0, self.k, self.cfg.saguaro_c, self.stats)

    def cancel_prespeculation(self) -> None:
        """Forget every tree in progress (their next outcome is a miss; committed KV is untouched)."""
        for r in self.requests.values():
            if r.stage in (Stage.GLUE, Stage.TREE, Stage.READY):
                r.stage, r.tree = Stage.IDLE, None

    def has_work(self) -> bool:
        return any(r.stage in (Stage.GLUE, Stage.TREE) for r in self.requests.values())

    def work_step(self) -> None:
        """One batched forward of pending pre-speculation (glue chains and branch steps of all requests)."""
        active = [r for r in self.requests.values() if r.stage in (Stage.GLUE, Stage.TREE)]
        if not active:
            return
        # Rotate the start so a token cap never starves the same requests.
        self._rr = (self._rr + 1) % len(active)
        active = active[self._rr :] + active[: self._rr]
        batch, spans, n_tok = [], [], 0
        for r in active:
            if r.stage is Stage.GLUE:
                try:
                    ensure_capacity(self.model, r, tree_capacity(r, self.k, self.budget))
                except PoolExhausted:
                    r.stage = Stage.IDLE  # no pre-speculation: its next round is a miss
                    self.stats.count("pool_pressure")
                    continue
                span = glue_span(r)
            else:
                span = self._tree_span(r)
            if batch and n_tok + span.n > self.cfg.max_step_tokens:
                break
            batch.append(r)
            spans.append(span)
            n_tok += span.n
        if not batch:
            return
        with Timer(self.stats, "tree_step"):
            logits = self.model.forward(spans)
            for r, lg in zip(batch, logits):
                if r.stage is Stage.GLUE:
                    r.plan = self.planner.plan(after_miss=r.after_miss)
                    r.tree = select_forks(r, lg, r.plan, self.model, self.k)
                    r.tree.sample_plan = self.planner.plan(after_miss=False)
                    r.stage = Stage.TREE if r.tree.num_branches else Stage.READY
                    r.ready_at = None if r.tree.num_branches else time.monotonic()
                else:
                    self._advance_tree(r, lg)
                    if r.tree.steps_done == self.k:
                        self.store.put(r)
                        r.stage, r.ready_at = Stage.READY, time.monotonic()
        self.stats.count("step_tokens", n_tok)
