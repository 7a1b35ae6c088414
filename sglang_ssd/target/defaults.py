"""The SSD settings a launch gets when it names none: chosen by the planner from this machine's costs.

`make models` measures the target's forward by verify width and the draft's steps and tree rounds
(``bench/calibrate.py --quick``) into ``models/calibration.json``, next to the model folders. A launch
with ``--speculative-algorithm SSD`` and neither ``--ssd-k`` nor ``--ssd-budget`` hands that file to
the planner (``sglang_ssd/planner/choose.py``) and takes its fastest SSD configuration at batch 1 whose tree
leaves a quarter of the verify step free: K and ΣF (the geometric fan-out follows from them). It
prints that choice and why in one line; any ``--ssd-k`` or ``--ssd-budget`` flag overrides it. Without a calibration file the measured-best constants of
``wire/settings.py`` (K = 4, ΣF = 24 on this project's CPU) stay, and the line says so.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

CALIBRATION_ENV = "SGLANG_SSD_CALIBRATION"
CALIBRATION_NAME = "calibration.json"
# The shipped draft's greedy per-token acceptance on held-out text is 0.43-0.50
# (sglang_ssd/tools/weights/draft_eval*.json): the planner prices K with the middle of that range.
PRIOR_ALPHA = 0.47
CHOSEN = ("k", "budget")
TREE_SHARE = 0.75  # the most of a verify step the planner may fill with the pre-speculation tree


def calibration_path(draft_model_path: str | None) -> Path | None:
    """``$SGLANG_SSD_CALIBRATION``, else ``calibration.json`` beside the draft's model folder."""
    if os.environ.get(CALIBRATION_ENV):
        return Path(os.environ[CALIBRATION_ENV])
    if draft_model_path:
        return Path(draft_model_path).absolute().parent / CALIBRATION_NAME
    return None


def choose(calibration: dict, alpha: float = PRIOR_ALPHA) -> tuple[int, int, str]:
    """(K, ΣF, why): the planner's fastest SSD setting at batch 1 whose tree takes at most ``TREE_SHARE``
    of the verify step (2026-12-05, without the margin: ΣF = 25 at K = 2, a tree predicted at 31.2 of
    31.5 ms, and served hit 0.58 against 0.84 at ΣF = 24)."""
    from sglang_ssd.planner.choose import plan

    p = plan(calibration, alpha, 1.0, batch=1, k_max=7, tree_share=TREE_SHARE)
    best = p.best_ssd
    if best is None:
        raise ValueError("the calibration has no draft timings")
    why = (f"planner at α = {alpha:.2f}: {best.tok_s / p.ar.tok_s:.2f}x AR predicted at c = 1, "
           f"fan-out {list(best.fanout)}, p_hit {best.p_hit:.2f}, tree {best.draft_ms:.0f} of "
           f"{best.verify_ms:.0f} ms")  # fmt: skip
    return best.k, best.budget, why


def apply(config, given: set[str], draft_model_path: str | None):
    """``config`` with K and ΣF from the calibration where no flag set them ⇒ (config, one log line)."""
    flags = {f"--ssd-{name}" for name in CHOSEN}
    # `--ssd-k auto` alone still takes ΣF from the calibration (auto-K steers the depth, not ΣF)
    auto_only = config.k == "auto" and "--ssd-budget" not in given
    if given & flags and not auto_only:
        return config, f"SSD settings from flags: K = {config.k}, ΣF = {config.budget}"
    if config.draft_endpoints:  # a draft server started elsewhere drafts with the settings it was given
        return config, f"SSD settings K = {config.k}, ΣF = {config.budget} (draft servers at --ssd-draft-endpoint)"
    path = calibration_path(draft_model_path)
    if path is None or not path.is_file():
        return config, (f"SSD defaults K = {config.k}, ΣF = {config.budget} (no calibration at {path}: "
                        "`make models` writes one; --ssd-k / --ssd-budget override)")  # fmt: skip
    try:
        k, budget, why = choose(json.loads(path.read_text()))
    except (ValueError, KeyError, TypeError) as exc:
        return config, f"SSD defaults K = {config.k}, ΣF = {config.budget} ({path} unusable: {exc})"
    if auto_only:
        k, why = "auto", f"ΣF for K = {k}, {why}; auto-K picks K per round and steers the draft server's depth"
    return replace(config, k=k, budget=budget).validate(), (
        f"SSD settings from {path}: K = {k}, ΣF = {budget} ({why}; --ssd-k / --ssd-budget override)")
