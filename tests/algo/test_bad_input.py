"""Inputs that do not fit raise ValueError naming the argument at fault."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.algo import SamplingBatch, SparseProbs, saguaro_probs, verify_chain, verify_chain_probs
from sglang_ssd.algo.cache import SpeculationCache

B, K, V = 4, 3, 10


def good():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(B, K + 1, V, generator=g)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    tokens = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, K)
    return logits, tokens, q, SamplingBatch.make(B, 1.0)


def test_good_input_passes():
    logits, tokens, q, sampling = good()
    assert verify_chain(logits, tokens, q, sampling).tokens.shape == (B, K + 1)


def test_target_logits_wrong_shape():
    logits, tokens, q, sampling = good()
    with pytest.raises(ValueError, match="target_logits"):
        verify_chain(logits[:, :, None], tokens, q, sampling)


def test_target_logits_wrong_dtype():
    logits, tokens, q, sampling = good()
    with pytest.raises(ValueError, match="target_logits"):
        verify_chain(logits.long(), tokens, q, sampling)


def test_draft_tokens_wrong_shape():
    logits, tokens, q, sampling = good()
    with pytest.raises(ValueError, match="draft_tokens"):
        verify_chain(logits, tokens[:, :2], q, sampling)


def test_draft_tokens_wrong_dtype():
    logits, tokens, q, sampling = good()
    with pytest.raises(ValueError, match="draft_tokens"):
        verify_chain(logits, tokens.float(), q, sampling)


@pytest.mark.parametrize("bad", [-1, V])
def test_draft_tokens_outside_vocabulary(bad):
    logits, tokens, q, sampling = good()
    tokens[1, 2] = bad
    with pytest.raises(ValueError, match="draft_tokens.*vocabulary"):
        verify_chain(logits, tokens, None, sampling)


def test_draft_probs_wrong_shape():
    logits, tokens, q, sampling = good()
    with pytest.raises(ValueError, match="draft_probs"):
        verify_chain(logits, tokens, q[:, :, :-1], sampling)


def test_draft_probs_wrong_dtype():
    logits, tokens, q, sampling = good()
    with pytest.raises(ValueError, match="draft_probs"):
        verify_chain(logits, tokens, (q > 0.1).int(), sampling)


def test_draft_probs_do_not_sum_to_one():
    logits, tokens, q, sampling = good()
    with pytest.raises(ValueError, match="draft_probs.*sum to 1"):
        verify_chain(logits, tokens, q * 1.1, sampling)


def test_sparse_draft_probs_do_not_sum_to_one():
    logits, tokens, _, sampling = good()
    sparse = SparseProbs(tokens[..., None], torch.full((B, K, 1), 0.5), V)
    with pytest.raises(ValueError, match="draft_probs.*sum to 1"):
        verify_chain(logits, tokens, sparse, sampling)


def test_sparse_draft_probs_indices_outside_vocabulary():
    logits, tokens, _, sampling = good()
    sparse = SparseProbs(tokens[..., None] + V, torch.ones(B, K, 1), V)
    with pytest.raises(ValueError, match="draft_probs.indices"):
        verify_chain(logits, tokens, sparse, sampling)


def test_draft_token_with_zero_draft_probability():
    logits, tokens, q, sampling = good()
    q = q.clone()
    q[0, 0] = 0
    q[0, 0, (tokens[0, 0] + 1) % V] = 1.0
    with pytest.raises(ValueError, match="draft_probs gives probability 0"):
        verify_chain(logits, tokens, q, sampling)


def test_target_probs_do_not_sum_to_one():
    _, tokens, q, _ = good()
    with pytest.raises(ValueError, match="target_probs.*sum to 1"):
        verify_chain_probs(torch.full((B, K + 1, V), 0.5), tokens, q)


def test_sampling_batch_size_mismatch():
    logits, tokens, q, _ = good()
    with pytest.raises(ValueError, match="sampling"):
        verify_chain(logits, tokens, q, SamplingBatch.make(B + 1, 1.0))


def test_sampling_bad_values():
    with pytest.raises(ValueError, match="top_p"):
        SamplingBatch.make(B, 1.0, top_p=1.5)
    with pytest.raises(ValueError, match="temperature"):
        SamplingBatch.make(B, [1.0, -1.0, 1.0, 1.0])


def test_allowed_mask_wrong_dtype_or_shape_or_empty_row():
    logits, tokens, q, sampling = good()
    with pytest.raises(ValueError, match="allowed_mask"):
        verify_chain(logits, tokens, q, sampling, allowed_mask=torch.ones(B, V))
    with pytest.raises(ValueError, match="allowed_mask"):
        verify_chain(logits, tokens, q, sampling, allowed_mask=torch.ones(B, V + 1, dtype=torch.bool))
    mask = torch.ones(B, V, dtype=torch.bool)
    mask[2] = False
    with pytest.raises(ValueError, match="allowed_mask"):
        verify_chain(logits, tokens, q, sampling, allowed_mask=mask)


def test_generator_count_mismatch():
    logits, tokens, q, sampling = good()
    with pytest.raises(ValueError, match="generator"):
        verify_chain(logits, tokens, q, sampling, generator=[torch.Generator()] * (B - 1))


def test_deterministic_and_num_draft_do_not_fit():
    logits, tokens, q, sampling = good()
    with pytest.raises(ValueError, match="deterministic"):
        verify_chain(logits, tokens, q, sampling, deterministic=torch.zeros(B, dtype=torch.long))
    with pytest.raises(ValueError, match="num_draft"):
        verify_chain(logits, tokens, q, sampling, num_draft=torch.full((B,), K + 1))


def test_flashinfer_backend_refused_where_unusable():
    logits, tokens, q, sampling = good()
    with pytest.raises(ValueError, match="backend='flashinfer'"):
        verify_chain(logits, tokens, q, sampling, backend="flashinfer")


def test_saguaro_bad_arguments():
    logits = torch.randn(B, V)
    with pytest.raises(ValueError, match="C must be"):
        saguaro_probs(logits, 1.0, num_top=2, C=1.5)
    with pytest.raises(ValueError, match="support"):
        saguaro_probs(logits, 1.0, num_top=4, C=0.5, support=3)
    with pytest.raises(ValueError, match="C = 0"):
        saguaro_probs(logits, 1.0, num_top=V, C=0.0)
    with pytest.raises(ValueError, match="temperature"):
        saguaro_probs(logits, torch.ones(B + 1), num_top=2, C=0.5)


def test_cache_bad_arguments():
    cache = SpeculationCache(num_slots=2, K=K, max_fanout=2, vocab_size=V)
    one = torch.zeros(1, dtype=torch.long)
    tokens, q = torch.zeros(1, K, dtype=torch.long), torch.full((1, K, V), 1.0 / V)
    with pytest.raises(ValueError, match="slots"):
        cache.store(one + 2, one, one, tokens, q)
    with pytest.raises(ValueError, match="bonus"):
        cache.store(one, one, one + V, tokens, q)
    with pytest.raises(ValueError, match="tokens"):
        cache.store(one, one, one, tokens[:, :2], q)
    with pytest.raises(ValueError, match="q must"):
        cache.store(one, one, one, tokens, q[..., :-1])
    with pytest.raises(ValueError, match="k must"):
        cache.lookup(one, one + K + 1, one)
