"""Decode rates (output tokens/s, all requests of a batch together) from per-round costs in ms.

The same formulas as ``sglang_ssd.algo.policy`` (paper Theorem 7, Corollary 9, Theorem 17), with the
latencies in milliseconds instead of units of one verification, so that a verification whose cost
grows with the number of tokens it checks (T_v(K+1) > T_v(1), as on a CPU) is priced as such:

- AR:  b / T_v(1)
- SD:  b · E(α, K) / (T_v(K+1) + K·T_draft + overhead)
- SSD: b · [p_hit·E_hit + (1 − p_hit)·E_miss] / (max(T_v(K+1), T_tree) + (1 − p_hit^b)·T_backup + overhead)

b = requests per batch. E(α, K) = (1 − α^{K+1})/(1 − α) tokens per round, bonus included. In SSD a
batch waits for its slowest request, so it stalls for the backup whenever at least one request misses
(probability 1 − p_hit^b; at b = 1 that is 1 − p_hit); each request still emits its own E_hit or E_miss.
``overhead`` = per-round lookup and communication. Rates are × 1000 (ms → s).
"""

from __future__ import annotations

import math


def _positive(name: str, x: float) -> None:
    if not (math.isfinite(x) and x > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {x}")


def _non_negative(name: str, x: float) -> None:
    if not (math.isfinite(x) and x >= 0):
        raise ValueError(f"{name} must be a finite number ≥ 0, got {x}")


def _batch(batch: int) -> None:
    if int(batch) != batch or batch < 1:
        raise ValueError(f"batch must be an integer ≥ 1, got {batch}")


def ar_rate(t_verify1_ms: float, batch: int = 1) -> float:
    """tokens/s of plain decoding: one token per request per target forward."""
    _positive("t_verify1_ms", t_verify1_ms)
    _batch(batch)
    return 1000.0 * batch / t_verify1_ms


def sd_rate(
    tokens_per_round: float,
    t_verify_ms: float,
    t_draft_ms: float,
    K: int,
    overhead_ms: float = 0.0,
    batch: int = 1,
) -> float:
    """tokens/s of synchronous SD: ``t_verify_ms`` = T_v(K+1), ``t_draft_ms`` = one draft step."""
    _positive("tokens_per_round", tokens_per_round)
    _positive("t_verify_ms", t_verify_ms)
    _non_negative("t_draft_ms", t_draft_ms)
    _non_negative("overhead_ms", overhead_ms)
    _batch(batch)
    if K < 0:
        raise ValueError(f"K must be ≥ 0, got {K}")
    return 1000.0 * batch * tokens_per_round / (t_verify_ms + K * t_draft_ms + overhead_ms)


def ssd_round_ms(
    p_hit: float,
    t_verify_ms: float,
    t_tree_ms: float,
    t_backup_ms: float,
    overhead_ms: float = 0.0,
    batch: int = 1,
) -> float:
    """Expected round time: verification and pre-speculation overlap; a miss anywhere adds the backup."""
    if not 0.0 <= p_hit <= 1.0:
        raise ValueError(f"p_hit must be in [0, 1], got {p_hit}")
    _positive("t_verify_ms", t_verify_ms)
    _non_negative("t_tree_ms", t_tree_ms)
    _non_negative("t_backup_ms", t_backup_ms)
    _non_negative("overhead_ms", overhead_ms)
    _batch(batch)
    return max(t_verify_ms, t_tree_ms) + (1.0 - p_hit**batch) * t_backup_ms + overhead_ms


def ssd_rate(
    p_hit: float,
    e_hit: float,
    e_miss: float,
    t_verify_ms: float,
    t_tree_ms: float,
    t_backup_ms: float,
    overhead_ms: float = 0.0,
    batch: int = 1,
) -> float:
    """tokens/s of SSD (formula in the module docstring)."""
    _positive("e_hit", e_hit)
    _positive("e_miss", e_miss)
    round_ms = ssd_round_ms(p_hit, t_verify_ms, t_tree_ms, t_backup_ms, overhead_ms, batch)
    return 1000.0 * batch * (p_hit * e_hit + (1.0 - p_hit) * e_miss) / round_ms
