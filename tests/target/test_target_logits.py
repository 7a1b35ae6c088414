"""Which requests may carry drafts (target/target_logits.py ``drafts_allowed``): those whose law SGLang
applies per step stay one token a round, so their output is AR's exactly (the e2e feature matrix
compares them with AR token for token; with drafts, the repetition-penalty case differed)."""

from types import SimpleNamespace

from sglang_ssd.target.target_logits import drafts_allowed


def req(**sp):
    base = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}
    return SimpleNamespace(sampling_params=SimpleNamespace(**{**base, **sp}))


def test_plain_requests_draft():
    assert drafts_allowed(req())


def test_penalties_and_min_new_tokens_draft_nothing():
    for sp in ({"frequency_penalty": 0.5}, {"presence_penalty": -1.0}, {"repetition_penalty": 1.3},
               {"min_new_tokens": 4}):
        assert not drafts_allowed(req(**sp)), sp
