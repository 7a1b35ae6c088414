"""The draft's proposal q′ and its counter-based sampling."""

from __future__ import annotations

import pytest
import torch
from scipy import stats

from sglang_ssd.algo.probs import SparseProbs
from sglang_ssd.algo.saguaro import saguaro_probs
from sglang_ssd.draft.ngram_backup import ContextLookup
from sglang_ssd.draft.sampler import RowParams, counter_uniforms, proposal, sample


def test_counter_uniforms_are_reproducible_and_uniform():
    pos = torch.arange(20000)
    u = counter_uniforms(123, pos)
    assert torch.equal(u, counter_uniforms(123, pos))
    assert u.dtype == torch.float32 and float(u.min()) >= 0 and float(u.max()) < 1
    counts = torch.histc(u, bins=20, min=0, max=1)
    assert stats.chisquare(counts.numpy()).pvalue > 1e-3
    # Another seed, or neighbouring positions, give unrelated streams.
    v = counter_uniforms(124, pos)
    assert abs(float(torch.corrcoef(torch.stack([u, v]))[0, 1])) < 0.05
    assert abs(float(torch.corrcoef(torch.stack([u[1:], u[:-1]]))[0, 1])) < 0.05
    # Large seeds and positions are fine (63-bit seeds, positions past 2^32).
    w = counter_uniforms((1 << 63) - 1, torch.tensor([0, 1 << 40]))
    assert w.shape == (2,) and w[0] != w[1]


@pytest.mark.parametrize(
    "params,num_top",
    [
        (RowParams(1.0), 0),
        (RowParams(0.7, c=0.3), 3),
        (RowParams(1.3, top_k=5, c=0.5, support=5), 2),
        (RowParams(1.0, support=6), 0),
        (RowParams(0.9, top_p=0.8, min_p=0.05), 0),
    ],
)
def test_sampled_tokens_follow_q(params, num_top):
    """The token drawn at each position has exactly the law q′ the verifier will be told about."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0]])
    q = proposal(logits, params, num_top)
    dense = q.to_dense() if isinstance(q, SparseProbs) else q
    assert torch.allclose(dense.sum(-1), torch.ones(1))
    n = 20000
    qs = SparseProbs(q.indices.expand(n, -1), q.probs.expand(n, -1), 8) if isinstance(q, SparseProbs) else q.expand(n, -1)
    toks = sample(qs, 77, torch.arange(n))
    counts = torch.bincount(toks, minlength=8).double()
    support = dense[0] > 0
    assert counts[~support].sum() == 0
    expected = dense[0][support].double() * n
    assert stats.chisquare(counts[support].numpy(), expected.numpy() * counts.sum().item() / expected.sum().item()).pvalue > 1e-3


def test_proposal_matches_saguaro_and_filters():
    logits = torch.randn(4, 50) * 3
    q = proposal(logits, RowParams(0.8, c=0.25), num_top=4)
    torch.testing.assert_close(q, saguaro_probs(logits, 0.8, num_top=4, C=0.25))
    for support in (None, 7):
        plain = proposal(logits, RowParams(1.3, support=support), num_top=0)
        ref = saguaro_probs(logits, 1.3, support=support)
        if support is None:
            torch.testing.assert_close(plain, ref, atol=1e-6, rtol=0)
        else:
            assert torch.equal(plain.indices, ref.indices)
            torch.testing.assert_close(plain.probs, ref.probs, atol=1e-6, rtol=0)
    greedy = proposal(logits, RowParams(0.0, support=1), num_top=4)
    assert isinstance(greedy, SparseProbs) and torch.equal(greedy.indices[:, 0], logits.argmax(-1))
    top = proposal(logits, RowParams(1.0, top_k=3), num_top=0)
    assert int((top > 0).sum(-1).max()) == 3


def test_context_lookup():
    assert ContextLookup().propose([1, 2, 3], 4) == []
    assert ContextLookup().propose([5, 1, 2, 3, 9, 9, 1, 2, 3], 3) == [9, 9, 1]
    # A periodic tail continues its period.
    assert ContextLookup().propose([4, 7, 8, 7, 8], 5) == [7, 8, 7, 8, 7]
    # Incremental use as a request grows: the index only ever sees the same growing list.
    lk, toks = ContextLookup(), [3, 1, 4, 1]
    assert lk.propose(toks, 2) == [4, 1]
    toks += [5, 9, 2, 6, 5]
    assert lk.propose(toks, 2) == [9, 2]
    with pytest.raises(ValueError):
        ContextLookup(min_n=0)
