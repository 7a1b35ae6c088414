"""The target worker's link to its draft server(s): per-request speculation, faults absorbed.

Requests are spread over the draft servers by a stable hash of their id (draft data-parallel). A
server that times out or dies is marked down: its requests continue without speculation (plain
verification of the bonus alone), and after `RETRY_S` the link pings it; once it answers, requests
are re-opened with their full committed context and speculation resumes. Nothing here can make the
output inexact: a speculation is only a proposal, verified against the target.
"""

from __future__ import annotations

import logging
import os
import time
import zlib
from dataclasses import dataclass, field

from sglang_ssd.target.ssd_config import SSDConfig
from sglang_ssd.wire.client import DraftClient, DraftUnavailable
from sglang_ssd.wire.messages import DraftParams
from sglang_ssd.wire.speculation import Outcome, Speculation

logger = logging.getLogger(__name__)

RETRY_S = 2.0


@dataclass
class LinkCounters:
    rounds: int = 0
    hits: int = 0
    misses: int = 0
    speculated: int = 0  # requests that got a non-empty speculation
    unspeculated: int = 0  # requests verified without a draft (server down, error)
    fast_backups: int = 0  # deterministic (point-mass) speculations among misses
    faults: int = 0
    reconnects: int = 0
    round_seconds: float = 0.0  # waited for round replies
    round_trip_seconds: float = 0.0  # post to reply collected (overlapped with the scheduler when posted)
    extra: dict = field(default_factory=dict)


# Prompt tokens per open message (a longer prompt goes alone): one prefill chunk of the draft server,
# so no single reply waits on more than about one draft forward over that many tokens, whatever the
# draft's size, and --ssd-draft-timeout keeps its meaning under a burst of new requests.
OPEN_TOKENS_PER_MESSAGE = 512


