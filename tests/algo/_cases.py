"""The whole-block law cases: each names a configuration, simulates it, and judges the block's law.

Shared by ``test_verify_exact.py`` (every case must pass) and ``tests/mutants`` (each planted bug must
make at least one named case reject the law).

The law test: Pearson chi-square of the n-token sequences (cells with expected count < 5 pooled)
against the exact law, rejected at p < ALPHA = 1e-3, the false-alarm rate of one case. Power: by
``_stats.detectable_tv`` each case states the smallest total-variation bias it detects with
probability 0.9; the case asserts that this is ≤ MAX_TV = 0.03. Greedy cases (T = 0) must emit the
target's greedy chain on every row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import torch

from ._harness import (
    Block,
    Setup,
    cascade_block,
    chain_block,
    encode,
    exact_law,
    greedy_chain,
    recursive_block,
)
from ._stats import Fit, chi_square, detectable_tv

ALPHA = 1e-3
MAX_TV = 0.03
#: The bonus after full acceptance must be seen: at least this share of rows accepted every draft.
MIN_FULL = 0.01


@dataclass(frozen=True)
class Result:
    label: str
    fit: Fit | None  # None for greedy cases
    greedy_ok: bool | None
    full_share: float
    detectable: float
    max_tv: float = MAX_TV

    @property
    def rejected(self) -> bool:
        """The law test says this is not the target's law."""
        if self.fit is None:
            return not self.greedy_ok
        return self.fit.pvalue < ALPHA

    def __str__(self) -> str:
        if self.fit is None:
            return f"{self.label}: greedy chain on every row: {self.greedy_ok}; full acceptance {self.full_share:.3f}"
        return (
            f"{self.label}: {self.fit}; full acceptance {self.full_share:.3f}; "
            f"power 0.9 at TV >= {self.detectable:.4f}"
        )

    def check(self) -> None:
        assert not self.rejected, f"law rejected: {self}"
        assert self.full_share >= MIN_FULL, f"too few rows reach the bonus after full acceptance: {self}"
        if self.fit is not None:
            assert self.detectable <= self.max_tv, f"too little power: {self}"


@dataclass(frozen=True)
class Case:
    name: str
    setup: Setup
    level: str = "chain"  # chain | cascade (algo/cascade.py) | recursive (draft/recursive.py)
    rows: int = 100_000
    tau_mid: float = 1.2  # cascade: the middle level's temperature (multiplies the request's)
    l0: str = "point"  # recursive: L0's kind
    max_tv: float = MAX_TV  # the power this case must have (see the module doc)
    backend: str = "auto"  # cascade: the verifier's backend

    @property
    def n(self) -> int:
        """Block length: K+1 (K+2 when a middle level's bonus is itself a draft)."""
        return self.setup.K + (2 if self.level == "cascade" else 1)

    @cached_property
    def law(self) -> torch.Tensor:
        return exact_law(self.setup, self.n)

    def sample(self, verify=None) -> Block:
        s = self.setup
        if self.level == "chain":
            return chain_block(s, self.rows, verify=verify)
        if self.level == "cascade":
            return cascade_block(s, self.tau_mid * s.temperature, self.rows, self.backend)
        return recursive_block(s, self.rows, l0=self.l0)

    def evaluate(self, verify=None) -> Result:
        block = self.sample(verify)
        full = float(block.full.float().mean())
        if self.setup.greedy:
            want = torch.tensor(greedy_chain(self.setup, self.n))
            return Result(self.name, None, bool((block.tokens == want).all()), full, 0.0)
        fit = chi_square(encode(block.tokens, self.setup.vocab), self.law)
        return Result(self.name, fit, None, full, detectable_tv(fit.df, fit.n, ALPHA), self.max_tv)


