"""`--ssd-k auto`: choose the number of draft tokens per round from live measurements.

Verifying fewer tokens than were drafted is exact (the chain is simply shorter; the draft server is
told k ≤ K' accepted), so the worker may cut every speculation to the K it predicts fastest:

    rate(K) = E(α, K) / (S(K + 1) + G)

with α the live per-token acceptance, S(n) the measured time of a whole worker step that verifies n
tokens per request at the current batch size (the link wait, the forward, the exact verification),
and G the measured gap between steps (the scheduler's own work, paid whatever K is). K = 0 is plain
decoding: one token verified, nothing drafted used. Measuring whole steps, not bare forwards, is what
makes the comparison with K = 0 honest on a CPU, where a forward over n tokens costs much more than
over one and the per-step overheads are large.

Every width is tried twice per batch-size bucket before the model is trusted, and a random width
every `EXPLORE_EVERY` rounds afterwards, so a changing workload (larger batches, where verification
grows costlier; text the draft predicts better) moves the choice.
"""

from __future__ import annotations

import random

from sglang_ssd.algo.policy import expected_tokens

EXPLORE_EVERY = 16
WARMUP_TRIES = 2
EMA = 0.2
MAX_GAP_S = 1.0  # a longer pause between steps is idleness, not scheduler work


class AutoK:
    def __init__(self, k_max: int, seed: int = 0):
        if k_max < 1:
            raise ValueError(f"auto-K needs a drafted length ≥ 1, got {k_max}")
        self.k_max = k_max
        self.step_ms: dict[tuple[int, int], float] = {}  # (batch bucket, width) -> EMA ms
        self.tries: dict[tuple[int, int], int] = {}
        self.gap_ms = 0.0
        self.accepted = 1.0  # prior: α = 0.5 over two pseudo-trials
        self.judged = 2.0
        self.rounds = 0
        self.chosen = [0] * (k_max + 1)
        self.rng = random.Random(seed)

    @staticmethod
    def bucket(batch: int) -> int:
        return min(batch.bit_length(), 6)  # 1, 2-3, 4-7, ... batch sizes share estimates

    @property
    def alpha(self) -> float:
        return min(max(self.accepted / self.judged, 0.0), 0.999)

    def predicted_rate(self, batch: int, k: int) -> float | None:
        """Tokens per ms per request at ``k`` drafted tokens; None before that width is measured."""
        t = self.step_ms.get((self.bucket(batch), k + 1))
        return None if t is None else expected_tokens(self.alpha, k) / max(t + self.gap_ms, 1e-9)

    def choose(self, batch: int) -> int:
        self.rounds += 1
        b = self.bucket(batch)
        untried = [k for k in range(self.k_max + 1) if self.tries.get((b, k + 1), 0) < WARMUP_TRIES]
        if untried:
            k = untried[0]
        elif self.rounds % EXPLORE_EVERY == 0:
            k = self.rng.randint(0, self.k_max)
        else:
            k = max(range(self.k_max + 1), key=lambda k: self.predicted_rate(batch, k))
        self.chosen[k] += 1
        return k

    def observe(self, batch: int, width: int, step_ms: float, gap_ms: float | None, accepted: list[int],
                drafted: list[int]) -> None:
        """One round: ``step_ms`` the worker's whole step at ``width``; ``gap_ms`` the time since the
        previous step ended (None for the first); the accepted and drafted counts per request."""
        key = (self.bucket(batch), width)
        old = self.step_ms.get(key)
        self.step_ms[key] = step_ms if old is None else (1 - EMA) * old + EMA * step_ms
        self.tries[key] = self.tries.get(key, 0) + 1
        if gap_ms is not None and gap_ms < 1000 * MAX_GAP_S:
            self.gap_ms = (1 - EMA) * self.gap_ms + EMA * gap_ms
        # Per-token acceptance: accepted tokens over positions judged (accepted + the rejection).
        for a, d in zip(accepted, drafted):
            if d > 0:
                self.accepted += a
                self.judged += a + (1 if a < d else 0)

    def snapshot(self) -> dict:
        return {
            "ssd_auto_k_alpha": self.alpha,
            "ssd_auto_k_gap_ms": self.gap_ms,
            "ssd_auto_k_chosen": list(self.chosen),
            "ssd_auto_k_step_ms": {f"b{b}w{w}": round(t, 2) for (b, w), t in sorted(self.step_ms.items())},
        }
