"""The n-gram drafter (L0, draft/ngram.py): context lookup, backoff table, distribution, storage, input checks;
the build tool's acceptance measure and corpus reader (tools/ngram_build.py)."""

import json
import random
from collections import Counter

import pytest
import torch

from sglang_ssd.draft.ngram import NgramDraft
from sglang_ssd.draft.ngram_backup import ContextLookup, suffix_matches
from sglang_ssd.tools.ngram_build import greedy_acceptance

CORPUS = [
    [1, 2, 3, 4, 5, 1, 2, 3, 4, 6],
    [7, 8, 9, 10],
    [7, 8, 9, 11],
    [7, 8, 9, 10],
]


def fitted(**kw) -> NgramDraft:
    return NgramDraft(**kw).fit(CORPUS)


def test_context_lookup_copies_a_repeated_pattern():
    # Tokens 20..29 never occur in the corpus: only the request's own history can predict them.
    pattern = [20, 21, 22, 23, 24, 25]
    model = fitted()
    assert model.propose(pattern + [20, 21], 4) == [22, 23, 24, 25]
    assert model.propose(pattern * 3 + pattern[:2], 6) == [22, 23, 24, 25, 20, 21]
    # A single shared token is below min_match = 2: no lookup, the table answers instead.
    assert model.lookup_votes([20, 7, 20]) == {}
    assert model.lookup_votes([20, 21, 5, 20, 21]) == {5: 1}


def test_lookup_prefers_the_longest_match():
    model = NgramDraft()
    # Suffix [1, 2, 3] matched once (followed by 9); the shorter [2, 3] also occurs followed by 8.
    ctx = [1, 2, 3, 9, 2, 3, 8, 1, 2, 3]
    assert model.lookup_votes(ctx) == {9: 1}
    assert model.propose(ctx, 1) == [9]


def test_l0_lookup_and_fast_backup_share_one_rule():
    """L0's votes and the fast backup's proposal come from the same suffix lookup: the backup follows
    the most recent of the occurrences L0 votes from (same length bounds)."""
    rng = random.Random(0)
    for _ in range(300):
        ctx = [rng.randrange(4) for _ in range(rng.randrange(1, 40))]
        votes = NgramDraft(min_match=2, max_match=5).lookup_votes(ctx)
        ends = suffix_matches(ctx, 2, 5)
        assert votes == Counter(ctx[j + 1] for j in ends)
        got = ContextLookup(min_n=2, max_n=5).propose(ctx, 1)
        assert got == ([ctx[ends[-1] + 1]] if ends else [])


def test_backoff_table_proposals():
    model = fitted()
    # 3-token context (7, 8, 9) → 10 twice, 11 once.
    assert model.propose([7, 8, 9], 1) == [10]
    # Unseen long context backs off to the bigram (4 → 5 or 6, tie broken by the smaller id).
    assert model.propose([30, 31, 4], 1) == [5]
    assert model.propose([1, 2], 3) == [3, 4, 5]


def test_distribution_is_normalized_and_bounded():
    model = fitted()
    for ctx, top in (([7, 8, 9], 3), ([7, 8, 9], 50), ([30], 4), ([20, 21, 5, 20, 21], 8)):
        ids, probs = model.distribution(ctx, top=top)
        assert ids.dtype == torch.long and probs.dtype == torch.float32
        assert 1 <= len(ids) <= top and len(set(ids.tolist())) == len(ids)
        assert torch.all(probs > 0)
        assert probs.sum().item() == pytest.approx(1.0, abs=1e-6)
        assert torch.all(probs[:-1] >= probs[1:])
    ids, probs = model.distribution([7, 8, 9], top=50)
    p = dict(zip(ids.tolist(), probs.tolist(), strict=True))
    assert p[10] > p[11] > 0
    # The argmax of the distribution is the first proposed token.
    assert ids[0].item() == model.propose([7, 8, 9], 1)[0]
    # Lookup votes dominate: the copied token gets more than half the mass.
    ids, probs = model.distribution([20, 21, 5, 20, 21], top=8)
    assert ids[0].item() == 5 and probs[0].item() > 0.5


