"""Planner (sglang_ssd/planner/choose.py, sglang_ssd/planner/): hand-computed predictions on toy calibrations,
choose_k, monotonicity in α, sweep comparison and bad input. No timing."""

from __future__ import annotations

import json

import pytest

from sglang_ssd.algo.policy import expected_tokens
from sglang_ssd.planner.choose import Plan, main, plan
from sglang_ssd.planner.costs import CostModel, Curve
from sglang_ssd.planner.predict import choose_k, predict_sd, predict_ssd
from sglang_ssd.planner.sweep import (
    compare_sweep,
    estimate_alpha_r,
    predict_record,
    r_from_hit_rate,
    saguaro_table,
)


def toy_calibration(verify: list[float] | None = None, draft_ms: float = 1.0) -> dict:
    """T_v flat 10 ms (n = 1..9) unless given; every draft forward costs ``draft_ms`` whatever its size."""
    verify = verify or [10.0] * 9
    return {
        "target": {"verify_ms_by_batch": {"1": verify}},
        "draft": {
            "chain_ms": [draft_ms] * 9,
            "decode_ms": {"1": draft_ms},
            "tree": {
                "1x8": {
                    "batch": 1,
                    "budget": 8,
                    "k": 3,
                    "tokens_per_step": 8,
                    "glue_ms": draft_ms,
                    "step_ms": draft_ms,
                    "round_ms": 4 * draft_ms,
                }
            },  # fmt: skip
        },
    }


def test_hand_computed_predictions():
    cal = toy_calibration()
    costs = CostModel(cal)
    # AR: one token per 10 ms.
    p = plan(cal, alpha=0.8, r=1.0, k_max=3, max_budget=8)
    assert p.ar.tok_s == pytest.approx(100.0)
    # SD K = 3: E = (1 − 0.8⁴)/0.2 = 2.952 tokens per 10 + 3·1 ms.
    assert p.sd[2].tok_s == pytest.approx(1000 * 2.952 / 13.0)
    # SSD K = 3, ΣF = 8 uniform = [2, 2, 2, 2], r = 1, c = 1: p_hit = Σ P(k)(1 − 1/2) = 0.5.
    # T_tree = glue 1 + 3 steps of 1 = 4 < T_v = 10. Neural: 2.952 tokens / (10 + 0.5·3 ms);
    # fast: (0.5·2.952 + 0.5·1) / 10 ms ⇒ neural wins.
    s = predict_ssd(costs, 0.8, 1.0, 3, 8, fanout_mode="uniform")
    assert s.fanout == (2, 2, 2, 2)
    assert s.p_hit == pytest.approx(0.5)
    assert s.backup == "neural"
    assert s.round_ms == pytest.approx(11.5)
    assert s.tok_s == pytest.approx(1000 * 2.952 / 11.5)
    fast = predict_ssd(costs, 0.8, 1.0, 3, 8, fanout_mode="uniform", backup="fast")
    assert fast.tok_s == pytest.approx(1000 * (0.5 * 2.952 + 0.5) / 10.0)
    # Batch 2 (T_v scaled from batch 1 by token count: T_v(2, 4) = T_v(1, 8) = 10): stall prob 1 − 0.5².
    s2 = predict_ssd(costs, 0.8, 1.0, 3, 8, batch=2, fanout_mode="uniform", backup="neural")
    assert s2.round_ms == pytest.approx(10 + 0.75 * 3)
    assert s2.tok_s == pytest.approx(2 * 1000 * 2.952 / 12.25)
    # Overhead is paid every round.
    sd = predict_sd(costs, 0.8, 3, overhead_ms=2.0)
    assert sd.tok_s == pytest.approx(1000 * 2.952 / 15.0)


def test_recommends_plain_decoding_when_verification_grows():
    # T_v(n) = 10·n: a round of K+1 tokens costs as much as K+1 plain steps, and E < K+1.
    cal = toy_calibration(verify=[10.0 * n for n in range(1, 10)], draft_ms=0.5)
    p = plan(cal, alpha=0.9, r=2.0)
    assert isinstance(p, Plan)
    assert p.k == 0 and p.recommended.mode == "ar"
    assert all(x.tok_s < p.ar.tok_s for x in p.sd + p.ssd)


def test_recommends_speculation_when_verification_is_flat():
    p = plan(toy_calibration(draft_ms=0.5), alpha=0.9, r=2.0)
    assert p.k > 0 and p.recommended.mode == "ssd"
    assert p.best_ssd.tok_s > p.best_sd.tok_s > p.ar.tok_s
    assert sum(p.best_ssd.fanout) == p.best_ssd.budget
    assert p.saguaro_c == 1.0
    assert p.b_star is None or p.b_star >= 1


