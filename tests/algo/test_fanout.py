"""Geometric fan-out: the closed form is the optimum of the paper's hit-rate model; α and r are
recoverable online from observed rounds."""

from __future__ import annotations

import functools
import itertools
import math

import pytest
import torch

from sglang_ssd.algo.fanout import (
    AcceptanceEstimator,
    AdaptiveFanoutPlanner,
    MissExponentEstimator,
    acceptance_pmf,
    geometric_fanout,
    geometric_fanout_weights,
    hit_probability,
    largest_remainder,
    uniform_fanout,
)


@functools.cache
def compositions(budget: int, parts: int) -> torch.Tensor:
    """Every allocation of ``budget`` guesses to ``parts`` forks, ``[M, parts]`` float64."""
    rows = []
    for cut in itertools.combinations(range(budget + parts - 1), parts - 1):
        edges = (-1, *cut, budget + parts - 1)
        rows.append([b - a - 1 for a, b in zip(edges, edges[1:])])
    return torch.tensor(rows, dtype=torch.float64)


def test_pmf_is_capped_geometric():
    pmf = acceptance_pmf(0.8, 7)
    assert len(pmf) == 8 and math.isclose(sum(pmf), 1.0)
    assert math.isclose(pmf[0], 0.2) and math.isclose(pmf[7], 0.8**7)


@pytest.mark.parametrize(
    "weights,budget", [([1, 1, 1], 10), ([0.5, 0.3, 0.2], 7), ([3, 0, 1e-9, 2], 24), ([0, 0, 0], 5), ([1], 0)]
)
def test_largest_remainder_sums_exactly_to_budget(weights, budget):
    out = largest_remainder(weights, budget)
    assert sum(out) == budget and all(x >= 0 for x in out)
    total = sum(weights) or len(weights)
    shares = [(w if sum(weights) else 1) / total * budget for w in weights]
    assert all(abs(o - s) < 1 for o, s in zip(out, shares))  # never more than one unit off its share


def test_rounding_keeps_sum_for_many_plans():
    for alpha, r, K, budget in itertools.product(
        [0.0, 0.3, 0.7, 0.95, 1.0], [0.3, 1.0, 3.0], [1, 3, 7], [0, 1, 5, 24, 61]
    ):
        plan = geometric_fanout(alpha, r, K, budget)
        assert len(plan) == K + 1 and sum(plan) == budget and min(plan) >= 0
    assert uniform_fanout(7, 24) == [3] * 8


def test_closed_form_is_the_continuous_optimum():
    """KKT: at F ∝ P^{1/(1+r)} the marginal gain P(k)·c·r·F^{−r−1} is the same at every fork."""
    for alpha, r, c in itertools.product([0.4, 0.7, 0.9], [0.5, 1.0, 2.0], [0.4, 1.0]):
        w = geometric_fanout_weights(alpha, r, 7)
        F = [x / sum(w) * 24 for x in w]
        gains = [p * c * r * f ** (-r - 1) for p, f in zip(acceptance_pmf(alpha, 7), F)]
        assert max(gains) / min(gains) == pytest.approx(1.0, rel=1e-9)
        # and any budget-preserving perturbation lowers the (relaxed) hit rate
        pmf = acceptance_pmf(alpha, 7)

        def relaxed(G, pmf=pmf, r=r, c=c):
            return sum(p * (1 - c * g ** (-r)) for p, g in zip(pmf, G))

        for i, j in itertools.permutations(range(8), 2):
            G = list(F)
            G[i] += 0.1
            G[j] -= 0.1
            assert relaxed(G) <= relaxed(F) + 1e-12


@pytest.mark.parametrize("c", [0.3, 0.5, 0.7])
def test_closed_form_matches_brute_force_within_rounding(c):
    """Enumerate every integer allocation; where the continuous optimum gives every fork at least one
    guess, the rounded closed form is within ±1 guess of the brute-force optimum at every fork and
    within 10 % of its hit rate."""
    cases = 0
    for K, budget, alpha, r in itertools.product(
        [2, 3, 4], range(3, 25, 3), [0.3, 0.5, 0.7, 0.8, 0.9], [0.5, 1.0, 2.0]
    ):
        w = geometric_fanout_weights(alpha, r, K)
        if min(x / sum(w) * budget for x in w) < 1:
            continue
        cases += 1
        allocs = compositions(budget, K + 1)
        pmf = torch.tensor(acceptance_pmf(alpha, K), dtype=torch.float64)
        hit = torch.where(allocs >= 1, 1 - c * allocs.clamp_min(1) ** (-r), 0.0) @ pmf
        best = allocs[hit.argmax()].long().tolist()
        assert hit.max() == pytest.approx(hit_probability(best, alpha, r, c))
        plan = geometric_fanout(alpha, r, K, budget)
        assert sum(plan) == budget
        assert max(abs(a - b) for a, b in zip(plan, best)) <= 1, (K, budget, alpha, r, plan, best)
        assert hit_probability(plan, alpha, r, c) >= 0.9 * hit_probability(best, alpha, r, c)
    assert cases > 100


