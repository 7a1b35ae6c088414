"""Geometric fan-out (paper Definition 11, Theorem 12) and the online estimates it runs on.

Model: the accepted length k of a round is capped-geometric in the per-token acceptance α,
P(k) = α^k (1 − α) for k < K and P(K) = α^K; with F_k bonus guesses at fork k the miss probability is
a power law 1 − p_hit(F) = c·F^{−r} (fitted as a line on a log-log plot: slope −r, intercept log c;
the paper writes c = 1, which makes a single guess worthless — a fitted c < 1 is the miss rate of the
top-1 guess; p_hit(0) = 0). Maximizing the hit rate Σ_k P(k)(1 − c·F_k^{−r}) under Σ_k F_k = B gives
F_k ∝ P(k)^{1/(1+r)} whatever c is; the integer plan is the largest-remainder rounding of that, summing
to B exactly.

After a miss the round that follows was drafted by the backup, whose acceptance differs (a fast backup
is rarely accepted past its first token), so the planner keeps a separate α — and budget — for it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch


def acceptance_pmf(alpha: float, K: int) -> list[float]:
    """P(k), k = 0..K, of the capped-geometric accepted length."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if K < 0:
        raise ValueError(f"K must be ≥ 0, got {K}")
    return [alpha**k * (1.0 - alpha) for k in range(K)] + [alpha**K]


