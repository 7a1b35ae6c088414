"""Greedy SSD and SD through the real server are token-identical to the target's own decoding."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import NEW_TOKENS, greedy_tokens

pytestmark = pytest.mark.server  # starts real SGLang servers


# Batch 1 takes every other prompt (10, all four kinds): the concurrent tests below cover the rest, and
# AR equals the transformers reference on all 20 (test_cpu_serving.py). One at a time is the slow part.
def test_ssd_batch1_matches_reference(ssd_server, equality_prompts, hf_greedy):
    proposed = accepted = 0
    for ids, ref in zip(equality_prompts[::2], hf_greedy[::2]):
        got, meta = greedy_tokens(ssd_server, ids)
        assert got == ref
        proposed += meta["spec_num_proposed_drafts"]
        accepted += meta["spec_num_correct_drafts"]
    assert proposed > 0, "no draft token was ever verified"
    print(f"SSD batch 1: alpha = {accepted / proposed:.3f} over {proposed} drafted tokens")


def test_sd_batch1_matches_reference(sd_server, equality_prompts, hf_greedy):
    for ids, ref in zip(equality_prompts[::2], hf_greedy[::2]):
        got, meta = greedy_tokens(sd_server, ids)
        assert got == ref
        assert meta["spec_num_proposed_drafts"] > 0


def _concurrent(server, prompts, n=NEW_TOKENS):
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda ids: greedy_tokens(server, ids, n)[0], prompts))


def test_ssd_and_sd_with_8_concurrent_requests_match_ar(ssd_server, sd_server, ar_server, equality_prompts):
    prompts = equality_prompts[:16]
    ar = _concurrent(ar_server, prompts)
    assert _concurrent(ssd_server, prompts) == ar
    assert _concurrent(sd_server, prompts) == ar


def test_ssd_reports_its_counters(ssd_server):
    state = ssd_server.get("/server_info")["internal_states"][0]
    for key in ("ssd_hit_rate", "ssd_backup_rate", "ssd_alpha", "ssd_round_ms", "ssd_budget"):
        assert key in state, sorted(k for k in state if k.startswith("ssd"))
    assert state["ssd_rounds"] > 0
    assert 0.0 <= state["ssd_hit_rate"] <= 1.0
    # Forward time per chain width, in wall time and in the scheduler thread's CPU time
    rounds, wall, cpu = state["ssd_width_rounds"], state["ssd_width_verify_s"], state["ssd_width_verify_cpu_s"]
    assert sum(rounds) == state["ssd_rounds"] and len(wall) == len(cpu) == len(rounds)
    assert all(0 < c <= w * 1.05 + 1e-3 for n, w, c in zip(rounds, wall, cpu) if n), (rounds, wall, cpu)
    import urllib.request

    with urllib.request.urlopen(f"{ssd_server.url}/metrics", timeout=30) as r:
        text = r.read().decode()
    assert "sglang:ssd_hit_rate" in text
    # Per request: one entry per verify round (1 = cache hit, 0 = backup, -1 = no draft).
    out = ssd_server.generate([1, 9690, 198], {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True})
    hits = out["meta_info"]["ssd_hit"]
    assert len(hits) == out["meta_info"]["spec_verify_ct"] and set(hits) <= {-1, 0, 1}, out["meta_info"]


def test_stop_strings_max_tokens_and_logprobs_match_ar(ssd_server, ar_server, equality_prompts):
    """Features that cut or annotate an accepted block behave exactly as in AR."""
    cases = [
        {"temperature": 0, "max_new_tokens": 5},
        {"temperature": 0, "max_new_tokens": 40, "stop": ["\n", "."]},
    ]
    for ids in equality_prompts[:4]:
        for params in cases:
            a = ar_server.generate(ids, params, return_logprob=True)
            s = ssd_server.generate(ids, params, return_logprob=True)
            assert s["output_ids"] == a["output_ids"], params
            assert s["text"] == a["text"]
            assert s["meta_info"]["finish_reason"] == a["meta_info"]["finish_reason"]
            la = [x[0] for x in a["meta_info"]["output_token_logprobs"]]
            ls = [x[0] for x in s["meta_info"]["output_token_logprobs"]]
            assert len(ls) == len(la)
            assert max(abs(x - y) for x, y in zip(la, ls)) < 1e-3


def test_auto_k_matches_reference(ssd_auto_server, equality_prompts, hf_greedy):
    """Whatever K the live planner picks (down to 0), the output is the target's own."""
    for ids, ref in list(zip(equality_prompts, hf_greedy))[:8]:
        got, _ = greedy_tokens(ssd_auto_server, ids)
        assert got == ref
    state = ssd_auto_server.get("/server_info")["internal_states"][0]
    assert state["ssd_rounds"] > 0
    chosen = state["ssd_auto_k_chosen"]  # rounds per K: both plain-decode (DECODE forward) and drafted ran
    assert chosen[0] > 0 and sum(chosen[1:]) > 0, chosen
    # The depth auto-K last asked for is the one the draft server drafts now (it asked at least once).
    assert state["ssd_auto_k_depth"] is not None
    assert state["ssd_draft_server"]["k"] == state["ssd_auto_k_depth"], state


def test_requests_joining_mid_flight_and_prefix_hits_match_ar(ssd_server, ar_server, equality_prompts):
    """Requests arrive while others decode and leave at different lengths; repeated and shared-prefix
    prompts hit the radix cache. Every output still equals AR's."""
    import time

    base = equality_prompts[5]
    jobs = [(base, 24), (base, 9), (base + equality_prompts[6][-6:], 17), (equality_prompts[7], 31),
            (equality_prompts[7][:-2], 12), (base, 5)]  # fmt: skip

    def run(server):
        def one(i_job):
            i, (ids, n) = i_job
            time.sleep(0.4 * i)  # staggered arrivals join a running batch
            out = server.generate(ids, {"temperature": 0, "max_new_tokens": n})
            return out["output_ids"], out["meta_info"].get("cached_tokens", 0)

        with ThreadPoolExecutor(len(jobs)) as pool:
            return list(pool.map(one, enumerate(jobs)))

    ar = run(ar_server)
    ssd = run(ssd_server)
    assert [o for o, _ in ssd] == [o for o, _ in ar]
    assert max(c for _, c in ssd) > 0, "no request reused a cached prefix"