def test_choose_k():
    grow = [10.0 * n for n in range(1, 10)]
    assert choose_k(grow, 0.5, alpha=0.9, p_hit=0.9, k_max=8, mode="sd") == 0
    assert choose_k(grow, 0.5, alpha=0.9, p_hit=0.9, k_max=8, mode="ssd") == 0
    flat = [10.0] * 9
    k_sd = choose_k(flat, 0.5, alpha=0.9, p_hit=0.9, k_max=8, mode="sd")
    k_ssd = choose_k(flat, 0.5, alpha=0.9, p_hit=0.9, k_max=8, mode="ssd")
    assert k_sd > 0 and k_ssd > 0
    # Hand check: flat T_v = 10, t_draft = 0.5, α = 0.9. SD rate(K) = E/(10 + 0.5K) peaks at K = 8 ...
    rates = [expected_tokens(0.9, k) / (10 + 0.5 * k) for k in range(1, 9)]
    assert k_sd == 1 + rates.index(max(rates))
    # ... and K is capped by the measured T_v(n) and by k_max.
    assert choose_k(flat[:4], 0.5, alpha=0.9, p_hit=0.9, k_max=8, mode="sd") <= 3
    assert choose_k(flat, 0.5, alpha=0.9, p_hit=0.9, k_max=2, mode="ssd") <= 2
    # A useless draft (α = 0) never pays.
    assert choose_k(flat, 0.5, alpha=0.0, p_hit=1.0, k_max=8, mode="sd") == 0


@pytest.mark.parametrize("verify", [[10.0] * 9, [10.0 + 2 * n for n in range(9)]])
def test_higher_alpha_never_slower(verify):
    cal = toy_calibration(verify=verify, draft_ms=1.0)
    prev = None
    for a in [0.0, 0.2, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0]:
        p = plan(cal, alpha=a, r=1.5, max_budget=24)
        rates = (p.recommended.tok_s, p.best_sd.tok_s, p.best_ssd.tok_s)
        if prev is not None:
            assert all(x >= y - 1e-9 for x, y in zip(rates, prev)), (a, rates, prev)
        prev = rates


def test_curve_interpolates_and_extrapolates():
    c = Curve.from_points([(1, 10.0), (2, 14.0), (3, 12.0), (4, 20.0), (3, 14.0)], "toy")
    assert c.ys == (10.0, 14.0, 13.0, 20.0)  # a measured dip is kept; repeated sizes are averaged
    assert c(0.5) == 10.0
    assert c(1.5) == pytest.approx(12.0)
    assert c(6) == pytest.approx(20.0 + 2 * (20.0 - 10.0) / 3)
    assert Curve.from_points([(1, 5.0), (2, 4.0)], "toy")(10) == 4.0  # never cheaper past the end


def test_sweep_comparison_and_estimates():
    cal = toy_calibration()
    costs = CostModel(cal)
    ssd = {"config": "ssd", "k": 3, "budget": 8, "concurrency": 1, "temperature": 0.0, "alpha": 0.8,
           "hit_rate": 0.5, "accept_length": 2.952, "fanout": "uniform", "output_throughput": 256.7}  # fmt: skip
    sd = {"config": "sd", "k": 3, "concurrency": 1, "temperature": 0.0, "alpha": 0.8, "accept_length": 2.952,
          "output_throughput": 227.1}  # fmt: skip
    ar = {"config": "ar", "k": 0, "concurrency": 1, "temperature": 0.0, "output_throughput": 50.0}
    assert predict_record(ssd, costs) == pytest.approx(1000 * 2.952 / 11.5)
    assert predict_record(sd, costs) == pytest.approx(1000 * 2.952 / 13.0)
    # r that makes uniform F = 2 hit half the time at c = 1: 1 − 2^−r = 0.5 ⇒ r = 1.
    assert r_from_hit_rate(ssd) == pytest.approx(1.0, abs=1e-6)
    alpha, r, how = estimate_alpha_r([ssd, sd, ar], 0.0)
    assert alpha == pytest.approx(0.8) and r == pytest.approx(1.0, abs=1e-6) and "median" in how
    # Measured time to first token is added to each request.
    slow = dict(ar, mean_ttft_ms=1000.0, output_len=100)
    assert predict_record(slow, costs) == pytest.approx(100 / (1.0 + 1.0))
    table = compare_sweep([ssd, sd, ar], cal)
    assert "within ±15 %: 2 of 3" in table
    assert "MISSED: ar" in table


