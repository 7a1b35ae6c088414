"""SGLang 0.5.23 serves the embedded target on a plain CPU, token-identical to transformers fp32."""

from __future__ import annotations

import pytest

from tests.e2e.conftest import greedy_tokens

pytestmark = pytest.mark.server  # starts real SGLang servers


def test_ar_server_matches_transformers_greedy(ar_server, equality_prompts, hf_greedy):
    mismatches = []
    for i, (ids, ref) in enumerate(zip(equality_prompts, hf_greedy)):
        got, _ = greedy_tokens(ar_server, ids)
        if got != ref:
            mismatches.append((i, got, ref))
    print(f"server start: {ar_server.start_seconds:.1f} s; prompts compared: {len(equality_prompts)}")
    assert len(equality_prompts) >= 20
    assert not mismatches, f"{len(mismatches)} prompts differ, first: {mismatches[0]}"


def test_ngram_speculative_decoding_on_cpu_is_exact(ngram_server, equality_prompts, hf_greedy):
    """SGLang's own NGRAM speculation runs on CPU through our TARGET_VERIFY path, same tokens."""
    proposed = 0
    for ids, ref in zip(equality_prompts[::2], hf_greedy[::2]):  # 10 of the 20, all four kinds
        got, meta = greedy_tokens(ngram_server, ids)
        assert got == ref
        proposed += meta.get("spec_num_proposed_drafts", 0)
    assert proposed > 0, "NGRAM never verified a draft: the TARGET_VERIFY path was not exercised"


def test_ngram_accepts_drafts_on_repetitive_text(ngram_server, tokenizer, ar_server):
    from sglang_ssd.prompts import chat_ids

    ids = chat_ids(tokenizer, "Repeat exactly: red green blue, red green blue, red green blue, red green blue.")
    greedy_tokens(ngram_server, ids, 48)  # warms the n-gram corpus with this text
    got, meta = greedy_tokens(ngram_server, ids, 48)
    ref, _ = greedy_tokens(ar_server, ids, 48)
    assert got == ref
    assert meta["spec_accept_length"] > 1.5, meta
