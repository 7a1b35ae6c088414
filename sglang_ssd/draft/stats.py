"""Counters and timings of the draft server, reported by the ``stats`` message.

Timings are kept as count / total / max plus a small reservoir for medians, in milliseconds.
"""

from __future__ import annotations

import time
from collections import defaultdict

_RESERVOIR = 512


class EngineStats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.counters: dict[str, int] = defaultdict(int)
        self.times: dict[str, list[float]] = defaultdict(list)  # recent samples, ms
        self.totals: dict[str, tuple[int, float, float]] = defaultdict(lambda: (0, 0.0, 0.0))
        self.started = time.monotonic()

    def count(self, name: str, n: int = 1) -> None:
        self.counters[name] += n

    def record_ms(self, name: str, ms: float) -> None:
        n, total, mx = self.totals[name]
        self.totals[name] = (n + 1, total + ms, max(mx, ms))
        samples = self.times[name]
        samples.append(ms)
        if len(samples) > _RESERVOIR:
            del samples[: len(samples) - _RESERVOIR]

    def snapshot(self) -> dict[str, float | int]:
        out: dict[str, float | int] = dict(self.counters)
        for name, (n, total, mx) in self.totals.items():
            samples = sorted(self.times[name])
            out[f"{name}_count"] = n
            out[f"{name}_ms_mean"] = total / n if n else 0.0
            out[f"{name}_ms_p50"] = samples[len(samples) // 2] if samples else 0.0
            out[f"{name}_ms_max"] = mx
            out[f"{name}_us_total"] = round(total * 1000)  # an integer: the target sums these over servers
        hits, misses = self.counters.get("hits", 0), self.counters.get("misses", 0)
        out["hit_rate"] = hits / (hits + misses) if hits + misses else 0.0
        drafted = self.counters.get("drafted_tokens", 0)
        out["acceptance_rate"] = self.counters.get("accepted_tokens", 0) / drafted if drafted else 0.0
        out["uptime_s"] = time.monotonic() - self.started
        return out


class Timer:
    """``with Timer(stats, "tree_step"):`` records the block's wall time in ms."""

    def __init__(self, stats: EngineStats, name: str) -> None:
        self.stats, self.name = stats, name

    def __enter__(self) -> Timer:
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.stats.record_ms(self.name, (time.perf_counter() - self.t0) * 1e3)
