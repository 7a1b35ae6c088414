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

S(n) is the running mean of the steps measured at n once there are `OWN_AFTER` of them, and until
then a straight line a + b·(n − 1) per batch-size bucket, fitted (least squares, recent rounds
weighted more) over every width measured: single step times are noisy on a shared CPU, and a line
needs only two widths to start — plain decoding and a one-token draft are tried first in a new
bucket (a bucket larger than one where plain decoding already won starts parked). (A CPU's cost curve is not straight: the jump from one token to two is the largest, hence
the widths' own means once known.) A random width every `EXPLORE_EVERY` rounds afterwards (every
`EXPLORE_PARKED` while plain decoding wins: the worker then parks its requests on the draft server,
and trying a draft again costs re-opening them) keeps the fit honest, so a changing workload (larger batches, where verification grows costlier; text the draft predicts
better) moves the choice.
"""

from __future__ import annotations

import random

from sglang_ssd.algo.policy import expected_tokens

EXPLORE_EVERY = 16
EXPLORE_PARKED = 128  # while plain decoding wins: trying a draft means re-opening every request
EMA = 0.2
DECAY = 0.97  # per observation: the fit follows a changing machine load
OWN_AFTER = 3
MAX_GAP_S = 1.0  # a longer pause between steps is idleness, not scheduler work


class AutoK:
    def __init__(self, k_max: int, seed: int = 0):
        if k_max < 1:
            raise ValueError(f"auto-K needs a drafted length ≥ 1, got {k_max}")
        self.k_max = k_max
        # Per bucket: decayed sums for the weighted least-squares line through (n − 1, step ms).
        self.fits: dict[int, list[float]] = {}  # bucket -> [Σw, Σwx, Σwy, Σwxx, Σwxy]
        self.seen: dict[int, set[int]] = {}  # bucket -> widths measured
        self.means: dict[tuple[int, int], list[float]] = {}  # (bucket, width) -> [EMA ms, count]
        self.gap_ms = 0.0
        self.accepted = 1.0  # prior: α = 0.5 over two pseudo-trials
        self.judged = 2.0
        self.rounds = 0
        self.best: dict[int, int] = {}  # bucket -> the last K the model chose (not an exploration)
        self.chosen = [0] * (k_max + 1)
        self.rng = random.Random(seed)

    @staticmethod
    def bucket(batch: int) -> int:
        return min(batch.bit_length(), 6)  # 1, 2-3, 4-7, ... batch sizes share estimates

    @property
    def alpha(self) -> float:
        return min(max(self.accepted / self.judged, 0.0), 0.999)

    def step_ms(self, batch: int, width: int) -> float | None:
        """The expected whole-step time at ``width``; None until two widths were measured."""
        own = self.means.get((self.bucket(batch), width))
        if own is not None and own[1] >= OWN_AFTER:
            return own[0]
        f = self.fits.get(self.bucket(batch))
        if f is None or len(self.seen.get(self.bucket(batch), ())) < 2:
            return None
        sw, sx, sy, sxx, sxy = f
        var = sw * sxx - sx * sx
        b = max(0.0, (sw * sxy - sx * sy) / var) if var > 1e-9 else 0.0
        a = (sy - b * sx) / sw
        return max(a + b * (width - 1), 1e-3)

    def predicted_rate(self, batch: int, k: int) -> float | None:
        """Tokens per ms per request at ``k`` drafted tokens; None before the bucket is measured."""
        t = self.step_ms(batch, k + 1)
        return None if t is None else expected_tokens(self.alpha, k) / (t + self.gap_ms)

    def choose(self, batch: int) -> int:
        self.rounds += 1
        b = self.bucket(batch)
        seen = self.seen.get(b, set())
        # Plain decoding already wins here, or at a smaller batch size (verification only grows
        # costlier with the batch): drafts are tried rarely and short, since each try re-opens the
        # parked requests on the draft server.
        parked = self.best.get(b) == 0 or (b not in self.best and any(self.best.get(x) == 0 for x in range(b)))
        explore = self.rounds % (EXPLORE_PARKED if parked else EXPLORE_EVERY) == 0
        if 1 not in seen:
            k = 0
        elif len(seen) < 2:
            k = 1 if explore or not parked else 0
        elif explore:
            k = self.rng.randint(1, min(2, self.k_max)) if parked else self.rng.randint(0, self.k_max)
        else:
            k = max(range(self.k_max + 1), key=lambda k: self.predicted_rate(batch, k))
            self.best[b] = k
        self.chosen[k] += 1
        return k

    def observe(self, batch: int, width: int, step_ms: float, gap_ms: float | None, accepted: list[int],
                drafted: list[int]) -> None:
        """One round: ``step_ms`` the worker's whole step at ``width``; ``gap_ms`` the time since the
        previous step ended (None for the first); the accepted and drafted counts per request."""
        b = self.bucket(batch)
        f = self.fits.setdefault(b, [0.0] * 5)
        x = float(width - 1)
        for i, v in enumerate((1.0, x, step_ms, x * x, x * step_ms)):
            f[i] = DECAY * f[i] + v
        self.seen.setdefault(b, set()).add(width)
        m = self.means.setdefault((b, width), [step_ms, 0])
        m[0] = step_ms if m[1] == 0 else (1 - EMA) * m[0] + EMA * step_ms
        m[1] += 1
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
            # Expected step ms per batch-size bucket (1 = batch 1, 2 = 2-3, 3 = 4-7, ...) at plain
            # decoding and at the full draft; None where not yet estimable (a parked bucket).
            "ssd_auto_k_step_ms": {
                f"bucket{b}": [None if (t := self.step_ms(1 << (b - 1), w)) is None else round(t, 2)
                               for w in (1, self.k_max + 1)]
                for b in sorted(self.fits)
            },
        }
