"""bench/forward_breakdown.py's arithmetic on server counters (pure functions)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench.forward_breakdown import render, side_figures  # noqa: E402


def _state(width: int, steps: int, forward_s: float, parts: dict[str, tuple[float, int]]) -> dict:
    rounds, fwd = [0] * (width + 1), [0.0] * (width + 1)
    rounds[width], fwd[width] = steps, forward_s
    return {"ssd_width_rounds": rounds, "ssd_width_verify_s": fwd,
            "ssd_module_s": {f"{p}@{width}": s for p, (s, _) in parts.items()},
            "ssd_module_calls": {f"{p}@{width}": n for p, (_, n) in parts.items()}}  # fmt: skip


def test_figures_are_deltas_per_step_and_per_call():
    before = _state(1, 10, 0.4, {"qkv": (0.02, 300), "logits": (0.05, 10)})
    after = _state(1, 110, 4.4, {"qkv": (0.32, 3300), "logits": (0.55, 110)})
    fig = side_figures(before, after, 1)
    assert fig["steps"] == 100 and fig["forward_ms"] == pytest.approx(40.0)
    assert fig["parts"]["qkv"] == pytest.approx((3.0, 100.0))  # 0.3 s over 100 steps and 3000 calls
    assert fig["parts"]["logits"] == pytest.approx((5.0, 5000.0))
    with pytest.raises(ValueError, match="no steps of width 5"):
        side_figures(before, after, 5)


def test_the_extra_splits_over_the_parts():
    plain = {"steps": 100, "forward_ms": 40.0,
             "parts": {"qkv": (3.0, 100.0), "attention": (2.0, 66.7), "logits": (5.0, 5000.0)}}  # fmt: skip
    verify = {"steps": 80, "forward_ms": 48.0,
              "parts": {"qkv": (5.0, 166.7), "attention": (3.0, 100.0), "logits": (6.0, 6000.0)}}  # fmt: skip
    text = render(plain, verify)
    assert "| qkv | 100.0 | 166.7 | 3.00 | 5.00 | +2.00 | 25% |" in text
    assert "verify forward 48.0 ms = 1.20x the plain step (40.0 ms)" in text
    assert "layer linears +2.00, attention +1.00, logits (head included) +1.00, other timed parts +0.00, " \
           "outside the timed parts +4.00" in text