def _chain_cases() -> list[Case]:
    # Every proposal kind at K = 1, 2, 4; the C × filters grid in full at K = 2, two corners at K = 1, 4.
    # The temperature alternates between 1.0 and 0.7 (0.7 catches a temperature applied twice).
    grid = {
        1: [("dense", 1.0, False, 1.0), ("sparse", 0.3, True, 0.7)],
        2: [(kind, C, f, T) for kind in ("dense", "sparse")
            for C, f, T in ((1.0, False, 1.0), (1.0, True, 0.7), (0.3, False, 0.7), (0.3, True, 1.0))],
        4: [("dense", 1.0, False, 1.0), ("dense", 0.3, True, 0.7), ("sparse", 0.3, False, 0.7),
            ("sparse", 1.0, True, 1.0)],
    }  # fmt: skip
    out = []
    for K, combos in grid.items():
        rows = 200_000 if K == 4 else 100_000
        # point masses at K = 4 and T = 1 rarely pass all four: T = 0.7 there
        point_t = 0.7 if K == 4 else 1.0
        combos = combos + [
            ("point", 1.0, False, point_t),
            ("point", 1.0, True, 0.7),
            ("mixed", 0.3, True, 0.7),
        ]
        if K == 1:
            combos.remove(("point", 1.0, True, 0.7))
        for kind, C, filters, T in combos:
            # a guesser must often guess the target's likeliest token to pass K of them: a closer draft
            noise = 0.3 if kind == "point" else 0.6
            s = Setup(
                kind=kind, K=K, C=C, filters=filters, temperature=T, noise=noise, seed=K * 100 + len(out)
            )
            label = "filtered" if filters else "plain"
            out.append(Case(f"{kind}-K{K}-C{C:g}-{label}-T{T:g}", s, rows=rows))
    # greedy: token-identical to the target's greedy chain. A greedy draft either always or never
    # matches, so the draft is the target itself; the point guesser's random guesses still reject.
    g = dict(temperature=0.0, noise=0.0)
    out += [
        Case("greedy-dense-K4-draft=target", Setup(kind="dense", K=4, **g), rows=20_000),
        Case("greedy-point-K4-filtered", Setup(kind="point", K=4, filters=True, **g), rows=20_000),
        Case("greedy-mixed-K2-C0.3", Setup(kind="mixed", K=2, C=0.3, filters=True, **g), rows=20_000),
    ]
    # penalties and logit bias through the server's own function (sglang/target_logits.py), against
    # plain sampling with the committed context's penalties held for the round
    out += [
        Case("penalties-sparse-K2-C0.3-T1", Setup(kind="sparse", K=2, C=0.3, penalties=True, seed=31)),
        Case("penalties-point-K4-filtered-T0.7",
             Setup(kind="point", K=4, filters=True, penalties=True, temperature=0.7, noise=0.3, seed=32),
             rows=200_000),
        Case("penalties-greedy-dense-K2", Setup(kind="dense", K=2, penalties=True, **g), rows=20_000),
    ]  # fmt: skip
    return out


def _cascade_cases() -> list[Case]:
    base = Setup(kind="dense", C=0.3, seed=41)
    return [
        Case("cascade-dense-K1-C0.3-T1", replace(base, K=1), "cascade"),
        Case("cascade-dense-K2-C0.3-T1", replace(base, K=2), "cascade"),
        Case("cascade-dense-K4-C0.3-T1-V4", replace(base, K=4, vocab=4), "cascade", rows=200_000),
        Case(
            "cascade-sparse-K2-C0.3-filtered-T0.7",
            replace(base, kind="sparse", K=2, filters=True, temperature=0.7),
            "cascade",
        ),  # fmt: skip
        Case(
            "cascade-point-K2-T0.7-midT1",
            replace(base, kind="point", K=2, temperature=0.7),
            "cascade",
            tau_mid=1 / 0.7,
        ),  # fmt: skip
        Case(
            "cascade-greedy-K2-middle=target",
            replace(base, K=2, temperature=0.0, mid_noise=0.0),
            "cascade",
            rows=20_000,
        ),  # fmt: skip
    ]


def _recursive_cases() -> list[Case]:
    # The counter uniforms are drawn per L1 step and row (Python): fewer rows and cells, so less power
    # (TV 0.04). K = 4 takes ~10 s of one core: it runs under `make mutants` (EXTRA_CASES), not in `make test`.
    return [
        Case("recursive-pointL0-K2-C0.3-T1-V3", Setup(K=2, C=0.3, vocab=3, seed=51), "recursive", rows=10_000,
             max_tv=0.04),
        Case("recursive-sampledL0-K1-T0.7-V4", Setup(K=1, temperature=0.7, vocab=4, seed=52), "recursive",
             rows=8_000, l0="sampled", max_tv=0.04),
    ]  # fmt: skip


def _extra_cases() -> list[Case]:
    return [
        Case("recursive-pointL0-K4-filtered-T1-V3", Setup(K=4, filters=True, vocab=3, seed=53), "recursive",
             rows=8_000, max_tv=0.04),
    ]  # fmt: skip


#: The cases `make test` runs (tests/algo/test_verify_exact.py).
CASES: dict[str, Case] = {c.name: c for c in _chain_cases() + _cascade_cases() + _recursive_cases()}
#: Slower ones that only `make mutants` runs (clean, then under the planted bugs that name them).
EXTRA_CASES: dict[str, Case] = {c.name: c for c in _extra_cases()}
ALL_CASES: dict[str, Case] = {**CASES, **EXTRA_CASES}
