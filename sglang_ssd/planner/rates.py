"""The throughput model: decode rates (output tokens/s, all requests of a batch together) of AR, SD and
SSD from per-round costs in ms (paper Theorem 7, Corollary 9, Theorem 17).

The latencies are in milliseconds rather than units of one verification, so that a verification
whose cost grows with the number of tokens it checks (T_v(K+1) > T_v(1), as on a CPU) is priced as such:

- AR:  b / T_v(1)
- SD:  b · E(α, K) / (T_v(K+1) + K·T_draft + overhead)
- SSD: b · [p_hit·E_hit + (1 − p_hit)·E_miss] / (max(T_v(K+1), T_tree) + (1 − p_hit^b)·T_backup + overhead)

b = requests per batch. E(α, K) = (1 − α^{K+1})/(1 − α) tokens per round, bonus included. In SSD a
batch waits for its slowest request, so it stalls for the backup whenever at least one request misses
(probability 1 − p_hit^b; at b = 1 that is 1 − p_hit); each request still emits its own E_hit or E_miss.
``overhead`` = per-round lookup and communication. Rates are × 1000 (ms → s).

:func:`sd_speedup` / :func:`ssd_speedup` are the same model with times in units of one verification
(T_v = 1), as the paper states it. The draft server's live backup choice (``algo.policy.BackupPolicy``)
keeps its own per-round form: after a miss it prices the round as 1 + T_b, without waiting for a tree
that outlasts the verification.
"""

from __future__ import annotations

import math


def check_unit(name: str, x: float, hi_open: bool = False) -> None:
    """``x`` in [0, 1] (or [0, 1) with ``hi_open``), for probabilities and acceptance rates."""
    if not (isinstance(x, int | float) and math.isfinite(x) and 0.0 <= x <= 1.0) or (hi_open and x == 1.0):
        raise ValueError(f"{name} must be in [0, 1{')' if hi_open else ']'}, got {x}")


def _check(batch: int, positive: dict[str, float], non_negative: dict[str, float]) -> None:
    for name, x in positive.items():
        if not (math.isfinite(x) and x > 0):
            raise ValueError(f"{name} must be a finite number > 0, got {x}")
    for name, x in non_negative.items():
        if not (math.isfinite(x) and x >= 0):
            raise ValueError(f"{name} must be a finite number ≥ 0, got {x}")
    if int(batch) != batch or batch < 1:
        raise ValueError(f"batch must be an integer ≥ 1, got {batch}")


def ar_rate(t_verify1_ms: float, batch: int = 1) -> float:
    """tokens/s of plain decoding: one token per request per target forward."""
    _check(batch, {"t_verify1_ms": t_verify1_ms}, {})
    return 1000.0 * batch / t_verify1_ms


def sd_rate(tokens_per_round: float, t_verify_ms: float, t_draft_ms: float, K: int,
            overhead_ms: float = 0.0, batch: int = 1) -> float:  # fmt: skip
    """tokens/s of synchronous SD: ``t_verify_ms`` = T_v(K+1), ``t_draft_ms`` = one draft step."""
    _check(batch, {"tokens_per_round": tokens_per_round, "t_verify_ms": t_verify_ms},
           {"t_draft_ms": t_draft_ms, "overhead_ms": overhead_ms})  # fmt: skip
    if K < 0:
        raise ValueError(f"K must be ≥ 0, got {K}")
    return 1000.0 * batch * tokens_per_round / (t_verify_ms + K * t_draft_ms + overhead_ms)


def ssd_round_ms(p_hit: float, t_verify_ms: float, t_tree_ms: float, t_backup_ms: float,
                 overhead_ms: float = 0.0, batch: int = 1) -> float:  # fmt: skip
    """Expected round time: verification and pre-speculation overlap; a miss anywhere adds the backup."""
    if not 0.0 <= p_hit <= 1.0:
        raise ValueError(f"p_hit must be in [0, 1], got {p_hit}")
    _check(batch, {"t_verify_ms": t_verify_ms},
           {"t_tree_ms": t_tree_ms, "t_backup_ms": t_backup_ms, "overhead_ms": overhead_ms})  # fmt: skip
    return max(t_verify_ms, t_tree_ms) + (1.0 - p_hit**batch) * t_backup_ms + overhead_ms


def ssd_rate(p_hit: float, e_hit: float, e_miss: float, t_verify_ms: float, t_tree_ms: float,
             t_backup_ms: float, overhead_ms: float = 0.0, batch: int = 1) -> float:  # fmt: skip
    """tokens/s of SSD (formula in the module docstring)."""
    _check(batch, {"e_hit": e_hit, "e_miss": e_miss}, {})
    round_ms = ssd_round_ms(p_hit, t_verify_ms, t_tree_ms, t_backup_ms, overhead_ms, batch)
    return 1000.0 * batch * (p_hit * e_hit + (1.0 - p_hit) * e_miss) / round_ms


def fastest_backup(options: dict[str, tuple[float, float]], p_hit: float, e_hit: float, t_verify_ms: float,
                   t_tree_ms: float, overhead_ms: float = 0.0, batch: int = 1) -> str:  # fmt: skip
    """The backup kind whose (E_miss, T_backup) in ``options`` the model rates fastest (ties: the first
    listed) — the choice the live ``BackupPolicy`` makes when it runs on "auto"."""
    def rate(kind: str) -> float:
        e_miss, t_backup = options[kind]
        return ssd_rate(p_hit, e_hit, e_miss, t_verify_ms, t_tree_ms, t_backup, overhead_ms, batch)

    return max(options, key=rate)


# ---- in units of one verification (T_v = 1): speedup over AR per request ------------------------------


def sd_speedup(E_sd: float, T_sd: float) -> float:
    """Synchronous SD over AR: the draft (``T_sd``, all K steps) and the verification (1) take turns."""
    return sd_rate(E_sd, 1.0, T_sd, 1) / ar_rate(1.0)


def ssd_speedup(p_hit: float, E_hit: float, E_miss: float, T_p: float, T_b: float, batch: int = 1) -> float:
    """SSD over AR per request (``T_p``: the pre-speculation tree, ``T_b``: the backup): Theorem 7 at
    ``batch`` 1, Theorem 17 above, when T_p ≤ 1; a slower tree also delays the rounds that miss."""
    return ssd_rate(p_hit, E_hit, E_miss, 1.0, T_p, T_b, 0.0, batch) / ar_rate(1.0, batch)
