"""Predictions of one configuration (AR, SD at K, SSD at K and a budget) from a calibration's costs,
through the model of :mod:`.rates`; shared by the planner (``sglang_ssd.planner.choose``) and the sweep check
(:mod:`.sweep`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..algo.fanout import geometric_fanout, hit_probability, uniform_fanout
from ..algo.policy import expected_tokens
from .costs import CostModel
from .rates import ar_rate, check_unit, fastest_backup, sd_rate, ssd_rate, ssd_round_ms


@dataclass(frozen=True)
class Prediction:
    """One configuration's predicted rate. ``draft_ms``: K·T_draft for SD, T_tree for SSD."""

    mode: Literal["ar", "sd", "ssd"]
    k: int
    tok_s: float
    round_ms: float
    tokens_per_round: float
    verify_ms: float
    draft_ms: float = 0.0
    budget: int = 0
    fanout: tuple[int, ...] = ()
    p_hit: float | None = None
    backup: str | None = None
    backup_ms: float = 0.0


def fanout_plan(alpha: float, r: float, K: int, budget: int, mode: str = "geometric") -> list[int]:
    """F_0..F_K summing to ``budget``: "uniform", else the geometric plan at (α, r)."""
    return uniform_fanout(K, budget) if mode == "uniform" else geometric_fanout(alpha, r, K, budget)


def backup_options(costs: CostModel, K: int, e_hit: float, p_hit: float, batch: int = 1,
                   e_miss_fast: float = 1.0) -> dict[str, tuple[float, float]]:  # fmt: skip
    """(E_miss, T_backup) per backup kind. Neural: a full chain (E_miss = E_hit) drafted in K steps over
    the missed requests; fast: ``e_miss_fast`` tokens, no draft time."""
    return {"neural": (e_hit, costs.neural_backup_ms(K, batch * (1 - p_hit))), "fast": (e_miss_fast, 0.0)}


def predict_ar(costs: CostModel, batch: int = 1) -> Prediction:
    t1 = costs.verify_ms(1, batch)
    return Prediction("ar", 0, ar_rate(t1, batch), t1, 1.0, t1)


def predict_sd(costs: CostModel, alpha: float, K: int, *, batch: int = 1, overhead_ms: float = 0.0,
               tokens_per_round: float | None = None) -> Prediction:  # fmt: skip
    """SD at K; ``tokens_per_round`` (a measured one) replaces E(α, K) when given."""
    e = expected_tokens(alpha, K) if tokens_per_round is None else tokens_per_round
    t_v, t_d = costs.verify_ms(K + 1, batch), costs.draft_step_ms(batch)
    rate = sd_rate(e, t_v, t_d, K, overhead_ms, batch)
    return Prediction("sd", K, rate, t_v + K * t_d + overhead_ms, e, t_v, K * t_d)


def predict_ssd(costs: CostModel, alpha: float, r: float, K: int, budget: int, *, batch: int = 1,
                c: float = 1.0, overhead_ms: float = 0.0, e_miss_fast: float = 1.0, backup: str = "auto",
                fanout_mode: str = "geometric") -> Prediction:  # fmt: skip
    """SSD at one (K, budget). ``backup``: "neural", "fast" or "auto" (the faster of the two)."""
    fan = fanout_plan(alpha, r, K, budget, fanout_mode)
    p, e = hit_probability(fan, alpha, r, c), expected_tokens(alpha, K)
    t_v, t_tree = costs.verify_ms(K + 1, batch), costs.tree_ms(K, budget, batch)
    options = backup_options(costs, K, e, p, batch, e_miss_fast)
    kind = fastest_backup(options, p, e, t_v, t_tree, overhead_ms, batch) if backup == "auto" else backup
    e_miss, t_b = options[kind]
    rate = ssd_rate(p, e, e_miss, t_v, t_tree, t_b, overhead_ms, batch)
    round_ms = ssd_round_ms(p, t_v, t_tree, t_b, overhead_ms, batch)
    return Prediction("ssd", K, rate, round_ms, p * e + (1 - p) * e_miss, t_v, t_tree, budget, tuple(fan), p,
                      kind, t_b)  # fmt: skip


def predict_ssd_best_budget(costs: CostModel, alpha: float, r: float, K: int, max_budget: int,
                            tree_share: float | None = None, **kw) -> Prediction:  # fmt: skip
    """SSD at K with the budget ΣF in 1..``max_budget`` the model rates fastest (ties: the smaller);
    ``kw``: as :func:`predict_ssd`. ``tree_share``: only budgets whose tree takes at most that share of
    the verify step (the smallest budget if none does). The model prices a round at max(T_verify,
    T_tree), so its optimum fills the whole window; served, the draft server also answers the link and
    drafts backups, and a tree at the window's edge turns hits into misses."""
    per_budget = [predict_ssd(costs, alpha, r, K, b, **kw) for b in range(1, max_budget + 1)]
    if tree_share is not None:
        per_budget = [p for p in per_budget if p.draft_ms <= tree_share * p.verify_ms] or per_budget[:1]
    return max(per_budget, key=lambda p: p.tok_s)


def choose_k(
    t_verify: list[float], t_draft: float, alpha: float, p_hit: float, k_max: int, mode: Literal["sd", "ssd"]
) -> int:
    """The K (0..k_max) with the highest predicted tokens/s for one request; 0 = plain decoding.

    ``t_verify[n−1]`` = T_v(n) in ms (K is capped at len(t_verify) − 1); ``t_draft`` = one draft
    forward in ms. SD: E(α, K)/(T_v(K+1) + K·t_draft). SSD: E(α, K)/(max(T_v(K+1), (K+1)·t_draft)
    + (1 − p_hit)·K·t_draft) — the pre-speculation taken as K+1 draft forwards (glue + K branch
    steps, ``t_draft`` being a tree step) and a neural backup as K steps. K = 0: 1/T_v(1). Ties keep
    the smaller K.
    """
    _check_choose_k(t_verify, t_draft, alpha, p_hit, k_max, mode)
    best_k, best = 0, ar_rate(t_verify[0])
    for K in range(1, min(k_max, len(t_verify) - 1) + 1):
        e, t_v = expected_tokens(alpha, K), t_verify[K]
        if mode == "sd":
            rate = sd_rate(e, t_v, t_draft, K)
        else:
            rate = ssd_rate(p_hit, e, e, t_v, (K + 1) * t_draft, K * t_draft)
        if rate > best:
            best_k, best = K, rate
    return best_k


def _check_choose_k(t_verify: list[float], t_draft: float, alpha: float, p_hit: float, k_max: int,
                    mode: str) -> None:  # fmt: skip
    if not t_verify or any(not (math.isfinite(t) and t > 0) for t in t_verify):
        raise ValueError("t_verify must be a non-empty list of finite times > 0")
    if not (math.isfinite(t_draft) and t_draft >= 0):
        raise ValueError(f"t_draft must be a finite time ≥ 0, got {t_draft}")
    check_unit("alpha", alpha)
    check_unit("p_hit", p_hit)
    if not isinstance(k_max, int) or k_max < 0:
        raise ValueError(f"k_max must be an integer ≥ 0, got {k_max}")
    if mode not in ("sd", "ssd"):
        raise ValueError(f"mode must be 'sd' or 'ssd', got {mode!r}")
