"""SSD counters: per-round statistics of the worker, exported to /server_info and /metrics."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sglang_ssd.hooks import register_once

logger = logging.getLogger(__name__)

_WORKERS: list = []


def register_worker(worker) -> None:
    _WORKERS.append(worker)


def alpha(accepted: int, rejected: int) -> float:
    """Per-token acceptance α, the capped-geometric MLE: accepted / (accepted + rejections). A round
    that accepts all K drafts says only that α is high, a rejection ends a chain: this is what the
    planner's E(α, K) takes (``accepted / drafted`` is smaller)."""
    return accepted / (accepted + rejected) if accepted + rejected else 0.0


# The counters of `snapshot` that `window` differences.
WINDOW_COUNTERS = ("ssd_rounds", "ssd_drafted", "ssd_accepted", "ssd_rejected", "ssd_emitted", "ssd_hits",
                   "ssd_lookups")  # fmt: skip


def window(before: dict, after: dict) -> dict:
    """α, accepted fraction, cache hit rate and tokens per round over a measured window: the counters
    of two `snapshot`s (e.g. from `/server_info`) differenced, so a warm-up before it does not count.
    Empty when no SSD round ran in the window."""
    d = {k: after.get(k, 0) - before.get(k, 0) for k in WINDOW_COUNTERS}
    if not d["ssd_rounds"]:
        return {}
    return {
        "rounds": d["ssd_rounds"],
        "alpha": alpha(d["ssd_accepted"], d["ssd_rejected"]),
        "accepted_fraction": d["ssd_accepted"] / d["ssd_drafted"] if d["ssd_drafted"] else 0.0,
        "hit_rate": d["ssd_hits"] / d["ssd_lookups"] if d["ssd_lookups"] else 0.0,
        "lookups": d["ssd_lookups"],
        "tokens_per_round": d["ssd_emitted"] / d["ssd_rounds"],
    }


@dataclass
class SSDStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    rejected: int = 0  # request-rounds that stopped at a rejection (k < drafted)
    emitted: int = 0
    verify_s: float = 0.0
    link_s: float = 0.0  # SSD's own per-round work: collect wait, stacking, posting
    open_s: float = 0.0  # opening requests on the draft server (once per request)
    math_s: float = 0.0  # exact verification, KV bookkeeping, logprobs after the forward
    total_s: float = 0.0
    # Rounds whose every speculation was a cache hit: their link time is the pure SSD overhead
    # (lookup + round trip + bookkeeping); a miss adds the backup's drafting to the wait.
    hit_rounds: int = 0
    hit_link_s: float = 0.0
    hit_verify_s: float = 0.0
    # Forward time by the width d of the chain the forward ran (index d; K + 1 whenever anything was
    # drafted, shorter speculations padded to it; 1 for a plain step). A fixed-K verify step is judged
    # on its full-width rounds: the mean over all rounds mixes in the plain steps.
    width_rounds: list[int] = field(default_factory=list)
    width_verify_s: list[float] = field(default_factory=list)
    # The same forwards in the scheduler thread's CPU time, which leaves out time the thread spent off
    # a core (on a small machine the draft server and SGLang's other processes compete for them).
    width_verify_cpu_s: list[float] = field(default_factory=list)

    def record_round(self, *, num_draft: list[int], accepted: list[int], verify_s: float, link_s: float,
                     total_s: float, width: int, open_s: float = 0.0, math_s: float = 0.0, all_hits: bool = False,
                     verify_cpu_s: float = 0.0) -> None:
        self.rounds += 1
        self.drafted += sum(num_draft)
        self.accepted += sum(accepted)
        self.rejected += sum(1 for a, d in zip(accepted, num_draft) if a < d)
        self.emitted += sum(accepted) + len(accepted)
        self.verify_s += verify_s
        self.link_s += link_s
        self.open_s += open_s
        if all_hits:
            self.hit_rounds += 1
            self.hit_link_s += link_s
            self.hit_verify_s += verify_s
        self.math_s += math_s
        self.total_s += total_s
        missing = width + 1 - len(self.width_rounds)
        if missing > 0:
            self.width_rounds += [0] * missing
            self.width_verify_s += [0.0] * missing
            self.width_verify_cpu_s += [0.0] * missing
        self.width_rounds[width] += 1
        self.width_verify_s[width] += verify_s
        self.width_verify_cpu_s[width] += verify_cpu_s

    def summary(self) -> dict:
        r = max(self.rounds, 1)
        return {
            "ssd_alpha": alpha(self.accepted, self.rejected),
            "ssd_accepted_fraction": self.accepted / self.drafted if self.drafted else 0.0,
            "ssd_verify_ms": 1000 * self.verify_s / r,
            "ssd_link_ms": 1000 * self.link_s / r,
            "ssd_open_ms": 1000 * self.open_s / r,
            "ssd_math_ms": 1000 * self.math_s / r,
            "ssd_step_ms": 1000 * self.total_s / r,
        }


