"""Forward costs (ms) read from a calibration JSON (``bench/calibrate.py``), as functions of the work size.

Every measured cost becomes a :class:`Curve` over the number of tokens in the forward: piecewise linear
through the measured medians, extended past the last point with the average slope over all points
(≥ 0) and held at the first value below the first point. The curve is deliberately not forced to be
non-decreasing: on a CPU a forward over 4 tokens can be cheaper than over 3 (the matmul library takes a
slower path for 2–3 rows — measured on plain ``x @ W.T``), and the planner should see that.

What the planner asks for, with the calibration key it comes from:
- ``verify_ms(n, b)``: T_v — one target forward of b requests × n new tokens (``target.verify_ms_by_batch``).
  A batch that was not measured is approximated from the largest measured batch b0 ≤ b at
  n·b/b0 tokens (CPU forwards cost about the same per token whatever the split across requests).
- ``draft_step_ms(b)``: one draft forward of b requests × 1 token (``draft.decode_ms``).
- ``glue_ms(tokens)``: the glue forward of a round, b·(K+1) tokens (``draft.chain_ms`` plus each
  timed tree's glue).
- ``tree_step_ms(tokens)``: one branch step of b·ΣF tokens, forward + sampling (``draft.tree`` steps,
  anchored at the 1-token decode step).
- ``tree_ms(K, budget, b)`` = glue_ms(b·(K+1)) + K · tree_step_ms(b·budget): the pre-speculation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Curve:
    """Cost (ms) over a work size x (tokens); see the module docstring for the shape."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    @classmethod
    def from_points(cls, points: Iterable[tuple[float, float]], name: str) -> Curve:
        merged: dict[float, list[float]] = {}
        for x, y in points:
            if not (math.isfinite(x) and math.isfinite(y)) or x <= 0 or y <= 0:
                raise ValueError(f"calibration: {name} has a bad point ({x}, {y}); sizes and ms must be > 0")
            merged.setdefault(float(x), []).append(float(y))
        if not merged:
            raise ValueError(f"calibration: {name} has no points")
        xs = sorted(merged)
        ys = [sum(merged[x]) / len(merged[x]) for x in xs]
        return cls(tuple(xs), tuple(ys))

    @property
    def slope(self) -> float:
        """ms per extra unit past the last point: the average slope over the measured range (≥ 0)."""
        if len(self.xs) < 2:
            return 0.0
        return max(0.0, (self.ys[-1] - self.ys[0]) / (self.xs[-1] - self.xs[0]))

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1] + self.slope * (x - xs[-1])
        for i in range(1, len(xs)):
            if x <= xs[i]:
                w = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
                return ys[i - 1] + w * (ys[i] - ys[i - 1])
        raise AssertionError("unreachable")


def _get(d: dict, path: str):
    cur = d
    for key in path.split("."):
        if not isinstance(cur, dict) or key not in cur:
            raise ValueError(f"calibration has no {path!r}")
        cur = cur[key]
    return cur


class CostModel:
    """Forward costs from a calibration dict. ``stat``: "median" (the cost as met on the loaded machine,
    the default) or "min" (closer to the cost of the work alone)."""

    def __init__(self, calibration: dict, stat: str = "median") -> None:
        if not isinstance(calibration, dict):
            raise ValueError("calibration must be a dict (the JSON written by bench/calibrate.py)")
        if stat not in ("median", "min"):
            raise ValueError(f"stat must be 'median' or 'min', got {stat!r}")
        self.stat = stat
        key = "verify_ms_by_batch" if stat == "median" else "verify_min_ms_by_batch"
        by_batch = _get(calibration, f"target.{key}")
        if not isinstance(by_batch, dict) or "1" not in by_batch:
            raise ValueError(f"calibration: target.{key} must hold batch '1'")
        self._verify = {
            int(b): Curve.from_points(enumerate(row, 1), f"target.{key}[{b}]") for b, row in by_batch.items()
        }
        self.max_verify_n = len(by_batch["1"])
        draft = calibration.get("draft")
        self.has_draft = bool(draft)
        self.draft_source = draft.get("source", "draft folder") if draft else None
        if not draft:
            return
        src = draft if stat == "median" else _get(calibration, "draft.min")
        chain = src["chain_ms"] if "chain_ms" in src else _get(calibration, "draft.chain_ms")
        decode = src["decode_ms"] if "decode_ms" in src else _get(calibration, "draft.decode_ms")
        trees = draft.get("tree", {})
        tree_stat = (lambda t: t) if stat == "median" else (lambda t: t.get("min", t))
        self._step = Curve.from_points(((int(b), ms) for b, ms in decode.items()), "draft.decode_ms")
        glue_pts = list(enumerate(chain, 1))
        glue_pts += [(t["batch"] * (t["k"] + 1), tree_stat(t)["glue_ms"]) for t in trees.values()]
        self._glue = Curve.from_points(glue_pts, "draft.chain_ms")
        step_pts = [(1, self._step(1))]
        step_pts += [(t["tokens_per_step"], tree_stat(t)["step_ms"]) for t in trees.values()]
        self._tree_step = Curve.from_points(step_pts, "draft.tree")
        self.tree_measured = sorted(trees)

    # ---- target ----------------------------------------------------------------------------------
    def verify_ms(self, n: int, batch: int = 1) -> float:
        """T_v: one target forward of ``batch`` requests × ``n`` new tokens."""
        if n < 1:
            raise ValueError(f"n must be ≥ 1, got {n}")
        if batch < 1:
            raise ValueError(f"batch must be ≥ 1, got {batch}")
        if batch in self._verify:
            return self._verify[batch](n)
        b0 = max(b for b in self._verify if b <= batch)
        return self._verify[b0](n * batch / b0)

    def measured_batches(self) -> list[int]:
        return sorted(self._verify)

    # ---- draft -----------------------------------------------------------------------------------
    def _need_draft(self) -> None:
        if not self.has_draft:
            raise ValueError("calibration has no draft timings (run bench/calibrate.py without --skip-draft)")

    def draft_step_ms(self, batch: int = 1) -> float:
        """One draft forward of ``batch`` requests × 1 token (an SD draft step, a neural-backup step)."""
        self._need_draft()
        return self._step(batch)

    def glue_ms(self, tokens: float) -> float:
        self._need_draft()
        return self._glue(tokens)

    def tree_step_ms(self, tokens: float) -> float:
        self._need_draft()
        return self._tree_step(tokens)

    def tree_ms(self, K: int, budget: int, batch: int = 1) -> float:
        """T_tree: the glue of b·(K+1) tokens, then K branch steps of b·ΣF tokens (0 if ΣF = 0)."""
        glue = self.glue_ms(batch * (K + 1))
        return glue + (K * self.tree_step_ms(batch * budget) if budget > 0 else 0.0)

    def neural_backup_ms(self, K: int, misses: float = 1.0) -> float:
        """K autoregressive draft steps over the missed requests (the first one feeds the bonus)."""
        return K * self.draft_step_ms(max(1.0, misses))