def largest_remainder(weights: Sequence[float], budget: int) -> list[int]:
    """Integers ≥ 0 proportional to ``weights`` summing to exactly ``budget`` (ties → earlier index)."""
    if budget < 0:
        raise ValueError(f"budget must be ≥ 0, got {budget}")
    if any(w < 0 or not math.isfinite(w) for w in weights) or not weights:
        raise ValueError("weights must be a non-empty list of finite numbers ≥ 0")
    total = sum(weights)
    if total <= 0:
        weights, total = [1.0] * len(weights), float(len(weights))
    exact = [w / total * budget for w in weights]
    out = [math.floor(x) for x in exact]
    order = sorted(range(len(exact)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[: budget - sum(out)]:
        out[i] += 1
    return out


def geometric_fanout_weights(alpha: float, r: float, K: int) -> list[float]:
    """The continuous optimum's shape, P(k)^{1/(1+r)} (unnormalized)."""
    if r < 0:
        raise ValueError(f"r must be ≥ 0, got {r}")
    return [p ** (1.0 / (1.0 + r)) for p in acceptance_pmf(alpha, K)]


def geometric_fanout(alpha: float, r: float, K: int, budget: int) -> list[int]:
    """F_0..F_K ∝ P(k)^{1/(1+r)}, rounded to integers summing to ``budget``."""
    return largest_remainder(geometric_fanout_weights(alpha, r, K), budget)


def uniform_fanout(K: int, budget: int) -> list[int]:
    """The same number of guesses at every fork (the reference default: K = 7, F = 3, B = 24)."""
    return largest_remainder([1.0] * (K + 1), budget)


def hit_probability(fanout: Sequence[float], alpha: float, r: float, c: float = 1.0) -> float:
    """Σ_k P(k)(1 − c·F_k^{−r}): the model's cache-hit rate for a plan (p_hit(F) = 0 for F < 1)."""
    pmf = acceptance_pmf(alpha, len(fanout) - 1)
    return sum(p * (1.0 - c * f ** (-r)) for p, f in zip(pmf, fanout) if f >= 1)


# ---- online estimators ---------------------------------------------------------------------------


def _as_list(x: Iterable[int] | torch.Tensor) -> list[int]:
    return x.flatten().tolist() if isinstance(x, torch.Tensor) else [int(v) for v in x]


@dataclass
class AcceptanceEstimator:
    """α from observed accepted lengths: a round with k < K is k successes and one failure, a round
    with k = K is K successes (MLE of the capped geometric). ``decay`` < 1 forgets old rounds
    geometrically (per update call); ``prior`` counts as ``prior_weight`` pseudo-trials."""

    K: int
    decay: float = 1.0
    prior: float = 0.7
    prior_weight: float = 2.0
    successes: float = 0.0
    failures: float = 0.0

    def update(self, accept_lens: Iterable[int] | torch.Tensor) -> None:
        ks = _as_list(accept_lens)
        if any(k < 0 or k > self.K for k in ks):
            raise ValueError(f"accept_lens must be in [0, {self.K}]")
        self.successes = self.decay * self.successes + sum(ks)
        self.failures = self.decay * self.failures + sum(1 for k in ks if k < self.K)

    @property
    def alpha(self) -> float:
        s = self.successes + self.prior * self.prior_weight
        return s / (s + self.failures + (1 - self.prior) * self.prior_weight)


@dataclass
class MissExponentEstimator:
    """(r, c) of 1 − p_hit(F) = c·F^{−r}, from (F used at the realized fork, hit?) per request-round.

    Fit: weighted least squares of log(miss rate) on log F over the distinct F seen (slope −r,
    intercept log c). Miss rates are smoothed (m + ½)/(n + 1) so an all-hit bucket stays finite, and
    each bucket is weighted by its inverse variance n·m/(1 − m). With fewer than two distinct F the
    slope is unknown: r stays at ``prior_r`` and c is the pooled miss rate. F = 0 (no guess: a sure
    miss) carries no information and is ignored.
    """

    decay: float = 1.0
    prior_r: float = 1.0
    prior_c: float = 1.0
    counts: dict[int, list[float]] = field(default_factory=dict)  # F -> [rounds, misses]

    def update(self, fanout: Iterable[int] | torch.Tensor, hit: Iterable[bool] | torch.Tensor) -> None:
        fs, hs = _as_list(fanout), [bool(h) for h in _as_list(hit)]
        if len(fs) != len(hs):
            raise ValueError("fanout and hit must have the same length")
        if self.decay != 1.0:
            for c in self.counts.values():
                c[0] *= self.decay
                c[1] *= self.decay
        for f, h in zip(fs, hs):
            if f >= 1:
                c = self.counts.setdefault(f, [0.0, 0.0])
                c[0] += 1
                c[1] += not h

    def fit(self) -> tuple[float, float]:
        """(r, c)."""
        pts = []
        for f, (n, misses) in self.counts.items():
            if n > 0:
                m = (misses + 0.5) / (n + 1.0)
                pts.append((math.log(f), math.log(m), n * m / max(1.0 - m, 1e-9)))
        if not pts:
            return self.prior_r, self.prior_c
        sw = sum(w for _, _, w in pts)
        mx = sum(w * x for x, _, w in pts) / sw
        my = sum(w * y for _, y, w in pts) / sw
        sxx = sum(w * (x - mx) ** 2 for x, _, w in pts)
        if sxx <= 1e-12:
            n = sum(c[0] for c in self.counts.values())
            misses = sum(c[1] for c in self.counts.values())
            return self.prior_r, min(1.0, (misses + 0.5) / (n + 1.0) * math.exp(self.prior_r * mx))
        slope = sum(w * (x - mx) * (y - my) for x, y, w in pts) / sxx
        r = max(0.0, -slope)
        return r, min(1.0, math.exp(my + r * mx))

    @property
    def r(self) -> float:
        return self.fit()[0]

    @property
    def c(self) -> float:
        return self.fit()[1]


@dataclass
class AdaptiveFanoutPlanner:
    """Per-round fan-out plan that adapts to live estimates of α and r: one plan for rounds drafted
    from a cache hit, one for rounds that follow a miss (drafted by the backup). ``mode="uniform"``
    spreads evenly. The draft server wraps it in ``draft.fanout_plan.FanoutPlanner`` (which adds a fixed
    plan from the command line)."""

    K: int
    budget: int
    miss_budget: int | None = None
    mode: Literal["geometric", "uniform"] = "geometric"
    alpha: AcceptanceEstimator | None = None
    alpha_after_miss: AcceptanceEstimator | None = None
    r: MissExponentEstimator = field(default_factory=MissExponentEstimator)

    def __post_init__(self) -> None:
        if self.mode not in ("geometric", "uniform"):
            raise ValueError(f"mode must be 'geometric' or 'uniform', got {self.mode!r}")
        if self.alpha is None:
            self.alpha = AcceptanceEstimator(self.K)
        if self.alpha_after_miss is None:
            self.alpha_after_miss = AcceptanceEstimator(self.K, prior=0.3)

    def plan(self, after_miss: bool = False, K: int | None = None, budget: int | None = None) -> list[int]:
        """F_0..F_K for the next speculation; ``K``: a speculation of another length (a backup's or a
        partial hit's can be shorter), planned from the same per-token estimates; ``budget``: ΣF for
        this plan instead of the planner's own (the draft server's share per request at its batch)."""
        K = self.K if K is None else K
        if budget is None:
            budget = self.miss_budget if after_miss and self.miss_budget is not None else self.budget
        if self.mode == "uniform":
            return uniform_fanout(K, budget)
        est = self.alpha_after_miss if after_miss else self.alpha
        return geometric_fanout(est.alpha, self.r.r, K, budget)

    def observe(
        self,
        accept_lens: Iterable[int] | torch.Tensor,
        *,
        after_miss: bool,
        fanout_at_k: Iterable[int] | torch.Tensor | None = None,
        hit: Iterable[bool] | torch.Tensor | None = None,
    ) -> None:
        """Feed one verified round: accepted lengths, and (when known) the fan-out that the plan had
        at each realized k with whether the cache then hit."""
        (self.alpha_after_miss if after_miss else self.alpha).update(accept_lens)
        if fanout_at_k is not None and hit is not None:
            self.r.update(fanout_at_k, hit)