class DraftLink:
    def __init__(self, config: SSDConfig):
        if not config.draft_endpoints:
            raise ValueError("SSD needs at least one draft endpoint (SGLANG_SSD_CONFIG.draft_endpoints)")
        self.config = config
        self.clients = [DraftClient(ep, timeout_s=config.draft_timeout_s) for ep in config.draft_endpoints]
        self.down_since: list[float | None] = [None] * len(self.clients)
        self.last_try: list[float] = [0.0] * len(self.clients)
        self.opened: set[str] = set()
        self.counters = LinkCounters()
        self._tickets: dict[int, int] = {}  # server index -> posted round awaiting collection
        self._early: dict[str, Speculation] = {}
        self._t_post = 0.0

    def shard(self, rid: str) -> int:
        return zlib.crc32(rid.encode()) % len(self.clients)

    def _usable(self, i: int) -> bool:
        if self.down_since[i] is None:
            return True
        now = time.monotonic()
        if now - self.last_try[i] < RETRY_S:
            return False
        self.last_try[i] = now
        if self.clients[i].ping(timeout_s=min(1.0, self.config.draft_timeout_s)):
            logger.info("draft server %s is back", self.config.draft_endpoints[i])
            self.down_since[i] = None
            self.counters.reconnects += 1
            return True
        return False

    def _fault(self, i: int, err: Exception) -> None:
        if self.down_since[i] is None:
            logger.warning("draft server %s unavailable (%s): continuing without speculation",
                           self.config.draft_endpoints[i], err)
            self.down_since[i] = time.monotonic()
            self.last_try[i] = time.monotonic()
        self.counters.faults += 1
        # The server lost (or may lose) state for every request it had: re-open them when it is back.
        self.opened = {rid for rid in self.opened if self.shard(rid) != i}

    def _record(self, specs: list[Speculation]) -> None:
        for s in specs:
            if not s.ok or len(s.tokens) == 0:
                self.counters.unspeculated += 1
                continue
            self.counters.speculated += 1
            if s.hit:
                self.counters.hits += 1
            else:
                self.counters.misses += 1
                if s.q is None:
                    self.counters.fast_backups += 1

    def is_open(self, rid: str) -> bool:
        return rid in self.opened

    def open(self, rid: str, context: list[int], last_token: int, params: DraftParams) -> Speculation | None:
        """Start `rid` (context = every committed token before `last_token`); None if unavailable."""
        i = self.shard(rid)
        if not self._usable(i):
            return None
        try:
            spec = self.clients[i].open(rid, context, last_token, params)
        except DraftUnavailable as e:
            self._fault(i, e)
            return None
        self.opened.add(rid)
        self._record([spec])
        return spec

    def open_many(self, opens: list[tuple[str, list[int], int, DraftParams]]) -> list[Speculation | None]:
        """``open`` for several requests (rid, context, last token, params): one message per draft server.
        None for a request whose server is unavailable; a refused one comes back with ``error`` set and
        stays unopened, so the worker opens it again at its next step."""
        out: list[Speculation | None] = [None] * len(opens)
        groups: dict[int, list[list[int]]] = {}
        for j, o in enumerate(opens):
            messages = groups.setdefault(self.shard(o[0]), [[]])
            if messages[-1] and sum(len(opens[m][1]) for m in messages[-1]) + len(o[1]) > OPEN_TOKENS_PER_MESSAGE:
                messages.append([])
            messages[-1].append(j)
        for i, members in ((i, m) for i, messages in groups.items() for m in messages):
            if not self._usable(i):
                continue
            try:
                specs = self.clients[i].open_many([opens[j] for j in members])
            except DraftUnavailable as e:
                self._fault(i, e)
                continue
            self._record(specs)
            for j, spec in zip(members, specs):
                out[j] = spec
                if spec.error is None:
                    self.opened.add(spec.rid)
        return out

    def post(self, outcomes: list[Outcome], depth: int | None = None, budget: int | None = None) -> None:
        """Send the outcomes now and return at once; :meth:`collect` gets the replies later. ``depth``
        and ``budget``: the K and ΣF of the draft servers' next trees (auto-K; None: their own).

        The worker posts at the end of its step and collects at the start of the next, so the round
        trip (and any wait for the draft server to finish the tree step it is in) overlaps the
        scheduler's own work between steps instead of adding to the step."""
        self.collect_into(self._early)  # at most one round in flight per server
        self._t_post = time.perf_counter()
        groups: dict[int, list[Outcome]] = {}
        for o in outcomes:
            if o.rid in self.opened:
                groups.setdefault(self.shard(o.rid), []).append(o)
        for i, group in groups.items():
            if not self._usable(i):
                continue
            try:
                self._tickets[i] = self.clients[i].post_round(group, depth, budget)
            except DraftUnavailable as e:
                self._fault(i, e)
        if self._tickets:
            os.sched_yield()

    def collect(self) -> dict[str, Speculation]:
        """The speculations answering the posted round (empty when nothing is in flight)."""
        out, self._early = self._early, {}
        self.collect_into(out)
        return out

    def collect_into(self, out: dict[str, Speculation]) -> None:
        if not self._tickets:
            return
        t0 = time.perf_counter()
        tickets, self._tickets = self._tickets, {}
        for i, ticket in tickets.items():
            try:
                specs = self.clients[i].collect_round(ticket)
            except DraftUnavailable as e:
                self._fault(i, e)
                continue
            self._record(specs)
            for s in specs:
                if s.ok:
                    out[s.rid] = s
                else:
                    self.opened.discard(s.rid)  # out of sync or unknown: re-open next step
        t1 = time.perf_counter()
        self.counters.rounds += 1
        self.counters.round_seconds += t1 - t0  # time actually waited for replies
        self.counters.round_trip_seconds += t1 - self._t_post

    def close(self, rid: str, *, wait: bool = True) -> None:
        """Free ``rid`` on its draft server; ``wait=False`` sends the close and returns at once."""
        if rid not in self.opened:
            return
        self.opened.discard(rid)
        i = self.shard(rid)
        if self.down_since[i] is not None:
            return
        try:
            self.clients[i].close(rid, wait=wait)
        except DraftUnavailable as e:
            self._fault(i, e)

    def server_counters(self) -> dict[str, int]:
        """The draft servers' own integer counters (hits, misses, outcomes and hits per realized k,
        backups, ...), summed over the servers that answer."""
        out: dict[str, int] = {}
        for i, client in enumerate(self.clients):
            if self.down_since[i] is not None:
                continue
            try:
                stats = client.stats()
            except DraftUnavailable:
                continue
            for key, value in stats.items():
                if isinstance(value, int) and not isinstance(value, bool):
                    out[key] = out.get(key, 0) + value
        return out

    def stats(self) -> dict:
        c = self.counters
        looked_up = c.hits + c.misses
        out = {
            "ssd_link_rounds": c.rounds,  # rounds that talked to a draft server (none while parked)
            "ssd_hit_rate": c.hits / looked_up if looked_up else 0.0,
            "ssd_backup_rate": c.misses / looked_up if looked_up else 0.0,
            "ssd_fast_backup_rate": c.fast_backups / looked_up if looked_up else 0.0,
            "ssd_unspeculated": c.unspeculated,
            "ssd_faults": c.faults,
            "ssd_reconnects": c.reconnects,
            "ssd_round_ms": 1000 * c.round_seconds / c.rounds if c.rounds else 0.0,
            "ssd_round_trip_ms": 1000 * c.round_trip_seconds / c.rounds if c.rounds else 0.0,
            "ssd_draft_servers_up": sum(d is None for d in self.down_since),
        }
        return out