def test_cli(tmp_path, capsys):
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(toy_calibration(draft_ms=0.5)))
    sweep = tmp_path / "sweep.jsonl"
    sweep.write_text(
        json.dumps({"config": "sd", "k": 3, "concurrency": 1, "alpha": 0.8, "output_throughput": 200.0})
        + "\n"
    )
    out = tmp_path / "plan.json"
    assert main(["--calibration", str(cal), "--sweep", str(sweep), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "recommended:" in text and "measured tok/s" in text and "r = 1.0 assumed" in text
    assert json.loads(out.read_text())["alpha"] == pytest.approx(0.8)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"alpha": 1.5}, "alpha"),
        ({"alpha": -0.1}, "alpha"),
        ({"r": -1.0}, "r"),
        ({"r": float("nan")}, "r"),
        ({"batch": 0}, "batch"),
        ({"c": 2.0}, "c"),
        ({"k_max": -1}, "k_max"),
        ({"max_budget": 0}, "max_budget"),
        ({"fanout_mode": "fancy"}, "fanout_mode"),
        ({"stat": "mean"}, "stat"),
        ({"overhead_ms": -1.0}, "overhead_ms"),
    ],
)
def test_plan_bad_input(kwargs, name):
    args = {"alpha": 0.7, "r": 1.0} | kwargs
    with pytest.raises(ValueError, match=name):
        plan(toy_calibration(), **args)


@pytest.mark.parametrize(
    "cal", [{}, {"target": {}}, {"target": {"verify_ms_by_batch": {"1": [10.0, -1.0]}}}, []]
)
def test_plan_bad_calibration(cal):
    with pytest.raises(ValueError, match="calibration"):
        plan(cal, alpha=0.7, r=1.0)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (([], 1.0, 0.5, 0.5, 4, "sd"), "t_verify"),
        (([10.0, 0.0], 1.0, 0.5, 0.5, 4, "sd"), "t_verify"),
        (([10.0], -1.0, 0.5, 0.5, 4, "sd"), "t_draft"),
        (([10.0], 1.0, 1.2, 0.5, 4, "sd"), "alpha"),
        (([10.0], 1.0, 0.5, -0.5, 4, "ssd"), "p_hit"),
        (([10.0], 1.0, 0.5, 0.5, -1, "sd"), "k_max"),
        (([10.0], 1.0, 0.5, 0.5, 4, "eagle"), "mode"),
    ],
)
def test_choose_k_bad_input(args, name):
    with pytest.raises(ValueError, match=name):
        choose_k(*args)


def test_saguaro_c_from_sweep_and_not_modelled_without():
    cal = toy_calibration()
    base = {"config": "ssd", "k": 3, "budget": 8, "concurrency": 1, "temperature": 0.7, "fanout": "uniform",
            "output_throughput": 100.0}  # fmt: skip
    recs = [
        dict(base, saguaro_c=1.0, alpha=0.8, hit_rate=0.4, accept_length=2.9),
        # Lower C: slightly lower acceptance, higher hit rate, and a slow TTFT that must not count.
        dict(
            base,
            saguaro_c=0.25,
            alpha=0.78,
            hit_rate=0.8,
            accept_length=2.85,
            mean_ttft_ms=5000,
            output_len=8,
        ),
    ]
    table = saguaro_table(recs, cal, 0.7)
    costs = CostModel(cal)
    # Own stats, decode only: C = 0.25 ⇒ 2.85 tokens / (10 + 0.2·3) ms.
    assert table[0.25] == pytest.approx(1000 * 2.85 / 10.6)
    assert table[0.25] > table[1.0] == pytest.approx(predict_record(recs[0], costs))
    p = plan(cal, alpha=0.8, r=1.0, temperature=0.7, saguaro=table)
    assert p.saguaro_c == 0.25 and "measured" in p.saguaro_note
    assert "not modelled" in plan(cal, alpha=0.8, r=1.0, temperature=0.7).saguaro_note
    assert saguaro_table(recs, cal, 0.0) is None


