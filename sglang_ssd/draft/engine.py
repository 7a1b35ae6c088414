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
   :meth:`work_step` advances one batched forward at a time so the server can answer between steps
   (``draft/prespeculation.py``).

The settings are ``EngineConfig`` (``draft/engine_config.py``, also importable from here), the open
requests and their bookkeeping live in ``draft/lifetime.py``, the way K tokens are drafted (the draft
model alone, or L0 → L1) in ``draft/drafter.py``. No sockets here (see ``draft/server.py``);
everything is driven by method calls, which is how the exactness tests use it.
"""

from __future__ import annotations

import time

from ..wire.messages import DraftParams, Open, OutcomeMsg
from ..wire.speculation import Speculation
from .backup import Draft, ensure_capacity, fast_draft
from .deadline import RoundDeadline
from .drafter import make_drafter
from .engine_config import EngineConfig
from .fanout_plan import BackupChooser, FanoutPlanner, fold_plan
from .kv_pool import PoolExhausted
from .l0 import L0Level
from .level_temps import TemperatureCalibrator
from .lifetime import RequestError, RequestTable, refused
from .model import DraftModel
from .prespeculation import Prespeculator
from .request import RequestState, Stage
from .spec_store import SpecStore
from .stats import EngineStats, Timer

Entry = tuple[int, RequestState, OutcomeMsg]  # (index in the round, request, its outcome)
Hit = tuple[int, RequestState, OutcomeMsg, Draft]  # ... and the cached draft
Partial = tuple[int, RequestState, OutcomeMsg, int]  # ... and its branch in the tree in progress


class DraftEngine:
    """``l0``: a smaller drafter for the draft model itself (recursive chain L0 → L1 → target); every
    K-token draft — tree branches and neural backups alike — is then L0-proposed and L1-verified
    (:class:`~.drafter.TwoLevelDrafter`, chosen here once)."""

    def __init__(self, model: DraftModel, cfg: EngineConfig, l0: L0Level | None = None) -> None:
        cfg.validate()
        self.model, self.cfg, self.l0 = model, cfg, l0
        self.budget = sum(cfg.fanout_list) if cfg.fanout_list is not None else cfg.budget
        self.backup = BackupChooser("neural" if cfg.mode == "sync" else cfg.backup, cfg.draft_k)
        self.stats = EngineStats()
        m = cfg.draft_temperature
        self.tau1 = None if m is None else TemperatureCalibrator(multiplier=None if m == "auto" else float(m))
        self._planners: dict[int, FanoutPlanner] = {}  # per depth: each keeps its own live estimates
        self.store = SpecStore(model, cfg.draft_k, self.budget, cfg.q_support, cfg.max_requests,
                               int(cfg.cache_mem_mb * (1 << 20)))  # fmt: skip
        self.table = RequestTable(model, cfg, self.budget, self.store, self.stats, self.tau1)
        self.deadline = RoundDeadline()
        self._use_depth(cfg.draft_k, forks=self.budget)
        self._last_reply: float | None = None
        self._t_backup: float | None = None

    # ---- the draft depth ----------------------------------------------------------------------------
    def planner_for(self, k: int) -> FanoutPlanner:
        """The fan-out planner over the outcomes of a ``k``-token speculation."""
        if k not in self._planners:
            kind = "fixed" if self.cfg.fanout_list is not None else self.cfg.fanout
            self._planners[k] = FanoutPlanner(kind, k, self.budget, fold_plan(self.cfg.fanout_list, k))
        return self._planners[k]

    @property
    def forks(self) -> int:
        """ΣF of each next tree: the budget, or less where the target asked for less (:meth:`set_budget`)."""
        return self.prespec.forks

    def _use_depth(self, k: int, forks: int) -> None:
        """Draft ``k`` tokens a round, ``forks`` branches a tree: the planner, drafter and work loop."""
        self.k, self.planner = k, self.planner_for(k)
        self.drafter = make_drafter(self.model, k, self.cfg.saguaro_c, self.l0, self.stats)
        self.prespec = Prespeculator(self.model, self.cfg, k, self.budget, self.table, self.drafter,
                                     self.planner_for, self.store, self.stats, self.deadline, forks)  # fmt: skip

    def set_depth(self, k: int) -> None:
        """Draft ``k`` tokens a round from the next tree on (the target's auto-K steers it, 1 ≤ k ≤ the
        configured K). Called after a round's replies, when the round's requests have not forked yet;
        trees other requests finished or began at the old depth are dropped (their next round is a
        miss), so every cached branch has the new depth. Shorter drafts are exact by construction."""
        k = max(1, min(int(k), self.cfg.draft_k))
        if k == self.k:
            return
        self.table.cancel_prespeculation((Stage.TREE, Stage.READY))  # glue not yet forked: kept
        self._use_depth(k, self.forks)
        self.stats.count("depth_changes")

    def set_budget(self, forks: int) -> None:
        """Fork ``forks`` branches per request (ΣF, 1 ≤ forks ≤ the configured budget) from the next
        trees on: the target's auto-K shrinks the tree as its batch grows, so that the batch's trees
        still fit beside a verify step. Trees already forked keep theirs; any plan is exact. A fan-out
        list given on the command line stays as given."""
        forks = max(1, min(int(forks), self.budget))
        if forks != self.forks and self.cfg.fanout_list is None:
            self.prespec.forks = forks
            self.stats.count("budget_changes")

    @property
    def requests(self) -> dict[str, RequestState]:
        return self.table.by_id

    # ---- request lifetime ---------------------------------------------------------------------------
    def open(
        self, rid: str, prompt: list[int], first_token: int, params: DraftParams, owner: str = ""
    ) -> Speculation:
        """Prefill ``prompt`` and return the first speculation (a forced miss: backup-drafted)."""
        req = self.table.admit(rid, prompt, first_token, params, owner)
        return self._open_admitted([(req, prompt)])[0]

    def open_many(self, opens: list[Open], owner: str = "") -> list[Speculation]:
        """Several requests from one message, prefilled together. One that cannot be admitted, or whose
        prompt would take this message past ``max_open_tokens`` prompt tokens, gets its own error reply
        (the client opens it again in a later message): no message makes the server prefill more,
        except a single request, whose own bound is the draft's context."""
        results: list[Speculation | None] = [None] * len(opens)
        admitted: list[tuple[int, RequestState, list[int]]] = []
        budget = self.cfg.max_open_tokens
        for i, o in enumerate(opens):
            try:
                if admitted and len(o.prompt_tokens) > budget:
                    raise RequestError(f"this message already carries {self.cfg.max_open_tokens - budget} prompt "
                                       f"tokens; {len(o.prompt_tokens)} more exceed max_open_tokens = "
                                       f"{self.cfg.max_open_tokens}: open it in another message")  # fmt: skip
                req = self.table.admit(o.rid, o.prompt_tokens, o.first_token, o.params, owner)
            except RequestError as e:
                self.stats.count("request_errors")
                results[i] = refused(o.rid, str(e))
                continue
            budget -= len(o.prompt_tokens)
            admitted.append((i, req, o.prompt_tokens))
        specs = self._open_admitted([(req, prompt) for _, req, prompt in admitted]) if admitted else []
        for (i, _, _), spec in zip(admitted, specs):
            results[i] = spec
        return results

    def _open_admitted(self, started: list[tuple[RequestState, list[int]]]) -> list[Speculation]:
        """Short prompts (up to ``inline_prefill_tokens`` in all, in message order) are prefilled now and
        answered with a backup draft; in async mode the rest are answered at once and prefilled in the
        background, so that no message makes the other requests wait on a long prefill."""
        if self.cfg.mode != "async":
            return self._start(started)
        inline, background, budget = [], [], self.cfg.inline_prefill_tokens
        for req, prompt in started:
            if len(prompt) <= budget:
                budget -= len(prompt)
                inline.append((req, prompt))
            else:
                background.append(req)
        specs = dict(zip((req.rid for req, _ in inline), self._start(inline) if inline else []))
        for req in background:
            specs[req.rid] = self._start_background(req)
        return [specs[req.rid] for req, _ in started]

    def _start_background(self, req: RequestState) -> Speculation:
        """Queue the request's prefill for the work loop; until its context is ready its rounds are
        answered by the fast backup (n-gram lookup in its own context: no KV needed)."""
        req.stage, req.kv_len = Stage.PREFILL, 0
        req.lookup.update(req.tokens)
        self.stats.count("background_prefills")
        self.stats.count("forced_miss")
        tokens, q = fast_draft([req], self.k)[0]
        return self.table.reply(req, tokens, q, origin="fast")

    def _start(self, started: list[tuple[RequestState, list[int]]]) -> list[Speculation]:
        """Prefill admitted requests and answer each with its first draft, from the backup (a forced
        miss: nothing was speculated for it yet). On any failure none of them stays half-opened."""
        reqs = [req for req, _ in started]
        try:
            with Timer(self.stats, "prefill"):
                self._prefill(started)
            for req in reqs:
                req.lookup.update(req.tokens)
            kind = self.backup.choose(len(reqs))
            drafts = self._backups(reqs, kind)
        except Exception:
            self.close([req.rid for req in reqs])
            raise
        self.stats.count("forced_miss", len(reqs))
        return [self.table.reply(req, tokens, q, origin=kind) for req, (tokens, q) in zip(reqs, drafts)]

    def _prefill(self, started: list[tuple[RequestState, list[int]]]) -> None:
        self.model.prefill([(req.extent[0], prompt) for req, prompt in started], self.cfg.prefill_chunk)
        for req, prompt in started:
            req.kv_len = len(prompt)

    def close(self, rids: list[str]) -> int:
        return self.table.close(rids)

    def close_owner(self, owner: str) -> int:
        return self.table.close_owner(owner)

    def expire_idle(self, now: float) -> int:
        return self.table.expire_idle(now)

    # ---- rounds ---------------------------------------------------------------------------------------
    def round(self, outcomes: list[OutcomeMsg], depth: int | None = None,
              budget: int | None = None) -> list[Speculation]:
        """Answer round T's outcomes with round T+1's speculations (same order); ``depth``: the K the
        target will verify, drafted from the next trees on (:meth:`set_depth`); ``budget``: their ΣF
        per request (:meth:`set_budget`)."""
        results: list[Speculation | None] = [None] * len(outcomes)
        valid = self.table.check_round(outcomes, results)
        valid = self._serve_prefilling(valid, results)
        kind = self.backup.choose(len(valid))
        t_arrive = time.monotonic()
        if self._last_reply is not None and valid:
            self.deadline.observe_gap(t_arrive - self._last_reply)
        # Lookups first: hits are answered from the cache before any backup work starts.
        with Timer(self.stats, "lookup"):
            hits, partial, missed = self._lookup(valid)
            self._observe_round(valid, hits + partial, missed, t_arrive)
            for i, req, o, (tokens, q) in hits:
                req.commit(o.accepted, o.bonus)
                results[i] = self.table.reply(req, tokens, q, origin="hit")
        self.stats.count("hits", len(hits))
        if partial:
            self._serve_partial(partial, kind, results)
        self._serve_misses(missed, kind, results)
        self._last_reply = time.monotonic()
        if depth is not None:
            self.set_depth(depth)
        if budget is not None:
            self.set_budget(budget)
        return results

    def _serve_prefilling(self, valid: list[Entry], results: list) -> list[Entry]:
        """Requests whose context is still being prefilled: commit the outcome (the new tokens join
        what is left to prefill) and answer from the fast backup. Returns the other entries."""
        rest = []
        for i, req, o in valid:
            if req.stage is not Stage.PREFILL:
                rest.append((i, req, o))
                continue
            req.commit(o.accepted, o.bonus)
            tokens, q = fast_draft([req], self.k)[0]
            results[i] = self.table.reply(req, tokens, q, origin="fast")
            self.stats.count("prefilling_rounds")
        return rest

    def _lookup(self, valid: list[Entry]) -> tuple[list[Hit], list[Partial], list[Entry]]:
        """Sort the round: finished trees holding the outcome (hits), trees in progress that forked on
        it (partial hits), and the rest (misses)."""
        ready, partial, missed = [], [], []
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
        return hits, partial, missed

    def _observe_round(self, valid: list[Entry], found: list, missed: list[Entry], now: float) -> None:
        next_hits: dict[str, tuple[int, int]] = {}  # per origin of the verified speculation: its tree's lookups
        for entries, hit in ((found, True), (missed, False)):
            for _i, req, o, *_ in entries:
                self._observe(req, o, hit)
                h, n = next_hits.get(req.spec_origin, (0, 0))
                next_hits[req.spec_origin] = (h + hit, n + 1)
        self._observe_policy(valid, now, next_hits)

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

    def _observe_policy(self, valid: list[Entry], now: float, next_hits: dict[str, tuple[int, int]]) -> None:
        """Feed the backup policy: what the speculations verified this round came from and yielded, and
        how the lookups of the trees that followed them went."""
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
            next_hits=next_hits,
        )

    def _serve_partial(self, partial: list[Partial], kind: str, results: list) -> None:
        """Hits on a tree still in progress: finish the one branch, or send the done steps (fast)."""
        finishing = []
        for i, req, o, b in partial:
            done = req.tree.steps_done
            if kind == "fast" and done == 0:  # nothing decoded yet: answered as a miss
                req.commit(o.accepted, o.bonus)
                tokens, q = self._backups([req], "fast")[0]
                results[i] = self.table.reply(req, tokens, q, origin="fast")
                self.stats.count("misses")
                continue
            if kind == "fast":
                tokens, q = self.store.branch(req, b, done)
                req.commit(o.accepted, o.bonus)
                results[i] = self.table.reply(req, tokens, q, origin="hit")
            else:
                req.tree = req.tree.only(b)
                finishing.append((i, req, o))
            self.stats.count("partial_hits")
            self.stats.count("hits")
        with Timer(self.stats, "partial_finish"):
            self._finish_trees([req for _, req, _ in finishing])
        for i, req, o in finishing:
            tokens, q = self.store.branch(req, 0, self.k)
            req.commit(o.accepted, o.bonus)
            results[i] = self.table.reply(req, tokens, q, origin="hit")

    def _finish_trees(self, reqs: list[RequestState]) -> None:
        """Decode the remaining steps of these (single-branch) trees, batched."""
        while True:
            todo = [r for r in reqs if r.tree.steps_done < self.k]
            if not todo:
                break
            logits = self.model.forward([self.drafter.tree_span(r) for r in todo])
            for r, lg in zip(todo, logits):
                self.drafter.advance_tree(r, lg)

    def _serve_misses(self, missed: list[Entry], kind: str, results: list) -> None:
        for _, req, o in missed:
            req.commit(o.accepted, o.bonus)
        t0 = time.monotonic()
        drafts = self._backups([req for _, req, _ in missed], kind)
        self._t_backup = time.monotonic() - t0 if missed else None
        for (i, req, _), (tokens, q) in zip(missed, drafts):
            results[i] = self.table.reply(req, tokens, q, origin=kind)
        self.stats.count("misses", len(missed))

    def draft(self, rids: list[str]) -> list[Speculation]:
        """Synchronous drafting: K tokens now from each request's committed context."""
        results: list[Speculation | None] = [None] * len(rids)
        reqs = self.table.check_draft(rids, results)
        drafts = self._backups([r for _, r in reqs], "neural")
        for (i, req), (tokens, q) in zip(reqs, drafts):
            results[i] = self.table.reply(req, tokens, q, origin="neural")
        self.stats.count("sync_drafts", len(reqs))
        return results

    def cached(self, req: RequestState, b: int) -> Draft:
        """Branch ``b`` of the request's finished tree as the speculation cache holds it."""
        t = req.tree
        found = self.store.lookup([(req, int(t.fork_k[b]), int(t.fork_tok[b]))])[0]
        if found is None:
            raise KeyError(f"branch {b} of {req.rid!r} is not in the speculation cache")
        return found

    # ---- backups --------------------------------------------------------------------------------------
    def _backups(self, reqs: list[RequestState], kind: str) -> list[Draft]:
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
            plan = self.planner.plan(after_miss=True, budget=self.forks)
            with Timer(self.stats, "backup_neural"):
                drafts = self.drafter.chains([reqs[i] for i in neural], plan)
            for i, d in zip(neural, drafts):
                out[i] = d
        return out

    # ---- pre-speculation (draft/prespeculation.py) ----------------------------------------------------
    def cancel_prespeculation(self) -> None:
        """Forget every tree in progress (their next outcome is a miss; committed KV is untouched)."""
        self.table.cancel_prespeculation()

    def has_work(self) -> bool:
        return self.prespec.has_work()

    def hold_s(self) -> float:
        """Seconds to wait for the next round before the next work step, which would still be running
        when the round is due (``draft/deadline.py``); 0: step now."""
        if not self.cfg.step_deadline:
            return 0.0
        rows = self.prespec.holdable_rows()
        return 0.0 if rows is None else self.deadline.hold_s(time.monotonic(), self._last_reply, rows)

    def work_step(self) -> None:
        """One batched forward of pre-speculation and background prefill (``Prespeculator.step``)."""
        self.prespec.step()
