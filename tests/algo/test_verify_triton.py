"""The Triton chain-verification kernel against the torch rule, on the same coins (interpreted on the
CPU: ``TRITON_INTERPRET=1``; on a GPU `make gpu-check` runs the same kernel compiled)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is defined: run it on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_ssd.algo.verify import _chain_torch, dense_proposal, verify_chain_probs  # noqa: E402

pytest.importorskip("triton")


def _case(b: int, k: int, v: int, seed: int, sharp: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(b, k + 1, v, generator=g) * sharp, -1)
    q = torch.softmax(torch.randn(b, k, v, generator=g) * sharp, -1)
    s = torch.multinomial(q.view(-1, v), 1, generator=g).view(b, k)
    u = torch.rand(b, k + 1, generator=g)
    return p, q, s, u


@pytest.mark.parametrize(("k", "v", "block"), [(4, 50, 16), (1, 33, 8), (3, 200, 64)])
def test_same_coins_same_outcome(k, v, block):
    from sglang_ssd.algo.verify_triton import chain_verify_triton

    p, q, s, u = _case(96, k, v, seed=k * 100 + v)
    n = torch.randint(0, k + 1, (96,), generator=torch.Generator().manual_seed(1))
    got_k, got_bonus = chain_verify_triton(p, s, q, n, u, block=block)
    ref = _chain_torch(p, s, q, None, n, u)
    assert torch.equal(got_k, ref.accept_len)  # the same float32 comparisons, decided identically
    assert (got_bonus == ref.bonus).float().mean() >= 0.99  # a CDF boundary may round differently
    # Every bonus is a token the rule can emit: positive residual after a rejection, positive p else.
    rows = torch.arange(96)
    p_k = p[rows, got_k]
    resid = (p_k - dense_proposal(q, s, v)[rows, got_k.clamp(max=k - 1)]).clamp_min(0)
    w = torch.where((got_k < n)[:, None], resid, p_k)
    assert (w[rows, got_bonus] > 0).all()


def test_point_masses_and_the_verify_entry_point():
    """Deterministic (fast-backup) rows as one-hot q, through ``verify_chain_probs(backend="triton")``."""
    p, q, s, u = _case(64, 3, 40, seed=7)
    det = torch.arange(64) % 2 == 0
    got = verify_chain_probs(p, s, q, deterministic=det, uniforms=u, backend="triton")
    ref = verify_chain_probs(p, s, q, deterministic=det, uniforms=u, backend="torch")
    assert torch.equal(got.accept_len, ref.accept_len)
    assert (got.tokens == ref.tokens).float().mean() >= 0.99


def test_follows_the_target_law():
    """Statistically exact on its own: the first emitted token is distributed as p_1 whatever q is."""
    from scipy.stats import chisquare

    from sglang_ssd.algo.verify_triton import chain_verify_triton

    v, n = 6, 2000
    g = torch.Generator().manual_seed(3)
    p1 = torch.softmax(torch.randn(v, generator=g) * 1.5, -1)
    q1 = torch.softmax(torch.randn(v, generator=g) * 1.5, -1)
    p = torch.stack([p1, p1]).expand(n, 2, v).contiguous()
    q = q1.expand(n, 1, v).contiguous()
    s = torch.multinomial(q1, n, replacement=True, generator=g).view(n, 1)
    u = torch.rand(n, 2, generator=g)
    k, bonus = chain_verify_triton(p, s, q, None, u, block=8)
    first = torch.where(k > 0, s[:, 0], bonus)
    counts = torch.bincount(first, minlength=v).double()
    expected = p1.double() / p1.double().sum() * counts.sum()
    assert chisquare(counts.numpy(), expected.numpy()).pvalue > 1e-3
    assert 0 < int((k > 0).sum()) < n  # both accepts and rejections were exercised
