"""The target's processed distribution and the draft's σ_{F,C}, against plain per-row definitions."""

from __future__ import annotations

import math

import pytest
import torch

from sglang_ssd.algo import SamplingBatch, SparseProbs, apply_penalties, process_logits, saguaro_probs

V = 12


def naive_process(logits, T, top_k, top_p, min_p, allowed):
    """One row, written out: mask, temperature, joint top-k/top-p/min-p, renormalize."""
    z = [x if ok else -math.inf for x, ok in zip(logits, allowed)]
    if T <= 1e-6 or top_k == 1:
        best = max(range(len(z)), key=lambda i: (z[i], -i))
        return [1.0 if i == best else 0.0 for i in range(len(z))]
    m = max(z)
    e = [math.exp((x - m) / T) for x in z]
    s = sum(e)
    p = [x / s for x in e]
    order = sorted(range(len(p)), key=lambda i: -p[i])
    keep, before = set(), 0.0
    for rank, i in enumerate(order):
        if (
            rank < (top_k if 0 < top_k < len(p) else len(p))
            and (before <= top_p or top_p >= 1)
            and p[i] >= min_p * p[order[0]]
        ):
            keep.add(i)
        before += p[i]
    s = sum(p[i] for i in keep)
    return [p[i] / s if i in keep else 0.0 for i in range(len(p))]


@pytest.mark.parametrize(
    "T,top_k,top_p,min_p",
    [
        (1.0, -1, 1.0, 0.0),
        (0.7, 5, 1.0, 0.0),
        (1.0, -1, 0.8, 0.0),
        (1.3, -1, 1.0, 0.1),
        (0.9, 6, 0.85, 0.05),
        (0.0, -1, 1.0, 0.0),
        (1.0, 1, 1.0, 0.0),
        (1.0, 100, 1.0, 0.0),
    ],
)
def test_process_logits_matches_naive_definition(T, top_k, top_p, min_p):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 3, V, generator=g) * 2
    allowed = torch.rand(6, 3, V, generator=g) < 0.8
    allowed[..., 0] = True
    sampling = SamplingBatch.make(6, T, top_k=top_k, top_p=top_p, min_p=min_p)
    got = process_logits(logits, sampling, allowed)
    for b in range(6):
        for i in range(3):
            want = naive_process(logits[b, i].tolist(), T, top_k, top_p, min_p, allowed[b, i].tolist())
            assert got[b, i].tolist() == pytest.approx(want, abs=1e-6)


def test_per_request_settings_in_one_batch():
    logits = torch.randn(3, 2, V, generator=torch.Generator().manual_seed(1))
    sampling = SamplingBatch.make(3, [0.0, 0.7, 1.0], top_k=[-1, 4, -1], top_p=[1.0, 1.0, 0.7])
    got = process_logits(logits, sampling)
    for b, (T, k, p) in enumerate([(0.0, -1, 1.0), (0.7, 4, 1.0), (1.0, -1, 0.7)]):
        for i in range(2):
            want = naive_process(logits[b, i].tolist(), T, k, p, 0.0, [True] * V)
            assert got[b, i].tolist() == pytest.approx(want, abs=1e-6)
    assert sampling.greedy.tolist() == [True, False, False]


def test_penalties_use_each_positions_own_history():
    g = torch.Generator().manual_seed(2)
    B, K = 2, 3
    logits = torch.randn(B, K + 1, V, generator=g)
    drafts = torch.tensor([[1, 1, 4], [0, 5, 5]])
    counts = torch.zeros(B, V)
    counts[0, 4] = 2
    counts[1, 7] = 1
    freq, pres, rep = torch.tensor([0.3, 0.5]), torch.tensor([0.2, 0.0]), torch.tensor([1.5, 1.2])
    got = apply_penalties(logits, drafts, counts, frequency=freq, presence=pres, repetition=rep)
    for b in range(B):
        hist = counts[b].clone()
        for i in range(K + 1):
            row = logits[b, i].clone()
            row -= freq[b] * hist + pres[b] * (hist > 0)
            scale = torch.where(hist > 0, rep[b], torch.tensor(1.0))
            row = torch.where(row < 0, row * scale, row / scale)
            assert torch.allclose(got[b, i], row, atol=1e-6)
            if i < K:
                hist[drafts[b, i]] += 1


def naive_saguaro(logits, T, F, C):
    z = [x / T for x in logits]
    top = set(sorted(range(len(z)), key=lambda i: -z[i])[:F])
    w = [(C if i in top else 1.0) * math.exp(x) for i, x in enumerate(z)]
    s = sum(w)
    return [x / s for x in w]


@pytest.mark.parametrize("T,F,C", [(1.0, 0, 1.0), (0.7, 3, 0.3), (1.3, 4, 0.05), (1.0, 2, 0.0)])
def test_saguaro_matches_definition(T, F, C):
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(3))
    q = saguaro_probs(logits, T, num_top=F, C=C)
    for b in range(5):
        assert q[b].tolist() == pytest.approx(naive_saguaro(logits[b].tolist(), T, F, C), abs=1e-6)


def test_saguaro_sparse_is_the_truncated_distribution():
    logits = torch.randn(5, V, generator=torch.Generator().manual_seed(4))
    S = 6
    q = saguaro_probs(logits, 0.8, num_top=3, C=0.3, support=S)
    assert isinstance(q, SparseProbs) and q.support == S
    for b in range(5):
        top = sorted(range(V), key=lambda i: -logits[b, i].item())[:S]
        want = naive_saguaro([logits[b, i].item() for i in top], 0.8, 3, 0.3)
        assert q.indices[b].tolist() == top
        assert q.probs[b].tolist() == pytest.approx(want, abs=1e-6)


