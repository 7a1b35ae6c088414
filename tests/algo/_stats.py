"""Goodness-of-fit against a known law: chi-square (torch only) and total variation."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Fit:
    pvalue: float
    tv: float
    chi2: float
    df: int
    n: int

    def __str__(self) -> str:
        return f"p={self.pvalue:.3g} TV={self.tv:.4f} chi2={self.chi2:.1f} df={self.df} n={self.n}"


def histogram(samples: torch.Tensor, cells: int) -> torch.Tensor:
    return torch.bincount(samples.long().flatten(), minlength=cells).double()


def chi_square(samples: torch.Tensor, law: torch.Tensor, min_expected: float = 5.0) -> Fit:
    """Fit of integer ``samples`` in [0, len(law)) to the exact ``law``.

    Cells with expected count < ``min_expected`` are pooled into one; a sample in a cell of law 0 gives
    p = 0 outright (the law says it cannot happen).
    """
    law = law.double().flatten() / law.double().sum()
    n = samples.numel()
    observed = histogram(samples, law.numel())
    if observed.numel() > law.numel():
        return Fit(0.0, 1.0, float("inf"), 0, n)
    tv = 0.5 * float((observed / n - law).abs().sum())
    if bool(((law == 0) & (observed > 0)).any()):
        return Fit(0.0, tv, float("inf"), 0, n)
    expected = law * n
    big = expected >= min_expected
    obs = observed[big]
    exp = expected[big]
    small_exp = float(expected[~big].sum())
    if small_exp > 0:
        obs = torch.cat([obs, observed[~big].sum().view(1)])
        exp = torch.cat([exp, torch.tensor([small_exp], dtype=torch.float64)])
    df = obs.numel() - 1
    if df <= 0:
        return Fit(1.0, tv, 0.0, 0, n)
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    pvalue = float(
        torch.special.gammaincc(
            torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(chi2 / 2.0, dtype=torch.float64)
        )
    )
    return Fit(pvalue, tv, chi2, df, n)


# ---- power -------------------------------------------------------------------------------------------
#
# Pearson's statistic on n draws from a law g, tested against f, is about non-central chi-square with
# df degrees of freedom and non-centrality lam = n * chi2(g || f). By Cauchy-Schwarz
# chi2(g || f) >= (sum |g - f|)^2 = 4 TV(g, f)^2, so lam >= 4 n TV^2 whatever shape the bias has.
# detectable_tv is the smallest TV that a level-alpha test rejects with the given power (Patnaik's
# approximation of the non-central law; the bound holds on the cells as pooled).


def _upper(df: float, x: float) -> float:
    """P(chi2_df > x)."""
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(x / 2.0, dtype=torch.float64)
        )
    )


def _bisect(f, lo: float, hi: float, iters: int = 100) -> float:
    """The root of an increasing f on [lo, hi]."""
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return hi


def critical_value(df: int, alpha: float) -> float:
    return _bisect(lambda x: alpha - _upper(df, x), 0.0, df + 50.0 * (df + 10) ** 0.5 + 100.0)


def power(df: int, lam: float, alpha: float) -> float:
    """P(reject) at non-centrality ``lam`` (Patnaik: lam-shifted chi2 ~ c * chi2_h)."""
    crit = critical_value(df, alpha)
    c = (df + 2 * lam) / (df + lam)
    h = (df + lam) ** 2 / (df + 2 * lam)
    return _upper(h, crit / c)


def detectable_tv(df: int, n: int, alpha: float, want: float = 0.9) -> float:
    """Smallest TV bias detected with probability ``want`` by a level-``alpha`` test of n draws."""
    if df <= 0:
        return 1.0
    lam = _bisect(lambda x: power(df, x, alpha) - want, 0.0, 1e3 * (df + 10.0))
    return (lam / (4.0 * n)) ** 0.5