def snapshot(*, draft_servers: bool = False) -> dict:
    """Merged statistics of the SSD workers in this process; ``draft_servers`` adds the draft servers'
    counters under ``ssd_draft_server`` (one stats call per server)."""
    out: dict = {}
    for w in _WORKERS:
        out.update(w.stats.summary())
        out.update(ssd_drafted=w.stats.drafted, ssd_accepted=w.stats.accepted,
                   ssd_rejected=w.stats.rejected, ssd_emitted=w.stats.emitted,
                   ssd_verify_s=w.stats.verify_s, ssd_link_s=w.stats.link_s,
                   ssd_open_s=w.stats.open_s, ssd_math_s=w.stats.math_s, ssd_total_s=w.stats.total_s,
                   ssd_hit_rounds=w.stats.hit_rounds, ssd_hit_link_s=w.stats.hit_link_s,
                   ssd_hit_verify_s=w.stats.hit_verify_s, ssd_width_rounds=list(w.stats.width_rounds),
                   ssd_width_verify_s=list(w.stats.width_verify_s),
                   ssd_width_verify_cpu_s=list(w.stats.width_verify_cpu_s))
        out["ssd_rounds"] = w.stats.rounds  # worker rounds (verify steps)
        timers = getattr(w, "module_timers", None)  # the per-part diagnostic (module_timers.py), when on
        if timers is not None:
            out.update(timers.snapshot())
        out["ssd_k"] = w.k
        out["ssd_budget"] = w.config.budget
        out["ssd_mode"] = w.config.mode
        if w.auto_k is not None:
            out.update(w.auto_k.snapshot())
        if w.link is None:  # a non-source tensor-parallel rank: the source reports the link
            continue
        out.update(w.link.stats())
        c = w.link.counters
        out.update(ssd_hits=c.hits, ssd_lookups=c.hits + c.misses, ssd_fast_backups=c.fast_backups)
        if draft_servers:
            out["ssd_draft_server"] = w.link.server_counters()
    return out


# ---- exporters ------------------------------------------------------------------------------------
INTERNAL_STATE_TARGET = (
    "sglang.srt.managers.scheduler_components.internal_state.SchedulerInternalStateController._add_speculative"
)


def add_to_internal_state(result, controller, state, *args, **kwargs):
    """AFTER hook: SSD counters appear in `/server_info` → `internal_states[i]`. A failure here is
    logged and reported in the state, never raised: it would take the scheduler down."""
    try:
        state.update(snapshot(draft_servers=True))
    except Exception as e:  # noqa: BLE001 - metrics must not kill serving
        logger.exception("SSD metrics snapshot failed")
        state["ssd_metrics_error"] = f"{type(e).__name__}: {e}"
    return result


_GAUGES: dict = {}


def export_prometheus() -> None:
    """Set `sglang:ssd_*` gauges (scraped from `/metrics` when the server runs with --enable-metrics)."""
    try:
        from prometheus_client import Gauge
    except ImportError:
        return
    for name, value in snapshot().items():
        if not isinstance(value, int | float):
            continue
        gauge = _GAUGES.get(name)
        if gauge is None:
            gauge = Gauge(f"sglang:{name}", f"SSD: {name.removeprefix('ssd_').replace('_', ' ')}",
                          multiprocess_mode="mostrecent")
            _GAUGES[name] = gauge
        gauge.set(value)


def register_hooks() -> None:
    register_once(INTERNAL_STATE_TARGET, add_to_internal_state, "AFTER")