def test_saguaro_lower_C_moves_residual_onto_top_tokens():
    """The point of σ_{F,C}: with p ≈ q, max(p − q′, 0) concentrates on the down-weighted top tokens."""
    logits = torch.randn(1, V, generator=torch.Generator().manual_seed(5))
    p = torch.softmax(logits, -1)[0]
    top = torch.topk(logits[0], 3).indices
    for C, least in ((1.0, 0.0), (0.3, 0.99)):
        resid = (p - saguaro_probs(logits, 1.0, num_top=3, C=C)[0]).clamp_min(0)
        share = resid[top].sum() / resid.sum() if resid.sum() > 0 else torch.tensor(0.0)
        assert float(share) >= least


def test_greedy_saguaro_is_point_mass():
    logits = torch.randn(4, V, generator=torch.Generator().manual_seed(6))
    q = saguaro_probs(logits, torch.tensor([0.0, 1.0, 0.0, 0.5]), num_top=2, C=0.5)
    assert torch.equal(q[0], torch.nn.functional.one_hot(logits[0].argmax(), V).float())
    assert torch.equal(q[2], torch.nn.functional.one_hot(logits[2].argmax(), V).float())


def test_sglang_off_values_are_plain_softmax_and_greedy_via_top_k_1():
    """SGLang hands every request top_k = 1 << 30 / top_p = 1 / min_p = 0 when off, and encodes greedy
    as temperature 1 with top_k = 1."""
    logits = torch.randn(3, 2, V, generator=torch.Generator().manual_seed(7))
    sampling = SamplingBatch(
        temperature=torch.tensor([1.0, 0.8, 1.0]),
        top_k=torch.tensor([1 << 30, 1 << 30, 1]),
        top_p=torch.ones(3),
        min_p=torch.zeros(3),
    )
    got = process_logits(logits, sampling)
    assert torch.allclose(got[0], torch.softmax(logits[0], -1))
    assert torch.allclose(got[1], torch.softmax(logits[1] / 0.8, -1))
    assert torch.equal(got[2], torch.nn.functional.one_hot(logits[2].argmax(-1), V).float())


def test_an_all_greedy_batch_takes_the_short_path_to_the_same_point_masses():
    """A batch of greedy rows only (T = 0 serving) skips softmax and filters: the same point masses as
    those rows get inside a mixed batch, under a grammar mask too, at every position."""
    g = torch.Generator().manual_seed(8)
    logits = torch.randn(3, 5, V, generator=g)
    allowed = torch.rand(3, V, generator=g) < 0.3
    greedy = SamplingBatch(temperature=torch.tensor([0.0, 1.0, 0.0]), top_k=torch.tensor([1 << 30, 1, 7]),
                           top_p=torch.tensor([1.0, 0.9, 1.0]), min_p=torch.zeros(3))  # fmt: skip
    mixed = SamplingBatch(temperature=torch.tensor([0.0, 1.0, 0.0, 0.7]), top_k=torch.tensor([1 << 30, 1, 7, 5]),
                          top_p=torch.tensor([1.0, 0.9, 1.0, 0.8]), min_p=torch.zeros(4))  # fmt: skip
    assert bool(greedy.greedy.all()) and not bool(mixed.greedy.all())
    for mask in (None, allowed):
        short = process_logits(logits, greedy, mask)
        mask4 = None if mask is None else torch.cat([mask, mask[:1]])
        long = process_logits(torch.cat([logits, logits[:1]]), mixed, mask4)[:3]
        assert short.dtype == torch.float32 and torch.equal(short, long)
        z = logits if mask is None else logits.masked_fill(~mask[:, None], float("-inf"))
        assert torch.equal(short, torch.nn.functional.one_hot(z.argmax(-1), V).float())


def full_sort_filter(probs, top_k, top_p, min_p):
    """The joint filter by a full stable sort of every row (the plain definition)."""
    vocab = probs.shape[-1]
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    k = torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k).view(-1, 1, 1)
    before = sorted_p.cumsum(-1) - sorted_p
    keep = (torch.arange(vocab) < k) & ((before <= top_p.view(-1, 1, 1)) | (top_p.view(-1, 1, 1) >= 1))
    keep &= sorted_p >= min_p.view(-1, 1, 1) * sorted_p[..., :1]
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_p * keep)
    return kept / kept.sum(-1, keepdim=True)


@pytest.mark.parametrize("top_k,top_p,min_p", [
    ([-1, -1, -1, -1], [0.5, 0.9, 0.99, 0.3], [0.0] * 4),  # top-p only: partial top-w
    ([-1, -1, -1, -1], [0.5, 1.0, 0.9, 0.9], [0.0] * 4),  # one row off: full sort
    ([40, 300, 7, 2000], [0.95, 0.5, 1.0, 0.99], [0.0, 0.01, 0.0, 0.001]),
])
def test_partial_sort_equals_full_sort_on_a_large_vocabulary(top_k, top_p, min_p):
    from sglang_ssd.algo.sampling_params import filter_probs

    g = torch.Generator().manual_seed(8)
    probs = torch.softmax(torch.randn(4, 3, 5000, generator=g) * 3, -1)
    args = torch.tensor(top_k), torch.tensor(top_p), torch.tensor(min_p)
    assert torch.allclose(filter_probs(probs, *args), full_sort_filter(probs, *args), atol=1e-7)
