"""Which requests may carry drafts (target/target_logits.py ``drafts_allowed``): those whose law SGLang
applies per step stay one token a round, so their output is AR's exactly (the e2e feature matrix
compares them with AR token for token; with drafts, the repetition-penalty case differed), and the
accept layout handed back to SGLang (``accept_layout``)."""

from types import SimpleNamespace

import torch

from sglang_ssd.algo.verify import ChainVerifyResult
from sglang_ssd.target.target_logits import accept_layout, drafts_allowed


def req(**sp):
    base = {"frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}
    return SimpleNamespace(sampling_params=SimpleNamespace(**{**base, **sp}))


def test_plain_requests_draft():
    assert drafts_allowed(req())


def test_penalties_and_min_new_tokens_draft_nothing():
    for sp in ({"frequency_penalty": 0.5}, {"presence_penalty": -1.0}, {"repetition_penalty": 1.3},
               {"min_new_tokens": 4}):
        assert not drafts_allowed(req(**sp)), sp


def test_accepted_tokens_are_the_front_of_each_verify_window():
    """The worker leaves the accepted tokens' KV where the forward wrote it: that holds only because
    request b's kept tokens (k drafts + the bonus) are chain slots b*d .. b*d + k, in order."""
    d, width = 4, 5
    k = torch.tensor([0, 3, 1])
    tokens = torch.tensor([[7, -1, -1, -1], [1, 2, 3, 9], [4, 8, -1, -1]])
    out = accept_layout(ChainVerifyResult(k, tokens, tokens[torch.arange(3), k]), torch.tensor([10, 20, 30]),
                        d, width, "cpu")
    assert out.index.tolist() == [[0, -1, -1, -1], [4, 5, 6, 7], [8, 9, -1, -1]]
    assert out.lens.tolist() == [1, 4, 2] and out.new_seq_lens.tolist() == [11, 24, 32]
    assert out.predict.view(3, d).tolist() == [[7, 0, 0, 0], [1, 2, 3, 9], [4, 8, 0, 0]]
    # the scheduler reads each request's tokens at its fixed stride
    assert out.tokens.view(3, width)[:, :d].tolist() == out.predict.view(3, d).tolist()
    assert out.tokens.view(3, width)[:, d:].eq(0).all()