# ---- depth 2 (recursive chain) -------------------------------------------------------------------------
def test_tokens_per_l1_forward_and_forward_counts():
    from sglang_ssd.planner.depth import l1_forwards, tokens_per_l1_forward

    assert tokens_per_l1_forward(0.0, 3) == 1.0 and tokens_per_l1_forward(1.0, 3) == 4.0
    assert tokens_per_l1_forward(0.5, 2) == pytest.approx(1.75)  # 1 + 0.5 + 0.25
    assert l1_forwards(0.0, 3, 4) == 4.0  # nothing accepted: one token per forward
    assert l1_forwards(1.0, 3, 4) == 1.0  # everything accepted: 3 proposals + 1 drawn = K
    assert l1_forwards(1.0, 2, 7) == 3.0  # 3 + 3 + 1 (the last forward proposes only what is left)
    one, many = l1_forwards(0.5, 3, 6), l1_forwards(0.5, 3, 6, branches=20)
    assert 6 / 4 < one < 6 and one < many <= 6  # the slowest of 20 branches sets a tree's length


def test_depth2_pays_off_only_when_a_wider_l1_forward_is_cheap():
    from sglang_ssd.planner.costs import CostModel
    from sglang_ssd.planner.depth import compare_depths

    kw = dict(alpha=0.6, tokens_per_round=2.0, m=3, K=4, budget=8, p_hit=0.5)
    flat = CostModel(toy_calibration(draft_ms=5.0))  # L1 forwards cost the same over 1 or 4 tokens
    good = compare_depths(flat, alpha0=0.8, l0_ms=0.01, **kw)
    assert good["sd_depth2_over_depth1"] > 1.2 and good["draft_ms_per_token"]["depth2"] < 5.0
    assert compare_depths(flat, alpha0=0.0, l0_ms=0.01, **kw)["sd_depth2_over_depth1"] < 1.0  # L0 never right
    steep = toy_calibration(draft_ms=5.0)
    steep["draft"]["chain_ms"] = [5.0 * n for n in range(1, 10)]  # cost grows with every token fed
    bad = compare_depths(CostModel(steep), alpha0=0.8, l0_ms=0.01, **kw)
    assert bad["sd_depth2_over_depth1"] < 1.0