def test_geometric_beats_uniform_in_the_model():
    for alpha, r in itertools.product([0.5, 0.7, 0.8, 0.9], [0.5, 1.0, 2.0]):
        geo = geometric_fanout(alpha, r, 7, 24)
        uni = uniform_fanout(7, 24)
        assert hit_probability(geo, alpha, r, 0.5) >= hit_probability(uni, alpha, r, 0.5) - 1e-12


# ---- estimators -----------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.3, 0.65, 0.9])
def test_alpha_estimator_recovers_alpha(alpha):
    K, n = 7, 200_000
    g = torch.Generator().manual_seed(5)
    accepted = torch.rand(n, K, generator=g) < alpha
    k = accepted.long().cumprod(1).sum(1)  # capped geometric
    est = AcceptanceEstimator(K)
    for chunk in k.split(1000):
        est.update(chunk)
    assert est.alpha == pytest.approx(alpha, abs=0.005)


def test_alpha_estimator_decay_tracks_a_change():
    est = AcceptanceEstimator(7, decay=0.9)
    for _ in range(200):
        est.update([7] * 10)  # α = 1 regime
    for _ in range(200):
        est.update([0] * 10)  # α = 0 regime
    assert est.alpha < 0.05


@pytest.mark.parametrize("r,c", [(0.6, 1.0), (1.2, 0.5), (2.0, 0.3)])
def test_miss_exponent_estimator_recovers_r_and_c(r, c):
    g = torch.Generator().manual_seed(9)
    n = 200_000
    F = torch.randint(1, 9, (n,), generator=g)
    miss = torch.rand(n, generator=g) < c * F.double() ** (-r)
    est = MissExponentEstimator()
    est.update(F, ~miss)
    r_hat, c_hat = est.fit()
    assert r_hat == pytest.approx(r, abs=0.05)
    assert c_hat == pytest.approx(c, rel=0.05)


def test_a_plan_for_another_budget_spreads_that_budget():
    """The draft server's share per request at its batch: the same estimates, ΣF as asked."""
    planner = AdaptiveFanoutPlanner(K=3, budget=17)
    for budget in (17, 8, 5, 1):
        plan = planner.plan(budget=budget)
        assert len(plan) == 4 and sum(plan) == budget
        assert sum(planner.plan(after_miss=True, K=1, budget=budget)) == budget
    assert planner.plan(budget=8) == geometric_fanout(planner.alpha.alpha, planner.r.r, 3, 8)
    assert AdaptiveFanoutPlanner(K=3, budget=17, mode="uniform").plan(budget=8) == [2, 2, 2, 2]


def test_planner_separate_plan_after_a_miss():
    planner = AdaptiveFanoutPlanner(K=7, budget=24, miss_budget=21)
    planner.observe([7, 6, 5, 7, 4] * 50, after_miss=False)  # high α after hits
    planner.observe([0, 0, 1, 0, 0] * 50, after_miss=True)  # fast backup: early rejection
    hit_plan, miss_plan = planner.plan(), planner.plan(after_miss=True)
    assert sum(hit_plan) == 24 and sum(miss_plan) == 21
    assert hit_plan[-1] > hit_plan[0]  # mass on "all accepted"
    assert miss_plan[0] > miss_plan[-1] and miss_plan[0] >= 10  # mass on "rejected at once"
    assert AdaptiveFanoutPlanner(K=7, budget=24, mode="uniform").plan() == [3] * 8
    with pytest.raises(ValueError, match="mode"):
        AdaptiveFanoutPlanner(K=7, budget=24, mode="bogus")


def test_a_plan_for_a_shorter_speculation_spends_the_whole_budget_on_its_outcomes():
    planner = AdaptiveFanoutPlanner(K=4, budget=24)
    assert planner.plan(K=0) == [24] and planner.plan(after_miss=True, K=0) == [24]
    short = planner.plan(K=2)
    assert len(short) == 3 and sum(short) == 24
    assert AdaptiveFanoutPlanner(K=4, budget=24, mode="uniform").plan(K=1) == [12, 12]
