"""The rule `make gpu-check` uses to call a Triton-vs-torch bonus difference rounding (runs on the CPU)."""

from __future__ import annotations

import torch

from bench.gpu_check import ROUNDING_TOL, bonus_rounding_gaps
from sglang_ssd.algo.verify import _chain_torch


def _case(b=64, k=3, v=500, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g) * 3, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * 3, -1)
    s = torch.multinomial(q.view(-1, v), 1, generator=g).view(b, k)
    n = torch.randint(0, k + 1, (b,), generator=g)
    return p, q, s, n, torch.rand(b, k + 1, generator=g)


def test_identical_draws_have_nothing_to_explain():
    p, q, s, n, u = _case()
    ref = _chain_torch(p, s, q, None, n, u)
    assert bonus_rounding_gaps(p, q, n, u, ref.accept_len, ref.bonus, ref.bonus.clone()) == ([], [])


def test_a_coin_on_a_boundary_is_rounding():
    """Neighbouring tokens drawn with the coin exactly on their shared CDF boundary: gap and mass 0."""
    p, q, s, n, u = _case()
    k = torch.zeros_like(n)
    n = torch.zeros_like(n)  # full acceptance of nothing: the bonus law is p at position 0
    t = 123
    cdf = p[:, 0].double().cumsum(-1) / p[:, 0].double().sum(-1, keepdim=True)
    u[:, -1] = cdf[:, t].float()
    a, b = torch.full_like(n, t), torch.full_like(n, t + 1)
    gaps, masses = bonus_rounding_gaps(p, q, n, u, k, a, b)
    assert len(gaps) == len(n) and max(gaps + masses) < ROUNDING_TOL


def test_a_wrong_draw_is_not_rounding():
    """Planted: the other route returns a token far from the coin's. The check must refuse it."""
    p, q, s, n, u = _case()
    ref = _chain_torch(p, s, q, None, n, u)
    wrong = (ref.bonus + p.shape[-1] // 2) % p.shape[-1]
    gaps, masses = bonus_rounding_gaps(p, q, n, u, ref.accept_len, ref.bonus, wrong)
    assert len(gaps) == len(n) and max(gaps + masses) > 100 * ROUNDING_TOL
