"""The second template family: distinct, balanced, deterministic, and clear of every evaluation prompt."""

from collections import Counter

import pytest

from sglang_ssd.prompts import load_prompts
from sglang_ssd.tools.draft_data import DataSpec, source_prompts
from sglang_ssd.tools.draft_prompts import HELD_OUT, _six_word_runs, training_prompts, training_prompts_b


def test_family_b_is_deterministic_distinct_and_balanced():
    got = training_prompts_b(1536)
    assert got == training_prompts_b(1536, seed=0) and got != training_prompts_b(1536, seed=1)
    assert len({p for _, p in got}) == 1536
    # three parts of 512 hold every kind equally (the kinds the first family runs out of included)
    for part in range(3):
        assert Counter(k for k, _ in got[512 * part: 512 * (part + 1)]) == dict.fromkeys(("chat", "math", "code", "opinion"), 128)
    assert not {p for _, p in got} & {p for _, p in training_prompts(1000)}


def test_family_b_shares_no_six_word_run_with_an_evaluation_prompt():
    evaluation = [p for _, p in HELD_OUT] + [p.prompt for p in load_prompts()]
    banned = set().union(*(_six_word_runs(t) for t in evaluation))
    assert banned  # the check has something to check against
    assert not any(_six_word_runs(p) & banned for _, p in training_prompts_b(2048))
    # the filter is what keeps them out: an evaluation prompt's words, templated, would be caught
    assert _six_word_runs(evaluation[0] + " Please keep it short.") & banned


def test_family_b_parts_are_consecutive_blocks_of_its_stream():
    spec = DataSpec(n_greedy=3, n_sampled=2, source="templates-b", part=1)
    assert source_prompts(spec) == [p for _, p in training_prompts_b(10)[5:]]
    with pytest.raises(ValueError):
        training_prompts_b(0)
