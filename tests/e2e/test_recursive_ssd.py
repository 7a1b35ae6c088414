"""Three-level SSD through the real server: L0 (n-gram) drafts for L1 (the draft model), L1's verified
blocks are what the target verifies. Greedy output equals the target's own; the draft server reports
that L0 was used and what its calibrations measured. (The T > 0 law: test_ssd_sampling.py.)"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from sglang_ssd.wire.client import DraftClient
from tests.e2e.conftest import greedy_tokens

pytestmark = pytest.mark.server  # starts real SGLang servers


def test_three_level_batch1_matches_reference(ssd3_server, equality_prompts, hf_greedy):
    proposed = accepted = 0
    for ids, ref in zip(equality_prompts[::2], hf_greedy[::2]):
        got, meta = greedy_tokens(ssd3_server, ids)
        assert got == ref
        proposed += meta["spec_num_proposed_drafts"]
        accepted += meta["spec_num_correct_drafts"]
    assert proposed > 0
    print(f"3-level SSD batch 1: alpha = {accepted / proposed:.3f} over {proposed} drafted tokens")


def test_three_level_8_concurrent_match_ar(ssd3_server, ar_server, equality_prompts):
    prompts = equality_prompts[1:17:2]

    def run(server):
        with ThreadPoolExecutor(8) as pool:
            return list(pool.map(lambda ids: greedy_tokens(server, ids)[0], prompts))

    assert run(ssd3_server) == run(ar_server)


def test_three_level_draft_server_used_l0_and_calibrated(ssd3_server, ssd3_draft):
    with DraftClient(ssd3_draft.endpoint, timeout_s=30) as client:
        stats = client.stats()
    assert stats["l0_proposed"] > 0 and 0 <= stats["l0_accepted"] <= stats["l0_proposed"]
    # L0's temperature calibration measured L1's acceptance of an L0 token at every grid point.
    alphas = {k: v for k, v in stats.items() if k.startswith("l0_alpha_tau")}
    assert len(alphas) >= 2 and all(0.0 <= a <= 1.0 for a in alphas.values())
    assert "tau1_multiplier" in stats and stats["tau1_multiplier"] > 0
    print({k: v for k, v in stats.items() if k.startswith(("l0_", "tau1_", "l1_"))})
