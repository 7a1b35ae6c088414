"""Fan-out plan and backup choice for the draft server, from the algorithm core's planner and policy.

The plan F_0..F_K (forks after k accepted tokens, Σ F_k = budget) comes from ``algo.fanout``
(geometric: F_k ∝ P(k)^{1/(1+r)} from live estimates of α and r; uniform; or the after-miss plan), or
is a fixed list given on the command line. The backup (neural JIT drafting vs fast n-gram tokens) comes
from ``algo.policy.BackupPolicy`` (Theorem 17: neural below the critical batch size, fast above) unless
forced.
"""

from __future__ import annotations

import importlib


def _algo(name: str):
    return importlib.import_module(f"sglang_ssd.algo.{name}")


class FanoutPlanner:
    """``kind``: "geometric", "uniform" or "fixed" (then ``fixed`` is the plan, length K+1)."""

    def __init__(self, kind: str, k: int, budget: int, fixed: list[int] | None = None) -> None:
        if kind not in ("geometric", "uniform", "fixed"):
            raise ValueError(f"fanout must be geometric, uniform or fixed, got {kind!r}")
        if kind == "fixed" and (fixed is None or len(fixed) != k + 1 or min(fixed) < 0):
            raise ValueError(f"a fixed fan-out needs K+1 = {k + 1} non-negative entries, got {fixed}")
        self.kind, self.k, self.budget = kind, k, budget
        self.fixed = list(fixed) if fixed is not None else None
        self._alpha = self._r = None
        if kind == "geometric":
            fan = _algo("fanout")
            self._alpha = fan.AcceptanceEstimator()
            self._r = fan.MissExponentEstimator()

    def plan(self, after_miss: bool = False) -> list[int]:
        if self.kind == "fixed":
            return list(self.fixed)
        fan = _algo("fanout")
        if self.kind == "uniform":
            return list(fan.uniform_fanout(self.k, self.budget))
        alpha, r = self._alpha.alpha, self._r.r
        if after_miss and hasattr(fan, "miss_fanout"):
            return list(fan.miss_fanout(alpha, r, self.k, self.budget))
        return list(fan.geometric_fanout(alpha, r, self.k, self.budget))

    def observe(self, accepted: int, drafted: int, fanout: int | None, hit: bool | None) -> None:
        """One outcome: k accepted of ``drafted``; ``fanout`` F_k used at k and whether t* was cached."""
        if self._alpha is None:
            return
        self._alpha.update(accepted, drafted)
        if fanout is not None and hit is not None:
            self._r.update(fanout, hit)

    def estimates(self) -> dict[str, float]:
        if self._alpha is None:
            return {}
        return {"alpha": float(self._alpha.alpha), "miss_exponent_r": float(self._r.r)}


class BackupChooser:
    """``mode``: "neural", "fast" or "auto" (per round from ``algo.policy.BackupPolicy``)."""

    def __init__(self, mode: str, k: int) -> None:
        if mode not in ("auto", "neural", "fast"):
            raise ValueError(f"backup must be auto, neural or fast, got {mode!r}")
        self.mode, self.k = mode, k
        self.policy = _algo("policy").BackupPolicy() if mode == "auto" else None

    def choose(self, batch_size: int) -> str:
        if self.policy is None:
            return self.mode
        return self.policy.choose(batch_size)