def test_cli_depth2(tmp_path, capsys):
    cal = tmp_path / "cal.json"
    c = toy_calibration(draft_ms=0.5)
    c["l0"] = {"ms_per_token": 0.05}
    cal.write_text(json.dumps(c))
    assert main(["--calibration", str(cal), "--alpha", "0.6", "--r", "1", "--alpha0", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "depth 2 (L0 → L1 → target)" in out and "SD :" in out and "SSD:" in out


def test_serving_overhead_fitted_from_ar_rows():
    from sglang_ssd.planner.sweep import compare_sweep, step_overheads

    cal = toy_calibration(draft_ms=1.0)  # bare T_v = 10 ms
    recs = [
        {"config": "ar", "temperature": 0.0, "concurrency": 1, "k": 0, "output_throughput": 50.0,
         "median_tpot_ms": 20.0},
        {"config": "sd", "temperature": 0.0, "concurrency": 1, "k": 3, "budget": 8, "alpha": 0.5,
         "accept_length": 2.0, "output_throughput": 2000.0 / (10 + 10 + 3)},
    ]  # fmt: skip
    costs = CostModel(cal)
    assert step_overheads(recs, costs) == {(0.0, 1): 10.0}
    served = compare_sweep(recs, cal, serving_overhead=True)
    assert "ar (fit)" in served and "within ±15 %: 1 of 1" in served  # SD: 2 tokens / (10 + 10 + 3·1) ms
    assert "within ±15 %: 0 of 2" in compare_sweep(recs, cal)  # bare costs miss both by far


def test_alpha_for_the_planner_matches_the_measured_tokens_per_round():
    """The sweep's per-token MLE α overstates E(α, K) when accepted lengths are bursty; the planner
    takes the α whose E equals the measured accept length instead."""
    from sglang_ssd.algo.policy import expected_tokens
    from sglang_ssd.planner.rounds import alpha_of

    rec = {"config": "ssd", "k": 4, "alpha": 0.4, "accept_length": 1.4}
    a = alpha_of(rec)
    assert expected_tokens(a, 4) == pytest.approx(1.4, abs=1e-6) and a < 0.4
    assert alpha_of({"config": "ssd", "k": "auto", "alpha": 0.4, "accept_length": 1.4}) == 0.4
    assert alpha_of({"config": "sd", "k": 2, "alpha": 0.3}) == 0.3


def test_expected_max_of_normals():
    from sglang_ssd.planner.rounds import expected_max_normal

    # Known values: 1/√π for two, and the tabulated 1.0294 (four), 1.4236 (eight).
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / 3.141592653589793**0.5, abs=1e-3)
    assert expected_max_normal(4) == pytest.approx(1.0294, abs=1e-3)
    assert expected_max_normal(8) == pytest.approx(1.4236, abs=1e-3)


def test_a_wave_waits_for_its_slowest_request():
    """Spread-out accepted lengths make a batch of 8 slower per token than one request; AR and
    deterministic rounds have no stragglers."""
    from sglang_ssd.planner.rounds import straggler_factor, tokens_per_round_moments

    rec = {"config": "sd", "k": 4, "accept_length": 1.5, "k_hist": {"0": 183, "1": 41, "2": 12, "3": 7, "4": 10}}
    mean, var = tokens_per_round_moments(rec)
    assert mean == pytest.approx((183 + 2 * 41 + 3 * 12 + 4 * 7 + 5 * 10) / 253)
    assert var > 0.5
    # 47 tokens, mean 1.5: 31.3 rounds ± √(47·var/1.5³); eight requests wait for E[max] ≈ +1.42 σ.
    f8 = straggler_factor(8, 47, mean, var)
    sigma = (47 * var / mean**3) ** 0.5
    assert f8 == pytest.approx(1 + 1.4236 * sigma / (47 / mean), rel=1e-3)
    assert 1.0 == straggler_factor(1, 47, mean, var) < straggler_factor(2, 47, mean, var) < f8
    assert straggler_factor(8, 47, 2.0, 0.0) == 1.0
    # Without a histogram: the capped geometric at the record's α (here the α giving E = 1.5).
    m2, v2 = tokens_per_round_moments({"config": "sd", "k": 4, "accept_length": 1.5})
    assert m2 == pytest.approx(1.5, abs=1e-6) and v2 > 0
    # The prediction for a batch of 8 is lowered by exactly that factor (no TTFT in the record).
    cal = toy_calibration()
    base = {"config": "sd", "k": 4, "concurrency": 8, "temperature": 0.0, "alpha": 0.3, "accept_length": 1.5}
    spread = dict(base, output_len=48, k_hist=rec["k_hist"])
    assert predict_record(spread, CostModel(cal)) == pytest.approx(predict_record(base, CostModel(cal)) / f8)


def test_own_prediction_prices_the_backup_mix_the_live_policy_used():
    cal = toy_calibration(draft_ms=2.0)  # T_v 10 ms, neural backup K·2 ms
    rec = {"config": "ssd", "k": 3, "budget": 8, "concurrency": 1, "temperature": 0.0, "alpha": 0.5,
           "hit_rate": 0.5, "accept_length": 2.0, "backup": "auto", "fanout": "uniform"}  # fmt: skip
    costs = CostModel(cal)
    # round = max(T_v, T_tree) + (1 − p)·share·T_neural = 10 + 0.5·share·6 ms
    assert predict_record(dict(rec, neural_backup_share=0.0), costs) == pytest.approx(1000 * 2.0 / 10.0)
    assert predict_record(dict(rec, neural_backup_share=1.0), costs) == pytest.approx(1000 * 2.0 / 13.0)
    assert predict_record(dict(rec, neural_backup_share=0.5), costs) == pytest.approx(1000 * 2.0 / 11.5)


def test_repeated_runs_are_averaged_per_point(tmp_path, capsys):
    from sglang_ssd.planner.sweep import mean_of_runs

    a = [{"config": "sd", "k": 3, "concurrency": 1, "temperature": 0.0, "alpha": 0.6, "output_throughput": 100.0,
          "k_hist": {"0": 3, "3": 1}},
         {"config": "ar", "k": 0, "concurrency": 1, "temperature": 0.0, "output_throughput": 50.0}]  # fmt: skip
    b = [{"config": "sd", "k": 3, "concurrency": 1, "temperature": 0.0, "alpha": 0.8, "output_throughput": 140.0,
          "k_hist": {"0": 1, "1": 2}, "neural_backup_share": 0.5}]  # fmt: skip
    (m,) = mean_of_runs([a, b])  # AR is only in the first run: left out
    assert m["output_throughput"] == pytest.approx(120.0) and m["alpha"] == pytest.approx(0.7)
    assert m["k"] == 3 and m["runs"] == 2 and m["neural_backup_share"] == 0.5
    assert m["k_hist"] == {"0": 4, "1": 2, "3": 1}
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps(toy_calibration(draft_ms=0.5)))
    paths = []
    for i, run in enumerate((a, b)):
        paths.append(tmp_path / f"run{i}.jsonl")
        paths[-1].write_text("\n".join(json.dumps(r) for r in run) + "\n")
    assert main(["--calibration", str(cal), "--sweep", ",".join(map(str, paths)), "--serving-overhead"]) == 0
    out = capsys.readouterr().out
    assert "the mean of 2 runs, 1 points" in out and "| 120.00 |" in out
