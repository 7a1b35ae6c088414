"""The step deadline: a tree step that would still run when the next round is due is held back."""

from __future__ import annotations

import pytest

from sglang_ssd.draft.deadline import GAP_CLIP, GRACE_S, RoundDeadline
from sglang_ssd.draft.engine import DraftEngine, EngineConfig
from sglang_ssd.draft.model import DraftModel
from sglang_ssd.draft.request import Stage
from sglang_ssd.draft.server import DraftServer
from sglang_ssd.wire import DraftParams


def learned(gap_s: float = 0.030, step_s: float = 0.008, rows: int = 8) -> RoundDeadline:
    d = RoundDeadline()
    d.observe_gap(gap_s)
    d.observe_step(rows, step_s)
    return d


def test_no_hold_before_anything_is_measured():
    assert RoundDeadline().hold_s(now=1.0, last_reply=0.99, rows=8) == 0.0
    d = RoundDeadline()
    d.observe_gap(0.030)
    assert d.hold_s(now=0.025, last_reply=0.0, rows=8) == 0.0  # no step time yet
    assert learned().hold_s(now=0.025, last_reply=None, rows=8) == 0.0  # no round answered yet


def test_a_step_ending_after_the_round_is_due_waits_for_it_until_the_grace_ends():
    d = learned(gap_s=0.030, step_s=0.008)
    assert d.hold_s(now=0.020, last_reply=0.0, rows=8) == 0.0  # ends at 28 ms, before the round
    grace = max(GRACE_S, 0.1 * 0.030)
    assert d.hold_s(now=0.025, last_reply=0.0, rows=8) == pytest.approx(0.030 + grace - 0.025)
    assert d.hold_s(now=0.030 + grace + 1e-4, last_reply=0.0, rows=8) == 0.0  # the round is late: step


def test_step_times_are_kept_per_row_bucket():
    d = learned(step_s=0.008, rows=8)
    assert d.step_estimate(5) == pytest.approx(0.008)  # 5..8 rows share a bucket
    assert d.step_estimate(9) is None and d.hold_s(now=0.029, last_reply=0.0, rows=16) == 0.0
    d.observe_step(16, 0.016)
    assert d.hold_s(now=0.020, last_reply=0.0, rows=16) > 0


def test_a_long_idle_gap_moves_the_estimate_by_a_bounded_step():
    d = learned(gap_s=0.030)
    d.observe_gap(5.0)  # a request ended, the next one arrived much later
    assert d.gap.value <= GAP_CLIP * 0.030


def engine_with_trees(tiny_llama, **cfg) -> DraftEngine:
    model = DraftModel(tiny_llama, kv_slots=4096)
    eng = DraftEngine(model, EngineConfig(k=4, fanout_list=[2, 2, 2, 2, 2], backup="fast", **cfg))
    eng.open("a", [1, 2, 3, 4, 5], 6, DraftParams(temperature=0.0))
    eng.work_step()  # the glue: the tree forks, no branch step done yet
    return eng


def test_only_trees_with_a_step_done_are_held(tiny_llama):
    eng = engine_with_trees(tiny_llama)
    req = eng.requests["a"]
    assert req.stage is Stage.TREE and req.tree.steps_done == 0
    eng.deadline = learned(gap_s=0.030, step_s=1.0, rows=req.tree.num_branches)
    eng.prespec.deadline = eng.deadline
    eng._last_reply = __import__("time").monotonic()
    assert eng.hold_s() == 0.0  # nothing decoded yet: a hold would leave the round a miss
    eng.work_step()
    assert req.tree.steps_done == 1
    assert eng.hold_s() > 0.0  # a 1 s step cannot end before the round due in 30 ms
    eng.cfg.step_deadline = False
    assert eng.hold_s() == 0.0


class _QuietTransport:
    """recv never delivers; records each wait."""

    def __init__(self):
        self.waits: list[int] = []

    def recv(self, timeout_ms: int):
        self.waits.append(timeout_ms)
        return None


def test_the_loop_waits_out_a_hold_then_steps(tiny_llama, monkeypatch):
    eng = engine_with_trees(tiny_llama)
    server = DraftServer(eng)
    holds = iter([0.0042, 0.0042, 0.0, 0.0])  # each loop asks twice: the wait, then before stepping
    monkeypatch.setattr(eng, "hold_s", lambda: next(holds, 0.0))
    steps = []
    monkeypatch.setattr(server, "work_step", lambda: steps.append(len(steps)))
    transport, loops = _QuietTransport(), iter(range(2))
    server.serve(transport, should_stop=lambda: next(loops, None) is None)
    assert transport.waits == [5, 0]  # waited (ms, rounded up) instead of stepping, then stepped
    assert steps == [0]
    assert eng.stats.snapshot()["step_holds"] == 1
