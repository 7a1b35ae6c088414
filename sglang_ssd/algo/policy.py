"""The live backup choice (paper Theorem 17) and the pieces of the speedup model it runs on.

The throughput model itself — AR, SD and SSD rates and speedups (Theorem 7, Theorem 17) — lives in
``sglang_ssd.planner.rates`` (the planner's, above this floor: nothing here imports it). What stays
here is what the draft server runs per round, in units of one verification (T_v = 1): T_p is the
primary speculator's time per round (the pre-speculation tree), T_b the backup's; E_hit / E_miss are
the tokens a request emits per round (bonus included) when its speculation came from the cache / from
the backup.

- :func:`batch_ssd_speedup` (Theorem 17, batch b): the round is stall-free only when all b requests
  hit (probability p_hit^b), else it lasts 1 + T_b. Neural backup: E_miss high, T_b ≈ T_p; fast
  backup: E_miss ≈ 1, T_b ≈ 0 ⇒ neural below some b* (:func:`crossover_batch`), fast above.
- Corollary 9: SSD/SD ≤ (1 + T_SD)·E_hit / E_SD (:func:`ssd_over_sd_bound`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = [
    "BackupKind", "BackupOption", "BackupPolicy", "Ewma", "batch_ssd_speedup", "crossover_batch",
    "expected_tokens", "ssd_over_sd_bound",
]  # fmt: skip

BackupKind = Literal["neural", "fast"]


def expected_tokens(alpha: float, K: int) -> float:
    """E = (1 − α^{K+1}) / (1 − α): tokens per round, bonus included."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    if alpha == 1.0:
        return float(K + 1)
    return (1.0 - alpha ** (K + 1)) / (1.0 - alpha)


def _check_p(p_hit: float) -> None:
    if not 0.0 <= p_hit <= 1.0:
        raise ValueError(f"p_hit must be in [0, 1], got {p_hit}")


def ssd_over_sd_bound(T_sd: float, E_hit: float, E_sd: float) -> float:
    """Corollary 9: SSD/SD ≤ (1 + T_SD)·E_hit / E_SD."""
    return (1.0 + T_sd) * E_hit / E_sd


def batch_ssd_speedup(
    p_hit: float,
    batch_size: int,
    E_hit: float,
    E_miss: float,
    T_p: float,
    T_b: float,
    *,
    whole_batch_backup: bool = False,
) -> float:
    """Theorem 17: per-request speedup over AR for a batch of ``batch_size`` requests.

    Time: the round is max(1, T_p) if every request hits (p_hit^b), else 1 + T_b. Tokens: each request
    emits E_hit or E_miss on its own hit or miss — or, with ``whole_batch_backup`` (the reference
    engine: one miss re-drafts the whole batch), E_hit only when all hit, i.e. Theorem 7 with p_hit^b.
    """
    _check_p(p_hit)
    if batch_size < 1:
        raise ValueError(f"batch_size must be ≥ 1, got {batch_size}")
    all_hit = p_hit**batch_size
    p_tokens = all_hit if whole_batch_backup else p_hit
    tokens = p_tokens * E_hit + (1.0 - p_tokens) * E_miss
    time = all_hit * max(1.0, T_p) + (1.0 - all_hit) * (1.0 + T_b)
    return tokens / time


@dataclass(frozen=True)
class BackupOption:
    """A backup drafter: tokens per round on a miss and latency (units of T_v)."""

    E_miss: float
    T_b: float


def crossover_batch(
    p_hit: float,
    E_hit: float,
    T_p: float,
    neural: BackupOption,
    fast: BackupOption,
    *,
    max_batch: int = 4096,
    whole_batch_backup: bool = False,
) -> int | None:
    """b*: the smallest batch size at which the fast backup is at least as fast as the neural one."""
    for b in range(1, max_batch + 1):
        sn = batch_ssd_speedup(
            p_hit, b, E_hit, neural.E_miss, T_p, neural.T_b, whole_batch_backup=whole_batch_backup
        )
        sf = batch_ssd_speedup(
            p_hit, b, E_hit, fast.E_miss, T_p, fast.T_b, whole_batch_backup=whole_batch_backup
        )
        if sf >= sn:
            return b
    return None


@dataclass
class Ewma:
    """Exponentially weighted mean that starts at a prior worth ``prior_weight`` observations."""

    value: float
    decay: float = 0.98
    prior_weight: float = 1.0
    weight: float = field(init=False)

    def __post_init__(self) -> None:
        self.weight = self.prior_weight

    def update(self, x: float, n: float = 1.0) -> None:
        """Fold in ``n`` observations whose mean is ``x``."""
        if n <= 0:
            return
        self.weight *= self.decay**n
        self.value = (self.weight * self.value + n * x) / (self.weight + n)
        self.weight += n


