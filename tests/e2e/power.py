"""The e2e sampling-law test and its power: next-token counts in repeated contexts against the exact law.

A *cell* is a conditioning context that ``n`` samples passed through; its next-token counts are binned
(tokens expected ≥ `MIN_EXPECTED` times each, the rest lumped into one bin) and compared with the
target's exact law on those bins. Two statistics, summed over the cells:

- Pearson's chi-square: any shape of deviation;
- Z, the standardized excess of each cell's most likely token (signed, summed over cells): a law that
  is too concentrated or too flat everywhere. Pearson is nearly blind to the first kind at these
  sample sizes: emptying a bin expected 2-4 times looks like a good fit.

Each is calibrated by simulation under the exact law (multinomial draws, `NULL_REPS`), not by the
chi-square approximation, which is poor for small cells; the test rejects when either exceeds its
quantile at `ALPHA / 2` (Bonferroni), so its false-alarm rate is at most `ALPHA`.

Power is stated against a total-variation bias δ on every tested cell, TV measured over the cell's
bins, by simulating the test under three such alternatives and taking the smallest rejection rate:
δ of mass moved proportionally off the most likely token onto the others, the reverse, and the
alternative with the least Pearson divergence (moving δ from a bin set B onto its complement A costs
at least δ²/p(A) + δ²/p(B), equality for proportional moves, so it puts p(A) as near ½ as the bins
allow).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ALPHA = 0.001
DELTA = 0.05
MIN_EXPECTED = 5.0
NULL_REPS = 50000  # draws under the exact law for the critical values and the p-value
ALT_REPS = 2000  # draws under each alternative for the power


@dataclass
class Cell:
    """One conditioning context: ``n`` samples passed through it; ``probs`` its exact next-token law
    over the test's bins (the last bin is the lumped rest); ``counts`` the observed counts per bin."""

    name: str
    n: int
    probs: np.ndarray
    counts: np.ndarray | None = None
    keep: list[int] | None = None  # the token ids of the bins before the lumped rest
    context: tuple = ()  # the generated tokens this cell conditions on

    @property
    def top(self) -> int:
        """The bin of the most likely kept token (-1 when every token is lumped)."""
        return int(np.argmax(self.probs[:-1])) if len(self.probs) > 1 else -1

    def binned(self, law: np.ndarray) -> np.ndarray:
        """Another law over the vocabulary, on this cell's bins."""
        kept = [float(law[t]) for t in self.keep]
        return np.array(kept + [max(0.0, 1.0 - sum(kept))])


def bins(probs: np.ndarray, n: int, observed: dict[int, int] | None = None) -> tuple[list[int], np.ndarray, np.ndarray]:
    """(kept token ids, bin probabilities, bin counts): tokens expected ≥ MIN_EXPECTED times, rest lumped."""
    keep = np.nonzero(probs * n >= MIN_EXPECTED)[0].tolist()
    p = np.array([probs[t] for t in keep] + [max(0.0, 1.0 - float(sum(probs[t] for t in keep)))])
    obs = observed or {}
    c = np.array([obs.get(t, 0) for t in keep] + [n - sum(obs.get(t, 0) for t in keep)], dtype=np.int64)
    return keep, p, c


