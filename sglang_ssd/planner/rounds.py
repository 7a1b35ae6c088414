"""Tokens per round of a sweep record: the per-token α that explains them, their spread, and what
that spread costs a batch.

A batch of b requests decodes in waves (N prompts, at most b at a time): speculative rounds emit a
random number of tokens, so a wave lasts until its slowest request has its L tokens. The decode
time is therefore scaled by :func:`straggler_factor`, E[max of b round counts] / E[round count], from
the spread of tokens per round (the record's realized-k histogram ``k_hist`` for the own
prediction, the capped geometric at α for the pooled one). AR emits one token per request per step:
no stragglers.
"""

from __future__ import annotations

import math

from ..algo.fanout import acceptance_pmf
from ..algo.policy import expected_tokens


def alpha_of(rec: dict) -> float:
    """The per-token α the planner's E(α, K) should take for a record: the α at which the capped
    geometric gives the measured tokens per round (``accept_length``), when there is one. The
    record's ``alpha`` (the maximum-likelihood per-token rate) overstates E here: real accepted
    lengths are burstier than a geometric (many k = 0 rounds, a fat tail)."""
    n = rec.get("accept_length")
    K = rec.get("k")
    if n is None or not str(K).isdigit() or int(K) < 1:
        return float(rec["alpha"])
    K, n = int(K), float(n)
    if n <= 1.0:
        return 0.0
    if n >= K + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, K) < n else (lo, mid)
    return (lo + hi) / 2


def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for n = 1), by numerical integration."""
    if n <= 1:
        return 0.0
    step, total = 0.01, 0.0
    for i in range(-800, 801):
        x = i * step
        pdf = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += x * n * pdf * cdf ** (n - 1) * step
    return total


def tokens_per_round_moments(rec: dict, alpha: float | None = None) -> tuple[float, float]:
    """(mean, variance) of the tokens one request emits per round: from the record's ``k_hist``
    (realized accepted counts) unless ``alpha`` is given, else the capped geometric at α."""
    K = int(rec["k"])
    if alpha is None and rec.get("k_hist"):
        probs = {int(k) + 1: float(n) for k, n in rec["k_hist"].items()}
    else:
        pmf = acceptance_pmf(alpha_of(rec) if alpha is None else alpha, K)
        probs = {k + 1: pk for k, pk in enumerate(pmf)}
    z = sum(probs.values())
    mean = sum(x * p for x, p in probs.items()) / z
    return mean, sum((x - mean) ** 2 * p for x, p in probs.items()) / z


def straggler_factor(batch: int, tokens: int, mean: float, var: float) -> float:
    """E[max over the batch of rounds to emit ``tokens``] / E[rounds], with the round count of one
    request taken as normal (renewal theory: mean L/μ, variance L·σ²/μ³)."""
    if batch <= 1 or tokens <= 0 or var <= 0:
        return 1.0
    mu_r = tokens / mean
    return 1.0 + math.sqrt(tokens * var / mean**3) * expected_max_normal(batch) / mu_r
