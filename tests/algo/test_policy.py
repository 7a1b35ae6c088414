"""Speedup model (the planner's, ``planner.rates``) and the live backup policy: closed forms agree with a
brute-force evaluation of the model."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from sglang_ssd.algo.policy import (
    BackupOption,
    BackupPolicy,
    batch_ssd_speedup,
    crossover_batch,
    expected_tokens,
    ssd_over_sd_bound,
)
from sglang_ssd.planner.rates import sd_speedup, ssd_speedup


def brute_force_speedup(p_hit, b, E_hit, E_miss, T_p, T_b, whole_batch_backup=False, miss_waits_for_tree=False):
    """Enumerate all 2^b hit patterns of one round: exact expected tokens per request and round time.
    A round with a miss lasts 1 + T_b (the live policy's form), or max(1, T_p) + T_b with
    ``miss_waits_for_tree`` (the planner's: the hits' tree is still needed)."""
    tokens = time = 0.0
    for pattern in itertools.product([True, False], repeat=b):
        hits = sum(pattern)
        prob = p_hit**hits * (1 - p_hit) ** (b - hits)
        all_hit = hits == b
        if whole_batch_backup:
            per_req = E_hit if all_hit else E_miss
        else:
            per_req = (hits * E_hit + (b - hits) * E_miss) / b
        tokens += prob * per_req
        miss_round = max(1.0, T_p) + T_b if miss_waits_for_tree else 1.0 + T_b
        time += prob * (max(1.0, T_p) if all_hit else miss_round)
    return tokens / time


def test_expected_tokens():
    assert expected_tokens(0.0, 7) == 1.0
    assert expected_tokens(1.0, 7) == 8.0
    assert expected_tokens(0.8, 7) == pytest.approx(sum(0.8**i for i in range(8)))


def test_theorem7_and_corollary9():
    # all hits, draft no slower than verification: every round costs one verification
    assert ssd_speedup(1.0, 4.0, 1.0, 0.8, 0.0) == pytest.approx(4.0)
    # all misses with a fast backup = AR-like rounds of one token
    assert ssd_speedup(0.0, 4.0, 1.0, 0.8, 0.0) == pytest.approx(1.0)
    assert sd_speedup(4.0, 0.5) == pytest.approx(4.0 / 1.5)
    # the bound of Corollary 9 is SSD/SD at p_hit = 1, T_p ≤ 1
    E_sd, T_sd = 3.5, 0.6
    assert ssd_speedup(1.0, E_sd, 1.0, 1.0, 0.0) / sd_speedup(E_sd, T_sd) == pytest.approx(
        ssd_over_sd_bound(T_sd, E_sd, E_sd)
    )
    for p in (0.3, 0.7, 0.95):
        assert (
            ssd_speedup(p, E_sd, 2.0, 0.9, 0.6) / sd_speedup(E_sd, T_sd)
            <= ssd_over_sd_bound(T_sd, E_sd, E_sd) + 1e-12
        )


@pytest.mark.parametrize("whole", [False, True])
def test_batch_model_matches_brute_force(whole):
    for p, b, E_hit, E_miss, T_p, T_b in itertools.product(
        [0.5, 0.8, 0.95], [1, 2, 5, 8], [3.0, 5.0], [1.0, 2.5], [0.7, 1.3], [0.0, 0.9]
    ):
        closed = batch_ssd_speedup(p, b, E_hit, E_miss, T_p, T_b, whole_batch_backup=whole)
        assert closed == pytest.approx(brute_force_speedup(p, b, E_hit, E_miss, T_p, T_b, whole))
    # b = 1 is Theorem 7, the planner's model with a tree no slower than the verification
    assert batch_ssd_speedup(0.7, 1, 4, 2, 0.9, 0.8) == pytest.approx(ssd_speedup(0.7, 4, 2, 0.9, 0.8))


def test_planner_batch_model_matches_brute_force():
    for p, b, E_hit, E_miss, T_p, T_b in itertools.product(
        [0.5, 0.8, 0.95], [1, 2, 5, 8], [3.0, 5.0], [1.0, 2.5], [0.7, 1.3], [0.0, 0.9]
    ):
        closed = ssd_speedup(p, E_hit, E_miss, T_p, T_b, batch=b)
        assert closed == pytest.approx(brute_force_speedup(p, b, E_hit, E_miss, T_p, T_b, miss_waits_for_tree=True))
        if T_p <= 1.0:  # the live policy's form differs only when the tree outlasts the verification
            assert closed == pytest.approx(batch_ssd_speedup(p, b, E_hit, E_miss, T_p, T_b))


def test_policy_matches_brute_force_choice():
    neural, fast = BackupOption(E_miss=3.2, T_b=0.5), BackupOption(E_miss=1.0, T_b=0.02)
    chosen = []
    for p, E_hit, T_p, b in itertools.product([0.6, 0.8, 0.9, 0.97], [3.0, 4.5], [0.8, 1.0], range(1, 11)):
        policy = BackupPolicy(p_hit=p, E_hit=E_hit, T_p=T_p, neural=neural, fast=fast)
        sn = brute_force_speedup(p, b, E_hit, neural.E_miss, T_p, neural.T_b)
        sf = brute_force_speedup(p, b, E_hit, fast.E_miss, T_p, fast.T_b)
        assert policy.speedups(b)["neural"] == pytest.approx(sn)
        assert policy.speedups(b)["fast"] == pytest.approx(sf)
        if not math.isclose(sn, sf, rel_tol=1e-9):
            assert policy.choose(b) == ("neural" if sn > sf else "fast")
            chosen.append(policy.choose(b))
    assert len(chosen) > 150 and {"neural", "fast"} == set(chosen)


def test_neural_below_crossover_fast_above():
    neural, fast = BackupOption(E_miss=3.5, T_b=0.5), BackupOption(E_miss=1.0, T_b=0.0)
    b_star = crossover_batch(0.6, 4.0, 1.0, neural, fast)
    assert b_star is not None and b_star > 1
    policy = BackupPolicy(p_hit=0.6, E_hit=4.0, T_p=1.0, neural=neural, fast=fast)
    assert all(policy.choose(b) == "neural" for b in range(1, b_star))
    assert all(policy.choose(b) == "fast" for b in range(b_star, b_star + 50))


def test_policy_learns_from_observed_rounds():
    """Prior says the neural backup is great; the rounds say it is slow and barely better."""
    policy = BackupPolicy(p_hit=0.9, E_hit=4.0, neural=BackupOption(4.0, 0.2), decay=0.9)
    assert policy.choose(4) == "neural"
    round_ = {"hits": 6, "requests": 8, "tokens_hit": 6 * 4.0, "T_verify": 10.0, "T_spec": 9.0}
    for _ in range(100):
        policy.observe(**round_, tokens_miss=2 * 1.3, backup="neural", T_backup=12.0)
        policy.observe(**round_, tokens_miss=2 * 1.0, backup="fast", T_backup=0.1)
    assert policy.hit_rate("fast") == pytest.approx(0.9)  # no lookups observed: the prior
    assert policy.T_b["neural"].value == pytest.approx(1.2, abs=0.01)
    assert policy.E_miss["neural"].value == pytest.approx(1.3, abs=0.01)
    assert policy.choose(4) == "fast"
    with pytest.raises(ValueError, match="hits"):
        policy.observe(hits=9, requests=8)


def test_each_backup_is_priced_at_the_hit_rate_it_leads_to():
    """The lock-in the shared p_hit allowed: the neural backup emits more tokens on a miss, but the tree
    after it hits less (its fan-out spreads over K + 1 outcomes). Priced at one p_hit it wins; priced
    at the long-run hit rate each backup leads to, the fast backup wins, and the model agrees with the
    brute-force two-state chain."""
    neural, fast = BackupOption(E_miss=1.5, T_b=0.1), BackupOption(E_miss=1.0, T_b=0.0)
    policy = BackupPolicy(p_hit=0.6, E_hit=2.0, T_p=1.0, neural=neural, fast=fast, decay=0.9)
    assert policy.choose(1) == "neural"  # priors: every origin's trees hit alike
    for _ in range(100):
        policy.observe(hits=1, requests=1, tokens_hit=2.0,
                       next_hits={"hit": (8, 10), "neural": (3, 10), "fast": (8, 10)})
    p_neural, p_fast = policy.hit_rate("neural"), policy.hit_rate("fast")
    assert p_neural == pytest.approx(0.3 / (1 - 0.8 + 0.3), abs=0.01)
    assert p_fast == pytest.approx(0.8, abs=0.01)
    # the chain, run: after a hit the next lookup hits with 0.8, after a neural backup with 0.3
    rng, state, hits = random.Random(0), True, 0
    for _ in range(20000):
        state = rng.random() < (0.8 if state else 0.3)
        hits += state
    assert hits / 20000 == pytest.approx(p_neural, abs=0.02)
    assert policy.choose(1) == "fast"
    # (at the overall hit rate it leads to, 0.6, for both backups, the neural one would still win)
    assert batch_ssd_speedup(0.6, 1, 2.0, 1.5, 1.0, 0.1) > batch_ssd_speedup(0.6, 1, 2.0, 1.0, 1.0, 0.0)
    with pytest.raises(ValueError, match="next_hits"):
        policy.observe(hits=0, requests=1, next_hits={"fast": (2, 1)})
