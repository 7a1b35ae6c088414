"""SSD counters: per-round statistics of the worker, exported to /server_info and /metrics."""

from __future__ import annotations

from dataclasses import dataclass

_WORKERS: list = []


def register_worker(worker) -> None:
    _WORKERS.append(worker)


@dataclass
class SSDStats:
    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    verify_s: float = 0.0
    link_s: float = 0.0
    total_s: float = 0.0

    def record_round(self, *, num_draft: list[int], accepted: list[int], verify_s: float, link_s: float,
                     total_s: float) -> None:
        self.rounds += 1
        self.drafted += sum(num_draft)
        self.accepted += sum(accepted)
        self.emitted += sum(accepted) + len(accepted)
        self.verify_s += verify_s
        self.link_s += link_s
        self.total_s += total_s

    def summary(self) -> dict:
        r = max(self.rounds, 1)
        return {
            "ssd_alpha": self.accepted / self.drafted if self.drafted else 0.0,
            "ssd_verify_ms": 1000 * self.verify_s / r,
            "ssd_link_ms": 1000 * self.link_s / r,
            "ssd_step_ms": 1000 * self.total_s / r,
        }


def snapshot() -> dict:
    """Merged statistics of the SSD workers in this process."""
    out: dict = {}
    for w in _WORKERS:
        out.update(w.stats.summary())
        out.update(w.link.stats())
        out["ssd_k"] = w.k
        out["ssd_budget"] = w.config.budget
        out["ssd_mode"] = w.config.mode
    return out