class BackupPolicy:
    """Picks the backup (neural or fast) for the next round from live estimates of p_hit, E_hit,
    E_miss and T_b of each backup, and T_p — the batch form of the speedup model with p_hit^b.

    The backup also sets the next round's hit rate: after a fast backup's empty speculation the next
    tree spends its whole fan-out on the bonus token, after a neural backup's K tokens it spreads it
    over K + 1 outcomes. So p_hit is not one estimate but one per origin of the speculation a tree
    follows (a cache hit, or either backup), and each backup is priced at the long-run hit rate it
    leads to (:meth:`hit_rate`). Priced at one shared p_hit the neural backup looked better whenever it
    lowered the hit rate, since that lowered both kinds' figures alike."""

    def __init__(
        self,
        *,
        p_hit: float = 0.6,
        E_hit: float = 3.0,
        T_p: float = 1.0,
        neural: BackupOption | None = None,
        fast: BackupOption | None = None,
        decay: float = 0.98,
        whole_batch_backup: bool = False,
    ) -> None:
        neural = neural or BackupOption(E_miss=3.0, T_b=1.0)
        fast = fast or BackupOption(E_miss=1.0, T_b=0.0)
        self.whole_batch_backup = whole_batch_backup
        self.E_hit = Ewma(E_hit, decay)
        self.T_p = Ewma(T_p, decay)
        self.E_miss = {"neural": Ewma(neural.E_miss, decay), "fast": Ewma(fast.E_miss, decay)}
        self.T_b = {"neural": Ewma(neural.T_b, decay), "fast": Ewma(fast.T_b, decay)}
        # P(a request's lookup hits | the speculation its tree followed came from a hit / a backup)
        self.p_next = {origin: Ewma(p_hit, decay) for origin in ("hit", "neural", "fast")}

    def observe(
        self,
        *,
        hits: int,
        requests: int,
        tokens_hit: float = 0.0,
        tokens_miss: float = 0.0,
        backup: BackupKind | None = None,
        T_verify: float | None = None,
        T_spec: float | None = None,
        T_backup: float | None = None,
        next_hits: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        """One round: ``hits`` of ``requests`` were served from the cache; ``tokens_hit`` /
        ``tokens_miss`` are the tokens emitted by the hit / missed requests (summed); misses went to
        ``backup``. Times in any unit, normalized by ``T_verify``. ``next_hits``: per origin of the
        speculations verified ("hit", "neural", "fast"), (lookups that hit, lookups) of the trees that
        followed them."""
        if not 0 <= hits <= requests:
            raise ValueError("hits must be in [0, requests]")
        for origin, (h, n) in (next_hits or {}).items():
            if not 0 <= h <= n:
                raise ValueError(f"next_hits[{origin!r}] must be (hits, lookups) with 0 ≤ hits ≤ lookups")
            if n:
                self.p_next[origin].update(h / n, n)
        if hits:
            self.E_hit.update(tokens_hit / hits, hits)
        misses = requests - hits
        if misses and backup is not None:
            self.E_miss[backup].update(tokens_miss / misses, misses)
        if T_verify:
            if T_spec is not None:
                self.T_p.update(T_spec / T_verify)
            if T_backup is not None and backup is not None and misses:
                self.T_b[backup].update(T_backup / T_verify)

    def hit_rate(self, kind: BackupKind) -> float:
        """The long-run hit rate with ``kind`` as the backup. A request's rounds are a two-state chain:
        after a hit the next lookup hits with p_h, after a backup with p_b; its share of hits is
        p_b / (1 − p_h + p_b)."""
        p_h, p_b = self.p_next["hit"].value, self.p_next[kind].value
        return p_b / (1.0 - p_h + p_b) if p_b > 0 else 0.0

    def speedups(self, batch_size: int) -> dict[str, float]:
        """The model's per-request speedup over AR with each backup, at the live estimates."""
        return {
            kind: batch_ssd_speedup(
                self.hit_rate(kind),
                batch_size,
                self.E_hit.value,
                self.E_miss[kind].value,
                self.T_p.value,
                self.T_b[kind].value,
                whole_batch_backup=self.whole_batch_backup,
            )
            for kind in ("neural", "fast")
        }

    def choose(self, batch_size: int) -> BackupKind:
        s = self.speedups(batch_size)
        return "neural" if s["neural"] > s["fast"] else "fast"
