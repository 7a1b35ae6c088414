"""Depth 2 (L0 → L1 → target) against depth 1 (L1 → target), from measured costs.

Recursion keeps L1's law exactly, so the target's acceptance α and the hit rate do not change with
depth: only what it costs L1 to produce its K tokens does. At depth 1 that is K draft steps of one
token each. At depth 2 each L1 forward carries a branch's last token and m L0 proposals, L1 accepts
each with probability α₀ (measured: L1's acceptance of an L0 token), and emits
E₀ = (1 − α₀^(m+1)) / (1 − α₀) tokens — but a forward over m+1 tokens costs more than over one, and
L0 itself costs ``l0_ms`` per proposed token. A tree is only done when its slowest branch is, so the
number of L1 forwards is simulated (the expected maximum over the tree's branches), not K / E₀.

Depth 2 pays off exactly when it makes the draft cheaper per token where the draft is on the critical
path: every SD round; in SSD only the backup after a miss and a tree that outlasts the verification.
"""

from __future__ import annotations

import numpy as np

from .costs import CostModel
from .rates import sd_rate, ssd_rate


def tokens_per_l1_forward(alpha0: float, m: int) -> float:
    """E₀: tokens L1 emits per forward when L0 proposes m (accepted prefix + one drawn token)."""
    if not 0.0 <= alpha0 <= 1.0:
        raise ValueError(f"alpha0 must be in [0, 1], got {alpha0}")
    if m < 0:
        raise ValueError(f"m must be ≥ 0, got {m}")
    return float(m + 1) if alpha0 >= 1.0 else (1.0 - alpha0 ** (m + 1)) / (1.0 - alpha0)


def l1_forwards(alpha0: float, m: int, K: int, branches: int = 1, trials: int = 4000, seed: int = 0) -> float:
    """Expected L1 forwards until every one of ``branches`` chains holds K tokens (L0 proposes
    min(m, K − 1 − done) each time, as the draft server does)."""
    if K < 1:
        return 0.0
    if m == 0 or branches == 0:
        return float(K) if branches else 0.0
    rng = np.random.default_rng(seed)
    done = np.zeros((trials, max(branches, 1)), dtype=np.int64)
    steps = np.zeros(trials)
    while (done < K).any():
        active = done < K
        steps += active.any(axis=1)
        props = np.minimum(m, K - 1 - done)
        u = rng.random((*done.shape, m))
        accepted_run = np.cumprod(u < alpha0, axis=-1).sum(axis=-1)  # leading acceptances
        gain = np.minimum(accepted_run, props) + 1
        done = np.where(active, np.minimum(done + gain, K), done)
    return float(steps.mean())


def compare_depths(
    costs: CostModel,
    *,
    alpha: float,
    tokens_per_round: float,
    alpha0: float,
    m: int,
    l0_ms: float,
    K: int,
    budget: int,
    p_hit: float,
    batch: int = 1,
) -> dict:
    """Predicted tok/s of SD and SSD at depth 1 and 2 (same K, budget, α, hit rate)."""
    b = batch
    t_v = costs.verify_ms(K + 1, b)
    step1 = costs.draft_step_ms(b)
    chain_fwds = l1_forwards(alpha0, m, K)
    step2 = costs.glue_ms(b * (m + 1)) + b * m * l0_ms  # one L1 forward over b chains of m+1 tokens
    sd1 = sd_rate(tokens_per_round, t_v, step1, K, 0.0, b)
    sd2 = sd_rate(tokens_per_round, t_v, chain_fwds * step2 / K, K, 0.0, b)
    tree1 = costs.tree_ms(K, budget, b)
    tree_fwds = l1_forwards(alpha0, m, K, branches=budget)
    tree2 = costs.glue_ms(b * (K + 1)) + tree_fwds * (costs.tree_step_ms(b * budget * (m + 1)) + b * budget * m * l0_ms)
    misses = max(1.0, b * (1 - p_hit))
    backup1 = costs.neural_backup_ms(K, misses)
    backup2 = chain_fwds * (costs.glue_ms(misses * (m + 1)) + misses * m * l0_ms)
    ssd1 = ssd_rate(p_hit, tokens_per_round, tokens_per_round, t_v, tree1, backup1, 0.0, b)
    ssd2 = ssd_rate(p_hit, tokens_per_round, tokens_per_round, t_v, tree2, backup2, 0.0, b)
    return {
        "alpha": alpha, "alpha0": alpha0, "m": m, "K": K, "budget": budget, "batch": b, "p_hit": p_hit,
        "E0": tokens_per_l1_forward(alpha0, m),
        "draft_ms_per_token": {"depth1": step1, "depth2": chain_fwds * step2 / K},
        "l1_forwards": {"chain_depth1": K, "chain_depth2": chain_fwds, "tree_depth1": K, "tree_depth2": tree_fwds},
        "tree_ms": {"depth1": tree1, "depth2": tree2}, "backup_ms": {"depth1": backup1, "depth2": backup2},
        "tok_s": {"sd1": sd1, "sd2": sd2, "ssd1": ssd1, "ssd2": ssd2},
        "sd_depth2_over_depth1": sd2 / sd1, "ssd_depth2_over_depth1": ssd2 / ssd1,
    }  # fmt: skip


def format_depths(d: dict) -> str:
    t = d["tok_s"]
    verdict = {True: "pays off", False: "does not pay off"}
    return "\n".join([
        f"depth 2 (L0 → L1 → target), m = {d['m']} L0 tokens per L1 forward, α₀ = {d['alpha0']:.3f} "
        f"(E₀ = {d['E0']:.2f} tokens per L1 forward):",
        f"  draft cost per token: depth 1 {d['draft_ms_per_token']['depth1']:.2f} ms, "
        f"depth 2 {d['draft_ms_per_token']['depth2']:.2f} ms",
        f"  L1 forwards for K = {d['K']}: chain {d['l1_forwards']['chain_depth2']:.2f}, "
        f"tree of {d['budget']} branches {d['l1_forwards']['tree_depth2']:.2f} (depth 1: {d['K']})",
        f"  SD : {t['sd1']:.2f} → {t['sd2']:.2f} tok/s ({d['sd_depth2_over_depth1']:.2f}×, "
        f"{verdict[d['sd_depth2_over_depth1'] > 1.0]})",
        f"  SSD: {t['ssd1']:.2f} → {t['ssd2']:.2f} tok/s ({d['ssd_depth2_over_depth1']:.2f}×, "
        f"{verdict[d['ssd_depth2_over_depth1'] > 1.0]})",
    ])  # fmt: skip