def pearson(counts: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """Pearson chi-square; counts may be [..., bins] (vectorized over leading axes)."""
    n = counts.sum(-1, keepdims=True)
    exp = n * probs
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(exp > 0, (counts - exp) ** 2 / np.where(exp > 0, exp, 1.0), 0.0)
    return terms.sum(-1)


def dof(cells: list[Cell]) -> int:
    return sum(int((c.probs > 0).sum()) - 1 for c in cells)


def _statistics(cells: list[Cell], draws: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(Pearson, |Z|) summed over cells; ``draws[i]``: counts of cell i, shape [reps, bins]."""
    chi = sum(pearson(d, c.probs) for c, d in zip(cells, draws))
    excess = sum(d[:, c.top] - c.n * c.probs[c.top] for c, d in zip(cells, draws) if c.top >= 0)
    var = sum(c.n * c.probs[c.top] * (1 - c.probs[c.top]) for c in cells if c.top >= 0)
    z = np.abs(excess) / np.sqrt(var) if var > 0 else np.zeros_like(chi)
    return chi, z


def _draw(cells: list[Cell], laws: list[np.ndarray], reps: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return _statistics(cells, [rng.multinomial(c.n, law / law.sum(), size=reps) for c, law in zip(cells, laws)])


@dataclass
class Calibration:
    chi: np.ndarray  # Pearson under the exact law, sorted
    z: np.ndarray  # |Z| under the exact law, sorted

    def critical(self, alpha: float = ALPHA) -> tuple[float, float]:
        q = 1 - alpha / 2
        return float(np.quantile(self.chi, q, method="higher")), float(np.quantile(self.z, q, method="higher"))

    def p_value(self, chi: float, z: float) -> float:
        """Bonferroni over the two simulated p-values, each (1 + #simulated ≥ observed) / (1 + reps)."""
        r = len(self.chi)
        p_chi = (1 + r - np.searchsorted(self.chi, chi, side="left")) / (1 + r)
        p_z = (1 + r - np.searchsorted(self.z, z, side="left")) / (1 + r)
        return float(min(1.0, 2 * min(p_chi, p_z)))


def calibrate(cells: list[Cell], reps: int = NULL_REPS, seed: int = 11) -> Calibration:
    chi, z = _draw(cells, [c.probs for c in cells], reps, seed)
    return Calibration(np.sort(chi), np.sort(z))


def rejection_rate(cells: list[Cell], laws: list[np.ndarray], cal: Calibration, alpha: float = ALPHA,
                   reps: int = ALT_REPS, seed: int = 0) -> float:
    """How often the test rejects when each cell's counts are multinomial(n, law)."""
    crit_chi, crit_z = cal.critical(alpha)
    chi, z = _draw(cells, laws, reps, seed)
    return float(((chi > crit_chi) | (z > crit_z)).mean())


def least_divergence(probs: np.ndarray, delta: float = DELTA) -> np.ndarray | None:
    """The alternative at TV δ (over these bins) with the smallest Pearson divergence from ``probs``;
    None if there is none (one bin)."""
    k = len(probs)
    if k < 2:
        return None
    grid = 20000
    w = np.rint(probs * grid).astype(np.int64)
    reach = {0: ()}  # subset sums, one subset each (bins are few: at most n / MIN_EXPECTED + 1)
    for i, wi in enumerate(w):
        for s, subset in list(reach.items()):
            reach.setdefault(s + int(wi), (*subset, i))
    best, best_set = None, None
    for subset in reach.values():
        if not subset or len(subset) == k:
            continue
        pa = float(probs[list(subset)].sum())
        if pa <= 0 or 1 - pa < delta:
            continue
        div = delta**2 / pa + delta**2 / (1 - pa)
        if best is None or div < best:
            best, best_set = div, subset
    if best_set is None:
        return None
    a = np.zeros(k, dtype=bool)
    a[list(best_set)] = True
    return _move(probs, ~a, a, delta)


def _move(probs: np.ndarray, src: np.ndarray, dst: np.ndarray, delta: float) -> np.ndarray | None:
    """δ moved from the bins ``src`` to the bins ``dst``, proportionally inside each; None if src
    holds less than δ or either side is empty."""
    ps, pd = probs[src].sum(), probs[dst].sum()
    if ps < delta or pd <= 0 or not src.any():
        return None
    alt = probs.copy()
    alt[dst] += delta * probs[dst] / pd
    alt[src] -= delta * probs[src] / ps
    return np.clip(alt, 0.0, 1.0)


def alternatives(c: Cell, delta: float = DELTA) -> dict[str, np.ndarray]:
    """The cell's law under each TV-δ alternative (the exact law where a direction is impossible)."""
    out = {"least divergence": least_divergence(c.probs, delta)}
    if c.top >= 0:
        top = np.zeros(len(c.probs), dtype=bool)
        top[c.top] = True
        out["off the top token"] = _move(c.probs, top, ~top, delta)
        out["onto the top token"] = _move(c.probs, ~top, top, delta)
    else:
        out["off the top token"] = out["onto the top token"] = None
    return {k: c.probs if v is None else v for k, v in out.items()}


def power(cells: list[Cell], cal: Calibration, delta: float = DELTA, alpha: float = ALPHA,
          biased: list[bool] | None = None) -> dict[str, float]:
    """Rejection rate under each TV-δ alternative on every cell (or on the cells marked ``biased``)."""
    alts = [alternatives(c, delta) for c in cells]
    out = {}
    for kind in alts[0] if alts else ():
        laws = [a[kind] if biased is None or biased[i] else c.probs for i, (c, a) in enumerate(zip(cells, alts))]
        out[kind] = rejection_rate(cells, laws, cal, alpha)
    return out


def false_alarm(cells: list[Cell], cal: Calibration, alpha: float = ALPHA, reps: int = NULL_REPS) -> float:
    """The rejection rate under the exact law, from draws independent of the calibration's."""
    return rejection_rate(cells, [c.probs for c in cells], cal, alpha, reps, seed=12)


def observed(cells: list[Cell], cal: Calibration) -> tuple[float, float, float]:
    """(p-value, Pearson, |Z|) of the observed counts."""
    chi, z = _statistics(cells, [c.counts[None, :] for c in cells])
    return cal.p_value(float(chi[0]), float(z[0])), float(chi[0]), float(z[0])
