"""The sweep's merging of repeats and its noise-band verdicts (bench/run_sweep.py, pure functions)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.run_sweep import k_variants_named, merge_repeats, noise_lines, requests_at, spread  # noqa: E402


def _rec(config: str, tps: float, repeat: int, c: int = 1) -> dict:
    return {"config": config, "temperature": 0.0, "concurrency": c, "k": 4, "repeat": repeat,
            "output_throughput": tps, "median_tpot_ms": 1000.0 / tps, "k_hist": {"1": 3}}  # fmt: skip


def test_repeats_merge_into_means_with_their_samples():
    runs = [_rec("ar", 10.0, 0), _rec("ssd", 12.0, 0), _rec("ar", 12.0, 1), _rec("ssd", 14.0, 1)]
    runs[3] |= {"hit_rounds": 6, "k_hist": {"1": 1, "2": 5}}  # a field only one repeat has
    runs[2]["median_tpot_ms"] = None  # a repeat without a TPOT
    by = {r["config"]: r for r in merge_repeats(runs)}
    assert set(by) == {"ar", "ssd"} and by["ar"]["output_throughput"] == 11.0
    assert by["ssd"]["samples"] == [(12.0, 1000.0 / 12.0), (14.0, 1000.0 / 14.0)]
    assert by["ssd"]["hit_rounds"] == 6 and by["ssd"]["k_hist"] == {"1": 4, "2": 5}  # histograms add up
    assert by["ar"]["median_tpot_ms"] == 100.0 and by["ar"]["per_request_tps"] == 10.0  # over the repeat that has it
    assert by["ar"]["concurrency"] == 1 and "repeat" not in by["ar"] and abs(spread(by["ar"]) - 2.0 / 11.0) < 1e-12


def test_a_ratio_inside_the_band_is_parity_and_outside_it_is_not():
    # ssd beats AR by 8 % while AR's repeats differ by 18 %: parity
    loud = noise_lines(merge_repeats([_rec("ar", 10.0, 0), _rec("ar", 12.0, 1), _rec("ssd", 11.9, 0),
                                      _rec("ssd", 11.9, 1)]))  # fmt: skip
    assert loud == ["ssd/AR T=0 c=1 = 1.08 over 2 repeats (band 18.2 %): parity (inside the band)"]
    # the same 8 % with tight repeats is a real difference
    quiet = noise_lines(merge_repeats([_rec("ar", 11.0, 0), _rec("ar", 11.0, 1), _rec("ssd", 11.9, 0),
                                       _rec("ssd", 11.9, 1)]))  # fmt: skip
    assert quiet[0].endswith("faster than AR")
    # one repeat and no AR-repeat server: no band, so no verdict
    alone = noise_lines(merge_repeats([_rec("ar", 10.0, 0), _rec("ssd", 13.0, 0)]))
    assert alone == ["ssd/AR T=0 c=1 = 1.30 over 1 repeats (no noise band measured: not judged)"]


def test_points_from_concurrency_4_run_twice_the_requests():
    assert [requests_at(c, 32) for c in (1, 2, 4, 8)] == [32, 32, 64, 64]


def test_per_k_counts_windows_the_draft_servers_counters():
    from bench.run_sweep import per_k_counts

    before = {"outcome_k0": 10, "hit_k0": 4, "fanout_k0": 30, "tree_step_count": 100, "tree_step_us_total": 500_000}
    after = {"outcome_k0": 30, "hit_k0": 14, "fanout_k0": 90, "outcome_k1": 5, "hit_k1": 5, "fanout_k1": 10,
             "tree_step_count": 150, "tree_step_us_total": 800_000, "backup_fast": 3, "backup_neural": 1}
    got = per_k_counts(before, after)
    assert got["k_hist"] == {"0": 20, "1": 5}
    assert got["hit_rate_by_k"] == {"0": 0.5, "1": 1.0}
    assert got["fanout_by_k"] == {"0": 3.0, "1": 2.0}
    assert got["neural_backup_share"] == 0.25
    assert got["draft_steps"] == 50 and got["draft_busy_ms"] == 300.0 and got["draft_step_ms"] == 6.0
    assert "draft_steps" not in per_k_counts(after, after)  # no forwards in the window: no timing


def test_a_points_acceptance_and_timings_come_from_the_windowed_counters():
    from bench.run_sweep import summarize

    before = {"ssd_rounds": 2, "ssd_drafted": 8, "ssd_accepted": 8, "ssd_rejected": 0, "ssd_emitted": 10,
              "ssd_hits": 0, "ssd_lookups": 2, "ssd_verify_s": 0.1, "ssd_total_s": 0.2}  # fmt: skip
    after = {"ssd_rounds": 12, "ssd_drafted": 48, "ssd_accepted": 23, "ssd_rejected": 5, "ssd_emitted": 35,
             "ssd_hits": 6, "ssd_lookups": 12, "ssd_verify_s": 0.6, "ssd_total_s": 1.2}  # fmt: skip
    rec = summarize("ssd", {"output_throughput": 20.0, "median_tpot_ms": 50.0}, before, after, {"concurrency": 1})
    assert rec["alpha"] == 15 / 20 and rec["accepted_fraction"] == 15 / 40
    assert rec["hit_rate"] == 0.6 and abs(rec["backup_rate"] - 0.4) < 1e-12
    assert rec["accept_length"] == 2.5 and rec["steps"] == 10
    assert abs(rec["verify_ms"] - 50.0) < 1e-9 and abs(rec["total_ms"] - 100.0) < 1e-9
    ar = summarize("ar", {"output_throughput": 20.0}, {}, {}, {"concurrency": 1})
    assert "alpha" not in ar and ar["accept_length"] is None


def test_a_code_b_configuration_is_compared_with_the_same_configuration_of_this_checkout():
    from bench.run_sweep import route_lines

    recs = [{"config": "ar", "temperature": 0.0, "concurrency": 1, "output_throughput": 22.0},
            {"config": "ar^b", "temperature": 0.0, "concurrency": 1, "output_throughput": 20.0},
            {"config": "ssd@torch", "temperature": 0.0, "concurrency": 1, "output_throughput": 10.0}]  # fmt: skip
    lines = route_lines(recs)
    assert "code ar T=0 c=1: this checkout / --code-b = 1.10" in lines
    assert not any("route" in ln for ln in lines)  # ssd@torch without ssd: nothing to compare


def test_the_verify_step_is_judged_on_full_width_rounds():
    # A K = 4 SSD point whose misses verified shorter chains (and plain steps): the mean over all rounds
    # (35 ms) would flatter the K = 4 verify step; the line takes the width-5 rounds (50 ms).
    from bench.run_sweep import by_width, route_lines

    before = {"ssd_width_rounds": [0, 1, 0, 0, 0, 2], "ssd_width_verify_s": [0.0, 0.02, 0.0, 0.0, 0.0, 0.1]}
    after = {"ssd_width_rounds": [0, 11, 0, 5, 0, 12], "ssd_width_verify_s": [0.0, 0.22, 0.0, 0.15, 0.0, 0.6]}
    ssd = {"config": "ssd", "temperature": 0.0, "concurrency": 1, "k": 4, "verify_ms": 35.0,
           "output_throughput": 20.0, **by_width(before, after)}  # fmt: skip
    assert ssd["rounds_by_width"] == {"1": 10, "3": 5, "5": 10}
    assert [round(ssd["verify_ms_by_width"][d], 9) for d in ("1", "3", "5")] == [20.0, 30.0, 50.0]
    plain = {"config": "ssd_k0", "temperature": 0.0, "concurrency": 1, "k": 0, "verify_ms": 40.0,
             "output_throughput": 18.0, **by_width({}, {"ssd_width_rounds": [0, 4], "ssd_width_verify_s": [0, 0.16]})}  # fmt: skip
    line = [ln for ln in route_lines([ssd, plain]) if ln.startswith("verify step")]
    assert line == ["verify step (default route): K = 4 verify 50.0 ms = 1.25x the plain step (40.0 ms), worker "
                    "phase timings, c = 1, T = 0 (full 5-token chains, 10 of 25 rounds); 2.50x its own 10 plain "
                    "rounds (20.0 ms)"]  # fmt: skip
    # Two repeats: each width's mean weighted by its rounds
    twice = merge_repeats([ssd | {"repeat": 0},
                           ssd | {"repeat": 1, "rounds_by_width": {"5": 30}, "verify_ms_by_width": {"5": 60.0}}])
    assert twice[0]["rounds_by_width"]["5"] == 40 and abs(twice[0]["verify_ms_by_width"]["5"] - 57.5) < 1e-9
    # A run without the counters says what its figure is
    old = [{k: v for k, v in r.items() if "by_width" not in k} for r in (ssd, plain)]
    assert [ln for ln in route_lines(old) if ln.startswith("verify step")][0].endswith(
        "(mean over all rounds, shorter chains included)")


def test_the_verify_step_in_thread_cpu_time_and_for_sd():
    # Servers that count the scheduler thread's CPU time get it next to the wall time, and an SD point
    # (whose draft idles during the verify) gets its own line against the same plain step.
    from bench.run_sweep import by_width, route_lines

    after = {"ssd_width_rounds": [0, 10, 0, 0, 0, 10], "ssd_width_verify_s": [0.0, 0.2, 0.0, 0.0, 0.0, 0.5],
             "ssd_width_verify_cpu_s": [0.0, 0.18, 0.0, 0.0, 0.0, 0.45]}  # fmt: skip
    ssd = {"config": "ssd", "temperature": 0.0, "concurrency": 1, "k": 4, "verify_ms": 35.0,
           "output_throughput": 20.0, **by_width({}, after)}  # fmt: skip
    assert ssd["verify_cpu_ms_by_width"] == {"1": 18.0, "5": 45.0}
    sd = ssd | {"config": "sd", "verify_ms_by_width": {"5": 44.0}, "verify_cpu_ms_by_width": {"5": 41.4},
                "rounds_by_width": {"5": 20}}  # fmt: skip
    plain = {"config": "ssd_k0", "temperature": 0.0, "concurrency": 1, "k": 0, "verify_ms": 40.0,
             "output_throughput": 18.0, "rounds_by_width": {"1": 4}, "verify_ms_by_width": {"1": 40.0},
             "verify_cpu_ms_by_width": {"1": 36.0}}  # fmt: skip
    lines = [ln for ln in route_lines([ssd, sd, plain]) if ln.startswith("verify step")]
    assert lines == [
        "verify step (default route): K = 4 verify 50.0 ms = 1.25x the plain step (40.0 ms), worker phase timings, "
        "c = 1, T = 0 (full 5-token chains, 10 of 20 rounds); thread CPU time 45.0 ms = 1.25x (36.0 ms); "
        "2.50x its own 10 plain rounds (20.0 ms)",
        "verify step sd (default route): K = 4 verify 44.0 ms = 1.10x the plain step (40.0 ms), worker phase "
        "timings, c = 1, T = 0 (full 5-token chains, 20 of 20 rounds); thread CPU time 41.4 ms = 1.15x (36.0 ms)",
    ]
    # A repeat without the CPU counters (an older server) drops the CPU figure, keeps the wall time
    twice = merge_repeats([ssd | {"repeat": 0}, {k: v for k, v in ssd.items() if k != "verify_cpu_ms_by_width"}])
    assert "verify_cpu_ms_by_width" not in twice[0] and twice[0]["verify_ms_by_width"]["5"] == 50.0


def test_an_ab_configuration_is_not_a_candidate_for_the_best_fixed_k():
    """`ssd_kauto^b` (auto-K from another checkout) once stood in for the best fixed K at c = 8."""
    from bench.run_sweep import defaults_lines

    recs = merge_repeats([_rec("ar", 100.0, 0, c=8), _rec("ssd_kauto", 95.0, 0, c=8), _rec("ssd_kauto^b", 99.0, 0, c=8),
                          _rec("ssd_k2", 50.0, 0, c=8), _rec("ar", 30.0, 0), _rec("ssd_kauto", 36.0, 0),
                          _rec("ssd_k2", 37.0, 0), _rec("ssd_k4~old", 40.0, 0)])  # fmt: skip
    lines = defaults_lines(recs, "ssd_kauto")
    assert lines[0] == ("defaults: SSD/AR = 1.20 at c = 1 (best fixed K = 4: 1.23; default/best = 0.97; "
                        "worst default/best over c ≤ 8 = 0.97 at T = 0, c = 1)")
    assert lines[2] == "default (ssd_kauto) T=0 c=8: 0.95x AR, 1.90x best fixed K = 4"


def test_fixed_k_variants_come_from_the_configuration_names():
    names = ["ar", "ssd_k3", "ssd_k2^b", "ssd_k3@torch", "ssd_kauto", "ssd_default", "ssd_k10"]
    assert k_variants_named(names) == ["3", "2", "10"]
