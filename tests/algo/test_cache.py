"""The speculation cache: a hit returns exactly what was stored for (slot, k, bonus); bounded memory."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.algo import SparseProbs, saguaro_sample
from sglang_ssd.algo.cache import SpeculationCache, bytes_per_round

K, V, F = 3, 50, 4


def branches(slots, fanout, support=None, seed=0):
    """A draft tree: for each slot, fork k, and F_k candidates, K tokens and their q′."""
    g = torch.Generator().manual_seed(seed)
    rows = [(s, k, f) for s in slots for k, fk in enumerate(fanout) for f in range(fk)]
    n = len(rows)
    slot = torch.tensor([r[0] for r in rows])
    k = torch.tensor([r[1] for r in rows])
    bonus = torch.tensor([(7 * r[0] + 3 * r[1] + r[2]) % V for r in rows])
    tokens, q = saguaro_sample(
        torch.randn(n * K, V, generator=g), 1.0, num_top=3, C=0.3, support=support, generator=g
    )
    q = q.reshape(n, K) if isinstance(q, SparseProbs) else q.view(n, K, V)
    return slot, k, bonus, tokens.view(n, K), q


@pytest.mark.parametrize("support", [None, 8], ids=["dense", "sparse"])
def test_hit_returns_what_was_stored(support):
    cache = SpeculationCache(num_slots=6, K=K, max_fanout=F, vocab_size=V, support=support)
    slot, k, bonus, tokens, q = branches([1, 4], [4, 2, 1, 1], support)
    cache.store(slot, k, bonus, tokens, q)
    got = cache.lookup(slot, k, bonus)
    assert bool(got.hit.all())
    assert torch.equal(got.tokens, tokens.long())
    if support is None:
        assert torch.equal(got.q, q)
    else:
        assert torch.equal(got.q.indices.long(), q.indices.long()) and torch.equal(got.q.probs, q.probs)


def test_miss_on_other_bonus_other_k_other_slot_and_after_clear():
    cache = SpeculationCache(num_slots=6, K=K, max_fanout=F, vocab_size=V, support=8)
    slot, k, bonus, tokens, q = branches([1, 4], [4, 2, 1, 1], 8)
    cache.store(slot, k, bonus, tokens, q)
    b0 = int(bonus[0])
    queries = torch.tensor([[1, 0, b0], [1, 0, (b0 + 40) % V], [1, 3, b0], [2, 0, b0], [4, 0, 28]])
    got = cache.lookup(queries[:, 0], queries[:, 1], queries[:, 2])
    assert got.hit.tolist() == [True, False, False, False, True]
    cache.clear([1])
    got = cache.lookup(queries[:, 0], queries[:, 1], queries[:, 2])
    assert got.hit.tolist() == [False, False, False, False, True]


def test_store_replaces_the_previous_round_of_the_slot_only():
    cache = SpeculationCache(num_slots=4, K=K, max_fanout=F, vocab_size=V)
    cache.store(*branches([0, 1], [2, 2, 2, 2], seed=1))
    new = branches([0], [1, 1, 1, 1], seed=2)
    cache.store(*new)
    assert int((cache.keys[0] >= 0).sum()) == 4  # only the new round's branches
    assert int((cache.keys[1] >= 0).sum()) == 8  # slot 1 untouched
    # append mode (a round stored in two calls)
    more = branches([0], [1, 1, 1, 1], seed=3)
    more = (more[0], more[1], (more[2] + 1) % V, more[3], more[4])
    cache.store(*more, replace=False)
    assert int((cache.keys[0] >= 0).sum()) == 8
    assert bool(cache.lookup(new[0], new[1], new[2]).hit.all())
    assert bool(cache.lookup(more[0], more[1], more[2]).hit.all())


def test_lookup_is_batched_over_a_large_batch():
    cache = SpeculationCache(num_slots=64, K=K, max_fanout=F, vocab_size=V, support=8)
    slot, k, bonus, tokens, q = branches(list(range(64)), [4, 3, 2, 1], 8)
    cache.store(slot, k, bonus, tokens, q)
    perm = torch.randperm(slot.numel(), generator=torch.Generator().manual_seed(0))
    got = cache.lookup(slot[perm], k[perm], bonus[perm])
    assert bool(got.hit.all()) and torch.equal(got.tokens, tokens[perm].long())


def test_bounded_memory_and_overflow():
    assert SpeculationCache.bytes_for(8, 7, 3, 49152) > SpeculationCache.bytes_for(8, 7, 3, 49152, 32)
    small = SpeculationCache(num_slots=8, K=7, max_fanout=3, vocab_size=49152, support=32)
    assert small.nbytes == SpeculationCache.bytes_for(8, 7, 3, 49152, 32)
    with pytest.raises(ValueError, match="max_bytes"):
        SpeculationCache(num_slots=64, K=7, max_fanout=3, vocab_size=49152, max_bytes=1 << 30)
    cache = SpeculationCache(num_slots=2, K=K, max_fanout=2, vocab_size=V)
    with pytest.raises(ValueError, match="max_fanout"):
        cache.store(*branches([0], [3, 0, 0, 0]))


def test_dense_q_is_compacted_exactly_or_refused():
    cache = SpeculationCache(num_slots=2, K=K, max_fanout=F, vocab_size=V, support=8)
    slot, k, bonus, tokens, q_sparse = branches([0], [1, 1, 1, 1], 8)
    cache.store(slot, k, bonus, tokens, q_sparse.to_dense())  # support ≤ 8: exact
    got = cache.lookup(slot, k, bonus)
    assert torch.allclose(got.q.to_dense(), q_sparse.to_dense())
    _, _, _, _, q_dense = branches([0], [1, 1, 1, 1], None)  # full support: not representable
    with pytest.raises(ValueError, match="outside its top-8"):
        cache.store(slot, k, bonus, tokens, q_dense)


def test_bytes_per_round():
    b = bytes_per_round(7, 49152, support=32)
    assert b["point"] == 7 * 4
    assert b["dense"] == 7 * 4 + 7 * 49152 * 4
    assert b["sparse"] == 7 * 4 + 7 * 32 * 8
    assert b["sparse"] * 100 < b["dense"]
    assert bytes_per_round(7, 49152, prob_dtype=torch.bfloat16)["dense"] == 7 * 4 + 7 * 49152 * 2