def test_table_is_truncated_but_keeps_totals():
    model = NgramDraft(max_next=1).fit(CORPUS)
    total, distinct, nxt = model.tables[3][(7, 8, 9)]
    assert (total, distinct, nxt) == (3, 2, [(10, 2)])


def test_save_load_round_trip(tmp_path):
    model = fitted(order=3, max_next=4, discount=0.5, vocab_size=64)
    path = tmp_path / "ngram.json"
    model.save(path)
    again = NgramDraft.load(path)
    assert again.tables == model.tables
    assert (again.order, again.max_next, again.discount, again.vocab_size, again.num_tokens) == (3, 4, 0.5, 64, 22)
    for ctx in ([7, 8, 9], [1, 2, 3, 4], [42]):
        assert again.propose(ctx, 3) == model.propose(ctx, 3)
        a, b = again.distribution(ctx, 5), model.distribution(ctx, 5)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    path.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(ValueError, match="path"):
        NgramDraft.load(path)


def test_bad_input_names_the_argument():
    model = fitted(vocab_size=64)
    with pytest.raises(ValueError, match="context"):
        model.propose([1, -2], 2)
    with pytest.raises(ValueError, match="context"):
        model.propose([1, 64], 2)
    with pytest.raises(ValueError, match="context"):
        model.distribution("abc", 4)
    with pytest.raises(ValueError, match="k"):
        model.propose([1, 2], -1)
    with pytest.raises(ValueError, match="top"):
        model.distribution([1, 2], 0)
    with pytest.raises(ValueError, match=r"token_sequences\[1\]"):
        NgramDraft().fit([[1, 2], [3, 4.5]])
    with pytest.raises(ValueError, match="token_sequences"):
        NgramDraft().fit([[], []])
    with pytest.raises(ValueError, match="order"):
        NgramDraft(order=0)
    with pytest.raises(ValueError, match="discount"):
        NgramDraft(discount=1.0)
    with pytest.raises(ValueError, match="max_match"):
        NgramDraft(min_match=3, max_match=2)
    # Nothing to go on: no table and no lookup match.
    assert NgramDraft().propose([1, 2, 3], 4) == []
    with pytest.raises(ValueError, match="context"):
        NgramDraft().distribution([1, 2, 3], 4)


def test_tensor_context_is_accepted():
    model = fitted()
    assert model.propose(torch.tensor([7, 8, 9]), 1) == [10]
    with pytest.raises(ValueError, match="context"):
        model.propose(torch.tensor([[7, 8, 9]]), 1)


def test_greedy_acceptance_counts():
    model = fitted()
    # The target continues [7, 8] with 9, 10, 11.
    res = greedy_acceptance(model, [[7, 8]], [[9, 10, 11]], k=4)
    # Round 1: at most 2 drafts (3 tokens left, last is the bonus): proposes [9, 10], both accepted, bonus 11.
    assert res["rounds"] == 1 and res["accepted_per_round"] == 2 and res["alpha"] == 1.0
    # Per-token: after [7,8] → 9 ✓, after [7,8,9] → 10 ✓, after [7,8,9,10] → not 11 (table says nothing of 11).
    assert res["per_token"] == pytest.approx(2 / 3)


def test_corpus_reads_training_batches_only(tmp_path):
    from sglang_ssd.tools.ngram_build import corpus_from_draft_data

    rec = {"prompt": torch.tensor([1, 2]), "answer": torch.tensor([3, 4, 2])}
    torch.save([rec, rec], tmp_path / "g4_s0_seed0_batch_0000.pt")
    torch.save([{"prompt": torch.tensor([9]), "answer": torch.tensor([9, 9])}], tmp_path / "eval_ref_abc.pt")
    assert corpus_from_draft_data(tmp_path) == [[1, 2, 3, 4, 2], [1, 2, 3, 4, 2]]
