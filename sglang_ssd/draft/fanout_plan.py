"""Fan-out plan and backup choice for the draft server, from the algorithm core's planner and policy.

The plan F_0..F_K (forks after k accepted tokens, Σ F_k = budget) comes from ``algo.fanout``
(geometric: F_k ∝ P(k)^{1/(1+r)} from live estimates of α and r, with a separate estimate for
speculations that a backup drafted; or uniform), or is a fixed list given on the command line. The
backup (neural JIT drafting vs fast n-gram tokens) comes from ``algo.policy.BackupPolicy`` (Theorem 17:
neural below the critical batch size, fast above) unless forced.
"""

from __future__ import annotations

from ..algo.fanout import AdaptiveFanoutPlanner
from ..algo.policy import BackupPolicy


def fold_plan(fixed: list[int] | None, k: int) -> list[int] | None:
    """A fixed F_0..F_K for a shallower depth k: the forks for k and beyond go to F_k (same ΣF)."""
    if fixed is None or len(fixed) == k + 1:
        return fixed
    return list(fixed[:k]) + [sum(fixed[k:])]


class FanoutPlanner:
    """``kind``: "geometric", "uniform" or "fixed" (then ``fixed`` is the plan, length K+1)."""

    def __init__(self, kind: str, k: int, budget: int, fixed: list[int] | None = None) -> None:
        if kind not in ("geometric", "uniform", "fixed"):
            raise ValueError(f"fanout must be geometric, uniform or fixed, got {kind!r}")
        if kind == "fixed" and (fixed is None or len(fixed) != k + 1 or min(fixed) < 0):
            raise ValueError(f"a fixed fan-out needs K+1 = {k + 1} non-negative entries, got {fixed}")
        self.kind, self.k, self.budget = kind, k, budget
        self.fixed = list(fixed) if fixed is not None else None
        self.algo = None if kind == "fixed" else AdaptiveFanoutPlanner(K=k, budget=budget, mode=kind)

    def plan(self, after_miss: bool = False, k: int | None = None, budget: int | None = None) -> list[int]:
        """F_0..F_k over the outcomes of a ``k``-token speculation (default: this planner's K; a shorter
        one gets the whole budget over its own k + 1 outcomes). ``budget``: ΣF for this plan (the
        engine's share per request at its batch, ``DraftEngine.set_budget``); a fixed plan stays as given."""
        k = self.k if k is None else k
        if k > self.k:
            raise ValueError(f"a plan for K = {self.k} cannot cover a {k}-token speculation")
        if self.algo is None:
            return list(fold_plan(self.fixed, k))
        return list(self.algo.plan(after_miss=after_miss, K=k, budget=budget))

    def observe(self, accepted: int, drafted: int, *, after_miss: bool, fanout: int | None, hit: bool) -> None:
        """One outcome: k accepted of ``drafted``; ``fanout`` = F_k the tree had at the realized k."""
        if self.algo is None:
            return
        # The capped-geometric estimate is over K-token chains; a shorter (backup) chain would read
        # "all accepted" as a rejection, so only full chains update α.
        accepted_lens = [accepted] if drafted == self.k else []
        self.algo.observe(
            accepted_lens,
            after_miss=after_miss,
            fanout_at_k=[fanout] if fanout is not None else None,
            hit=[hit] if fanout is not None else None,
        )

    def estimates(self) -> dict[str, float]:
        if self.algo is None:
            return {}
        return {
            "alpha": float(self.algo.alpha.alpha),
            "alpha_after_miss": float(self.algo.alpha_after_miss.alpha),
            "miss_exponent_r": float(self.algo.r.r),
        }


# Under auto, every this many rounds the backup the policy did not pick serves the round's misses: the
# policy learns each backup's figures only from rounds it served, and one left unused would keep its
# priors for good (auto once settled on the neural backup this way for whole runs).
EXPLORE_EVERY = 64


class BackupChooser:
    """``mode``: "neural", "fast" or "auto" (per round from ``algo.policy.BackupPolicy``)."""

    def __init__(self, mode: str, k: int) -> None:
        if mode not in ("auto", "neural", "fast"):
            raise ValueError(f"backup must be auto, neural or fast, got {mode!r}")
        self.mode, self.k = mode, k
        self.policy = BackupPolicy() if mode == "auto" else None
        self.rounds = 0

    def observe(self, *, hits: int, requests: int, tokens_hit: float, tokens_miss: float, backup: str | None,
                t_verify: float | None, t_spec: float | None, t_backup: float | None,
                next_hits: dict[str, tuple[int, int]] | None = None) -> None:
        """One round: of ``requests`` verified speculations ``hits`` came from the cache; tokens emitted
        by those and by the backup-drafted rest; wall times in seconds (normalized by ``t_verify``);
        ``next_hits``: per origin of the verified speculations, (hits, lookups) of the trees after them."""
        if self.policy is None or requests == 0:
            return
        self.policy.observe(hits=hits, requests=requests, tokens_hit=tokens_hit, tokens_miss=tokens_miss,
                            backup=backup, T_verify=t_verify, T_spec=t_spec, T_backup=t_backup,
                            next_hits=next_hits)  # fmt: skip

    def choose(self, batch_size: int) -> str:
        if self.policy is None:
            return "neural" if self.mode == "auto" else self.mode
        kind = self.policy.choose(max(1, batch_size))
        self.rounds += 1
        if self.rounds % EXPLORE_EVERY == 0:
            return "fast" if kind == "neural" else "neural"
        return kind
