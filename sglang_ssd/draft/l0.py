"""L0 of a recursive chain (docs/ALGORITHM.md §9): the smallest drafter proposes tokens for the draft model.

L0 here is the project's n-gram drafter (``draft/ngram.py``). It samples at its own temperature τ₀
from its smoothed distribution (top ``top`` tokens, sharpened to p^(1/τ₀)); τ₀ = 0 is the greedy
chain, a point-mass proposal. The draft model (L1) verifies those tokens with the SD rule
(``draft/recursive.py``), so what L1 emits has exactly L1's law whatever L0 proposes — τ₀ only moves
L1's acceptance rate. Calibration is therefore free of risk: while ``temperature="auto"``, every L1
verification row whose context is real reports the overlap Σ min(q₁, q₀,τ) — the probability that L1
accepts L0's token — for each τ of ``grid``, and after ``calib_rows`` rows the best τ is kept.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .ngram import NgramDraft
from .sampler import STREAM_L0_DRAW, counter_uniforms


@dataclass(frozen=True)
class L0Proposal:
    """``tokens``: full ids g_1..g_m. ``probs``: per token, the dense L0 distribution it was drawn from
    (full vocabulary), or None when L0 drew greedily (point masses)."""

    tokens: list[int]
    probs: list[torch.Tensor] | None


@dataclass
class L0Level:
    """``tokens``: proposals per L1 verification (m); ``temperature``: τ₀ ≥ 0 or "auto"."""

    drafter: NgramDraft
    tokens: int = 3
    temperature: float | str = "auto"
    grid: tuple[float, ...] = (0.0, 0.3, 0.6, 1.0)
    top: int = 32
    calib_rows: int = 256
    overlap_sum: dict[float, float] = field(default_factory=dict)
    rows_seen: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.tokens, int) or self.tokens < 1:
            raise ValueError(f"L0 tokens per step must be an int ≥ 1, got {self.tokens!r}")
        if self.temperature != "auto" and (not isinstance(self.temperature, int | float) or self.temperature < 0):
            raise ValueError(f"L0 temperature must be ≥ 0 or 'auto', got {self.temperature!r}")
        if not self.grid or any(t < 0 for t in self.grid):
            raise ValueError(f"L0 temperature grid must hold values ≥ 0, got {self.grid!r}")
        self.overlap_sum = {t: 0.0 for t in self.grid}

    @classmethod
    def load(cls, path: str, tokens: int = 3, temperature: float | str = "auto") -> L0Level:
        return cls(NgramDraft.load(path), tokens, temperature)

    # ---- temperature ---------------------------------------------------------------------------------
    @property
    def calibrating(self) -> bool:
        return self.temperature == "auto" and self.rows_seen < self.calib_rows

    @property
    def tau(self) -> float:
        """τ₀ in use: the manual value, else the best measured so far (greedy until measured)."""
        if self.temperature != "auto":
            return float(self.temperature)
        if not self.rows_seen:
            return 0.0
        return max(self.grid, key=lambda t: (self.overlap_sum[t], -t))

    def measured(self) -> dict[str, float]:
        """Mean measured L1 acceptance of an L0 token per τ (the calibration table)."""
        n = max(self.rows_seen, 1)
        return {f"{t:g}": self.overlap_sum[t] / n for t in self.grid}

    def _dense(self, context: list[int], vocab: int, tau: float) -> torch.Tensor:
        ids, probs = self.drafter.distribution(context, self.top)
        if tau > 0:
            w = probs.double().log() / tau
            probs = torch.softmax(w, dim=0).float()
        else:
            probs = torch.zeros_like(probs)
            probs[0] = 1.0  # ids are sorted by decreasing probability
        return torch.zeros(vocab).index_add_(0, ids, probs)

    def observe(self, context: list[int], q1_full: torch.Tensor) -> None:
        """One L1 row on a real context: add Σ min(q₁, q₀,τ) for every τ of the grid."""
        if not self.calibrating:
            return
        try:
            for t in self.grid:
                self.overlap_sum[t] += float(torch.minimum(q1_full, self._dense(context, q1_full.shape[-1], t)).sum())
        except ValueError:  # the drafter knows nothing about this context
            return
        self.rows_seen += 1

    # ---- proposing -----------------------------------------------------------------------------------
    def propose(self, context: list[int], m: int, seed: int, pos0: int, vocab: int) -> L0Proposal:
        """Up to ``m`` tokens after ``context``; the i-th sits at absolute position ``pos0 + i``.
        Draws use the (seed, position) counter stream reserved for L0, so they are reproducible."""
        if m <= 0:
            return L0Proposal([], None)
        tau = self.tau
        if tau == 0:
            return L0Proposal(self.drafter.propose(list(context), m), None)
        ctx, toks, dists = list(context), [], []
        u = counter_uniforms(seed, torch.arange(pos0, pos0 + m), STREAM_L0_DRAW)
        for i in range(m):
            try:
                q = self._dense(ctx, vocab, tau)
            except ValueError:
                break
            cdf = q.cumsum(0)
            tok = int(torch.searchsorted(cdf, u[i] * cdf[-1], right=True).clamp(max=vocab - 1))
            if q[tok] <= 0:
                tok = int(q.argmax())
            toks.append(tok)
            dists.append(q)
            ctx.append(tok)
        return L0Proposal(toks, dists)
