"""The draft server's open requests, from ``open`` to ``close`` or idle expiry.

:class:`RequestTable` admits a request (its KV extent, cache slot, seed and sampling rows), checks what a
round or a sync draft names, records each reply as the request's pending speculation, and releases
everything a request holds when it closes. The engine (``draft/engine.py``) does the drafting.
"""

from __future__ import annotations

import random
import time

import torch
from msgspec.structs import replace

from ..wire.messages import DraftParams, OutcomeMsg
from ..wire.speculation import Speculation
from .engine_config import EngineConfig
from .kv_pool import PoolExhausted
from .level_temps import TemperatureCalibrator
from .model import DraftModel
from .request import RequestState, Stage
from .sampler import RowParams, row_params
from .spec_store import SpecStore
from .stats import EngineStats
from .tree import tree_capacity_for


class RequestError(ValueError):
    """A per-request problem (unknown id, out of sync, bad outcome); reported in that request's reply."""


def refused(rid: str, error: str) -> Speculation:
    return Speculation(rid, False, torch.empty(0, dtype=torch.int64), None, error)


class RequestTable:
    """``by_id``: the open requests. ``tau1``: the draft temperature calibrator, or None when the draft
    samples at the request's own temperature."""

    def __init__(self, model: DraftModel, cfg: EngineConfig, budget: int, store: SpecStore, stats: EngineStats,
                 tau1: TemperatureCalibrator | None) -> None:  # fmt: skip
        self.model, self.cfg, self.budget = model, cfg, budget
        self.store, self.stats, self.tau1 = store, stats, tau1
        self.by_id: dict[str, RequestState] = {}
        self._rng = random.Random()
        self._next_slot = 0
        self._free_slots: list[int] = []

    # ---- admission ------------------------------------------------------------------------------------
    def check_tokens(self, tokens: list[int], name: str) -> None:
        v = self.model.vocab_size
        if any(t >= v for t in tokens):
            raise RequestError(f"{name} has token ids ≥ the vocabulary size {v}")

    def admit(
        self, rid: str, prompt: list[int], first_token: int, params: DraftParams, owner: str
    ) -> RequestState:
        """A new request (replacing one with the same id) with its extent and slot; not yet prefilled."""
        self.check_tokens(prompt, "prompt_tokens")
        self.check_tokens([first_token], "first_token")
        # A round drafts up to K tokens past the committed context: all of it must fit the draft's
        # positions (and this bounds the prefill one request can ask for).
        limit = self.model.cfg.max_position - self.cfg.draft_k - 1
        if len(prompt) + 1 > limit:
            raise RequestError(f"prompt of {len(prompt)} tokens does not fit the draft's context: at most {limit - 1} "
                               f"(max_position {self.model.cfg.max_position} minus K + 1 drafted)")  # fmt: skip
        if rid in self.by_id:
            self.close([rid])
        if len(self.by_id) >= self.cfg.max_requests:
            raise RequestError(f"server is full ({self.cfg.max_requests} requests)")
        try:
            extent = self.model.pool.alloc(tree_capacity_for(len(prompt), self.cfg.draft_k, self.budget))
        except PoolExhausted as e:
            raise RequestError(str(e)) from None
        slot = self._free_slots.pop() if self._free_slots else self._next_slot
        self._next_slot = max(self._next_slot, slot + 1)
        seed = params.seed if params.seed is not None else self._rng.getrandbits(63)
        req = RequestState(rid, owner, slot, self._rows(params), seed, list(prompt) + [first_token], extent)
        req.draft_params = params
        self._set_tau1(req)
        self.by_id[rid] = req
        return req

    def _rows(self, params: DraftParams) -> RowParams:
        return row_params(params, self.cfg.saguaro_c, self.cfg.q_support, self.cfg.sparse_top_k)

    def _set_tau1(self, req: RequestState) -> None:
        """Pick the draft temperature multiplier for the request's next drafts (sampled requests whose
        client did not fix the draft temperature)."""
        p = req.draft_params
        if self.tau1 is None or p is None or p.draft_temperature is not None or req.params.greedy:
            return
        m = self.tau1.choose()
        req.tau1_mult = m
        req.params = self._rows(replace(p, draft_temperature=p.temperature * m))

    # ---- rounds ---------------------------------------------------------------------------------------
    def get(self, rid: str) -> RequestState:
        req = self.by_id.get(rid)
        if req is None:
            raise RequestError(f"unknown request id {rid!r} (never opened, closed, or expired)")
        return req

    def check_round(
        self, outcomes: list[OutcomeMsg], results: list
    ) -> list[tuple[int, RequestState, OutcomeMsg]]:
        """The outcomes that match their request's pending speculation, as (index, request, outcome);
        every other one gets its error reply in ``results``."""
        valid, seen = [], set()
        for i, o in enumerate(outcomes):
            try:
                if o.rid in seen:
                    raise RequestError(f"request {o.rid!r} appears twice in one round")
                seen.add(o.rid)
                req = self.get(o.rid)
                if o.spec_id is not None and o.spec_id != req.spec_id:
                    raise RequestError(
                        f"request {o.rid!r} is out of sync (outcome for speculation {o.spec_id}, "
                        f"pending is {req.spec_id}); re-open it"
                    )
                if o.accepted > len(req.spec):
                    raise RequestError(f"accepted={o.accepted} exceeds the {len(req.spec)} drafted tokens")
                self.check_tokens([o.bonus], "bonus")
            except RequestError as e:
                results[i] = refused(o.rid, str(e))
                self.stats.count("request_errors")
                continue
            req.touch()
            valid.append((i, req, o))
        return valid

    def check_draft(self, rids: list[str], results: list) -> list[tuple[int, RequestState]]:
        """The open, distinct requests of a sync draft as (index, request); the rest get error replies."""
        valid: list[tuple[int, RequestState]] = []
        for i, rid in enumerate(rids):
            req = self.by_id.get(rid)
            if req is None or rid in {r.rid for _, r in valid}:
                err = f"unknown request id {rid!r}" if req is None else f"request {rid!r} appears twice"
                results[i] = refused(rid, err)
                continue
            req.touch()
            valid.append((i, req))
        return valid

    def reply(self, req: RequestState, tokens: torch.Tensor, q, *, origin: str) -> Speculation:
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
        if req.stage is not Stage.PREFILL:  # a request still prefilling waits for its context first
            req.stage = Stage.GLUE if self.cfg.mode == "async" else Stage.IDLE
        req.replied_at, req.ready_at = time.monotonic(), None
        return Speculation(req.rid, origin == "hit", tokens, q, None, req.spec_id)

    # ---- pre-speculation ------------------------------------------------------------------------------
    def prespeculating(self) -> list[RequestState]:
        """Requests whose glue or branches still need forwards."""
        return [r for r in self.by_id.values() if r.stage in (Stage.GLUE, Stage.TREE)]

    def prefilling(self) -> list[RequestState]:
        """Requests whose context KV is still being written (oldest first)."""
        return [r for r in self.by_id.values() if r.stage is Stage.PREFILL]

    def cancel_prespeculation(self, stages: tuple[Stage, ...] = (Stage.GLUE, Stage.TREE, Stage.READY,
                                                                  Stage.PREFILL)) -> None:  # fmt: skip
        """Forget every tree in ``stages`` (their next outcome is a miss; committed KV is untouched). By
        default a prefill in progress stops too (a failing step must not repeat): its rounds are misses."""
        for r in self.by_id.values():
            if r.stage in stages:
                r.stage, r.tree = Stage.IDLE, None

    # ---- release --------------------------------------------------------------------------------------
    def close(self, rids: list[str]) -> int:
        closed = 0
        for rid in rids:
            req = self.by_id.pop(rid, None)
            if req is None:
                continue
            self.model.pool.release(*req.extent)
            self.store.clear(req)
            self._free_slots.append(req.slot)
            closed += 1
        self.stats.count("closed", closed)
        return closed

    def close_owner(self, owner: str) -> int:
        return self.close([r.rid for r in self.by_id.values() if r.owner == owner])

    def expire_idle(self, now: float) -> int:
        old = [r.rid for r in self.by_id.values() if now - r.last_active > self.cfg.idle_timeout_s]
        self.stats.count("expired", len(old))
        return self.close(old)
