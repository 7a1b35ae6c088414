"""The windowed counters (`target/metrics.py:window`) that the sweep and the demo report."""

from sglang_ssd.target import metrics


def test_window_differences_the_counters_so_a_warm_up_does_not_count():
    warm = {"ssd_rounds": 3, "ssd_drafted": 12, "ssd_accepted": 12, "ssd_rejected": 0, "ssd_emitted": 15,
            "ssd_hits": 0, "ssd_lookups": 3}  # fmt: skip
    # In the window: 10 rounds of K = 4, 6 of them stopped at a rejection; 18 accepted, 28 emitted.
    after = {"ssd_rounds": 13, "ssd_drafted": 52, "ssd_accepted": 30, "ssd_rejected": 6, "ssd_emitted": 43,
             "ssd_hits": 7, "ssd_lookups": 13, "ssd_k": 4}  # fmt: skip
    w = metrics.window(warm, after)
    assert w["rounds"] == 10
    assert w["alpha"] == 18 / (18 + 6)  # accepted / (accepted + rejections), not accepted / drafted
    assert w["accepted_fraction"] == 18 / 40
    assert w["hit_rate"] == 7 / 10
    assert w["tokens_per_round"] == 28 / 10


def test_window_without_rounds_is_empty_and_alpha_of_nothing_is_zero():
    snap = {"ssd_rounds": 5, "ssd_accepted": 9, "ssd_rejected": 2}
    assert metrics.window(snap, dict(snap)) == {}
    assert metrics.window({}, {}) == {}
    assert metrics.alpha(0, 0) == 0.0


def test_the_workers_summary_uses_the_same_alpha():
    s = metrics.SSDStats()
    s.record_round(num_draft=[4, 4], accepted=[4, 1], width=5, verify_s=0.01, link_s=0.0, total_s=0.02)
    assert s.summary()["ssd_alpha"] == metrics.alpha(5, 1)


def test_rounds_are_counted_by_their_chain_width():
    s = metrics.SSDStats()
    s.record_round(num_draft=[4, 2], accepted=[1, 2], width=5, verify_s=0.05, link_s=0.0, total_s=0.06, verify_cpu_s=0.04)
    s.record_round(num_draft=[0], accepted=[0], width=1, verify_s=0.03, link_s=0.0, total_s=0.04,  # a plain step
                   verify_cpu_s=0.025)
    s.record_round(num_draft=[4], accepted=[4], width=5, verify_s=0.07, link_s=0.0, total_s=0.08, verify_cpu_s=0.06)
    assert s.width_rounds == [0, 1, 0, 0, 0, 2]
    assert [round(v, 9) for v in s.width_verify_s] == [0.0, 0.03, 0.0, 0.0, 0.0, 0.12]
    assert [round(v, 9) for v in s.width_verify_cpu_s] == [0.0, 0.025, 0.0, 0.0, 0.0, 0.1]
    # a shorter speculation runs the padded full-width forward, and is counted there
    s.record_round(num_draft=[2], accepted=[2], width=5, verify_s=0.01, link_s=0.0, total_s=0.02)
    assert s.width_rounds == [0, 1, 0, 0, 0, 3]
