"""`--ssd-k auto`: choose the number of draft tokens per round from live measurements.

Verifying fewer tokens than were drafted is exact (the chain is simply shorter; the draft server is
told k ≤ K' accepted), so the worker may cut every speculation to the K it predicts fastest:
rate(K) = E(α, K) / (T_v(K+1) + L(K)), with α the live per-token acceptance, T_v(n) the measured
verify time for n tokens per request at the current batch size, and L the measured draft-link time.
K = 0 is plain decoding (one token verified). Widths never measured start from a prior and are
tried now and then, so a changing workload (larger batches, where verification grows costlier) moves
the choice. On a CPU where T_v(n) rises with n, this is what keeps SSD from being slower than AR.
"""

from __future__ import annotations

import random

from sglang_ssd.algo.policy import expected_tokens

EXPLORE_EVERY = 12
EMA = 0.2


class AutoK:
    def __init__(self, k_max: int, seed: int = 0):
        self.k_max = k_max
        self.verify_ms: dict[tuple[int, int], float] = {}  # (batch bucket, width) -> EMA ms
        self.link_ms = 0.0
        self.accepted = 1.0  # priors: α ≈ 0.5 until measured
        self.drafted = 2.0
        self.rounds = 0
        self.rng = random.Random(seed)

    @staticmethod
    def _bucket(batch: int) -> int:
        return min(batch.bit_length(), 6)  # 1, 2-3, 4-7, ... batch sizes share estimates

    @property
    def alpha(self) -> float:
        return min(max(self.accepted / max(self.drafted, 1e-9), 0.0), 0.999)

    def _t_verify(self, bucket: int, width: int) -> float:
        known = {w: t for (b, w), t in self.verify_ms.items() if b == bucket}
        if width in known:
            return known[width]
        if not known:
            return 1.0 + 0.2 * (width - 1)  # relative prior; only ratios matter before measurements
        w0 = min(known, key=lambda w: abs(w - width))
        return known[w0] * (1.0 + 0.15 * (width - w0)) if width > w0 else known[w0]

    def choose(self, batch: int) -> int:
        self.rounds += 1
        bucket = self._bucket(batch)
        if self.rounds % EXPLORE_EVERY == 0:
            return self.rng.randint(0, self.k_max)
        best_k, best = 0, -1.0
        for k in range(self.k_max + 1):
            t = self._t_verify(bucket, k + 1) + (self.link_ms if k > 0 else 0.0)
            rate = expected_tokens(self.alpha, k) / max(t, 1e-9)
            if rate > best:
                best_k, best = k, rate
        return best_k

    def observe(self, batch: int, width: int, verify_ms: float, link_ms: float, accepted: list[int],
                drafted: list[int]) -> None:
        key = (self._bucket(batch), width)
        old = self.verify_ms.get(key)
        self.verify_ms[key] = verify_ms if old is None else (1 - EMA) * old + EMA * verify_ms
        if width > 1:
            self.link_ms = (1 - EMA) * self.link_ms + EMA * link_ms
        # Per-token acceptance: accepted tokens over positions examined (accepted + the rejection).
        for a, d in zip(accepted, drafted):
            if d > 0:
                self.accepted += a
                self.drafted += a + (1 if a < d else 0)
