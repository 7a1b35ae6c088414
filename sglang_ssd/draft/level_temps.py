"""Per-level temperature for the draft model (L1): τ₁ = m·T for a sampled request at temperature T.

A draft that samples cooler than the target is often accepted more (its mass sits where the target's
does); how much cooler is a property of the pair, so it is measured: while calibrating, each new
speculation draws its multiplier m from ``grid`` in turn, and the target's verdict on it (accepted /
drafted) is credited to that m. After ``rounds_per_arm`` verdicts for every m the best mean is kept.
Exactness never depends on m: the q′ sent with a speculation is the distribution it was sampled from.
A fixed ``multiplier`` (manual override) skips the calibration; greedy requests stay greedy.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class TemperatureCalibrator:
    grid: tuple[float, ...] = (0.5, 0.75, 1.0)
    rounds_per_arm: int = 64
    multiplier: float | None = None  # manual override
    accepted: dict[float, int] = field(default_factory=dict)
    drafted: dict[float, int] = field(default_factory=dict)
    verdicts: dict[float, int] = field(default_factory=dict)
    _turn: int = 0

    def __post_init__(self) -> None:
        if not self.grid or any(m <= 0 for m in self.grid):
            raise ValueError(f"temperature multipliers must be > 0, got {self.grid!r}")
        if self.multiplier is not None and self.multiplier <= 0:
            raise ValueError(f"draft temperature multiplier must be > 0, got {self.multiplier!r}")
        for m in self.grid:
            self.accepted.setdefault(m, 0)
            self.drafted.setdefault(m, 0)
            self.verdicts.setdefault(m, 0)

    @property
    def calibrating(self) -> bool:
        return self.multiplier is None and min(self.verdicts.values()) < self.rounds_per_arm

    def rate(self, m: float) -> float:
        return self.accepted[m] / self.drafted[m] if self.drafted[m] else 0.0

    def best(self) -> float:
        if self.multiplier is not None:
            return self.multiplier
        if not any(self.drafted.values()):
            return 1.0 if 1.0 in self.grid else self.grid[-1]
        return max(self.grid, key=lambda m: (self.rate(m), m))

    def choose(self) -> float:
        """The multiplier for the next speculation."""
        if not self.calibrating:
            return self.best()
        self._turn = (self._turn + 1) % len(self.grid)
        return self.grid[self._turn]

    def observe(self, m: float | None, accepted: int, drafted: int) -> None:
        if m is None or m not in self.verdicts or drafted <= 0:
            return
        self.accepted[m] += accepted
        self.drafted[m] += drafted
        self.verdicts[m] += 1

    def snapshot(self) -> dict[str, float]:
        out = {f"tau1_alpha_x{m:g}": round(self.rate(m), 4) for m in self.grid}
        out["tau1_multiplier"] = self.best()
        out["tau1_calibrating"] = int(self.calibrating)
        return out
