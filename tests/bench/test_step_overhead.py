"""bench/step_overhead.py without a server: a py-spy stack's phase, and the fixed-form line."""

from collections import Counter

from bench.step_overhead import PHASES, phase_of, report, split


def test_a_stack_falls_in_the_first_phase_it_reaches():
    ssd_entry = "SSDWorker.forward_batch_generation (/x/sglang_ssd/target/worker.py:90)"
    model = "TpModelWorker.forward_batch_generation (/x/sglang/srt/managers/tp_worker.py:600)"
    loop = "run_scheduler_process (scheduler.py:6368);Scheduler.event_loop_overlap (scheduler.py:2123)"
    assert phase_of(f"{loop};{ssd_entry};SSDWorker._propose (w.py:2);recv (z.py:3)") == "ssd_round"
    assert phase_of(f"{loop};{ssd_entry};SSDWorker._verify (w.py:1);{model};linear (l.py:2)") == "forward"
    assert phase_of(f"{loop};Scheduler.process_batch_result (s.py:9)") == "result"
    assert phase_of(f"{loop};Scheduler.on_idle (s.py:2);Poller.poll (poll.py:106)") == "idle"
    assert phase_of(f"{loop};Scheduler.something (s.py:2)") == "other"
    assert phase_of("Thread._bootstrap (threading.py:1002);TMonitor.run (tqdm/_monitor.py:69)") is None


def test_phase_shares_add_up_to_all_samples():
    share = split(Counter({"forward": 60, "result": 30, "idle": 10}))
    assert share["forward"] == 60.0 and share["result"] == 30.0 and abs(sum(share.values()) - 100.0) < 1e-9
    assert set(share) == {*PHASES, "other"}


def test_the_fixed_form_line():
    ar = {"config": "ar", "concurrency": 1, "median_tpot_ms": 33.0, "phase_percent": split(Counter()),
          "samples": 0}
    ssd = {**ar, "config": "ssd", "median_tpot_ms": 25.0, "accept_length": 1.6, "verify_ms": 36.0}
    line = report([ar, ssd], 30.0, 29.0, 31.0)[0]
    assert line == ("step overhead: AR TPOT 33.0 ms over a plain forward 30.0 ms = 1.10 (c = 1); "
                    "SSD round 40.0 ms over its verify 36.0 ms = 1.11")
