"""The target worker's link to its draft server(s): per-request speculation, faults absorbed.

Requests are spread over the draft servers by a stable hash of their id (draft data-parallel). A
server that times out or dies is marked down: its requests continue without speculation (plain
verification of the bonus alone), and after `RETRY_S` the link pings it; once it answers, requests
are re-opened with their full committed context and speculation resumes. Nothing here can make the
output inexact: a speculation is only a proposal, verified against the target.
"""

from __future__ import annotations

import logging
import time
import zlib
from dataclasses import dataclass, field

from sglang_ssd.sglang.config import SSDConfig
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
    round_seconds: float = 0.0
    extra: dict = field(default_factory=dict)


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

    def round(self, outcomes: list[Outcome]) -> dict[str, Speculation]:
        """Send the outcomes of opened requests; returns the next speculation per request id."""
        t0 = time.perf_counter()
        groups: dict[int, list[Outcome]] = {}
        for o in outcomes:
            if o.rid in self.opened:
                groups.setdefault(self.shard(o.rid), []).append(o)
        out: dict[str, Speculation] = {}
        for i, group in groups.items():
            if not self._usable(i):
                continue
            try:
                specs = self.clients[i].round(group)
            except DraftUnavailable as e:
                self._fault(i, e)
                continue
            self._record(specs)
            for s in specs:
                if s.ok:
                    out[s.rid] = s
                else:
                    self.opened.discard(s.rid)  # out of sync or unknown: re-open next step
        self.counters.rounds += 1
        self.counters.round_seconds += time.perf_counter() - t0
        return out

    def close(self, rid: str) -> None:
        if rid not in self.opened:
            return
        self.opened.discard(rid)
        i = self.shard(rid)
        if self.down_since[i] is not None:
            return
        try:
            self.clients[i].close(rid)
        except DraftUnavailable as e:
            self._fault(i, e)

    def stats(self) -> dict:
        c = self.counters
        looked_up = c.hits + c.misses
        out = {
            "ssd_rounds": c.rounds,
            "ssd_hit_rate": c.hits / looked_up if looked_up else 0.0,
            "ssd_backup_rate": c.misses / looked_up if looked_up else 0.0,
            "ssd_fast_backup_rate": c.fast_backups / looked_up if looked_up else 0.0,
            "ssd_unspeculated": c.unspeculated,
            "ssd_faults": c.faults,
            "ssd_reconnects": c.reconnects,
            "ssd_round_ms": 1000 * c.round_seconds / c.rounds if c.rounds else 0.0,
            "ssd_draft_servers_up": sum(d is None for d in self.down_since),
        }
        return out
