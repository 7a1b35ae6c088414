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
