"""The SSD settings a launch gets when it names none: auto-K, and ΣF from this machine's costs.

A launch with ``--speculative-algorithm SSD`` and no ``--ssd-k`` uses ``--ssd-k auto``: the worker
picks K per round from live step timings (0 is plain decoding, where speculation cannot pay) and the
draft server drafts the K it picks (``target/auto_k.py``). `make models` measures the target's forward
by verify width and the draft's steps and tree rounds (``bench/calibrate.py --quick``) into
``models/calibration.json``, next to the model folders; auto-K's ΣF, unless ``--ssd-budget`` names
one, is the planner's (``sglang_ssd/planner/choose.py``) for its fastest SSD configuration at batch 1
whose tree takes at most ``TREE_SHARE`` of the verify step, with ΣF at most ``MAX_BUDGET``. At larger
batches the planner's ΣF per request for each K under the same rule is what auto-K asks of the draft
server round by round (``tree_budgets``): at c = 8 the planner's pick at K = 3 was 5 a request on
this machine's calibration of 2026-12-06. The launcher prints the choice and why in one line. Without
a calibration file ΣF is the constant of ``wire/settings.py`` (24) at every batch, and the line says
so."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

from sglang_ssd.target.auto_k import PRIOR_ALPHA, bucket_batches

CALIBRATION_ENV = "SGLANG_SSD_CALIBRATION"
CALIBRATION_NAME = "calibration.json"
# The most of a verify step the planner may fill with the pre-speculation tree, and the most ΣF per
# request. Grid defaults_2026-12-06f: the fixed K's, all at ΣF = 12, were the fastest at c = 1-4 (K = 4
# at c = 1-2, the tree 46-65 ms of a 72-78 ms verify step; K = 2 at c = 4, 55 of 72 ms and a hit rate
# of 0.81), where the planner's picks under a share of 0.5 drafted ΣF = 17 at batch 1 and 8 at K = 2
# at batch 4 (33 of 71 ms, hit rate 0.64). Larger trees than 12 did not pay at batch 1 although the
# planner predicts they do: their forwards also slow the target's (one memory bus), and at ΣF = 33 the
# rounds took 83-86 ms against 76 ms at ΣF = 12, for 0.03 more tokens a round (results/sigmaf33_2026-12-06/).
# A share of 1: the served step is longer than the bare forward the planner prices (at c = 2 a K = 3
# step read 45.0 ms where the calibration predicts 38.2, at c = 4 a K = 2 step 72.9 against 46.3), and
# fixed ΣF = 12 trees the planner prices at 1.1-1.4 verify steps hit 0.77-0.81 at c = 2-4 (grid
# c24_warm_2026-12-07k). Under 0.8 the table gave K = 3 five forks a request at batch 2; the default
# drafted K = 3 there at hit rate 0.70 against fixed K = 3's 0.79, at 0.88 of the best fixed K.
TREE_SHARE = 1.0
MAX_BUDGET = 12
# auto-K with ΣF by batch: 0.95 / 0.94 / 0.93 / 1.13 of the best fixed K (2-5) at c = 1 / 2 / 4 / 8 on
# held-out ShareGPT (1.47x AR at c = 1; bench/results/defaults_sharegpt_2026-12-07c), 1.04 / 0.91 /
# 0.97 / 1.20 on the prompt set (1.28x; defaults_2026-12-07a); mostly parked at c = 8
DEFAULT_K = "auto"
# what the launcher fills in when no flag names it (the README's flag table says so)
LAUNCH_DEFAULTS = {"k": "`auto`", "budget": "the planner's pick from `models/calibration.json` for auto-K (at batch 1; "
                   "smaller at larger batches), else `24`"}


def calibration_path(draft_model_path: str | None) -> Path | None:
    """``$SGLANG_SSD_CALIBRATION``, else ``calibration.json`` beside the draft's model folder."""
    if os.environ.get(CALIBRATION_ENV):
        return Path(os.environ[CALIBRATION_ENV])
    if draft_model_path:
        return Path(draft_model_path).absolute().parent / CALIBRATION_NAME
    return None


def plan_under_rule(calibration: dict, alpha: float, batch: int, k_max: int = 7):
    """The planner's predictions at ``batch`` with every tree within ``TREE_SHARE`` of the verify step
    and at most ``MAX_BUDGET`` forks per request: the one rule behind the launch's ΣF and its table."""
    from sglang_ssd.planner.choose import plan

    return plan(calibration, alpha, 1.0, batch=batch, k_max=k_max, max_budget=MAX_BUDGET, tree_share=TREE_SHARE)


def choose(calibration: dict, alpha: float = PRIOR_ALPHA) -> tuple[int, int, str]:
    """(K, ΣF, why): the planner's fastest SSD setting at batch 1 whose tree takes at most ``TREE_SHARE``
    of the verify step and forks at most ``MAX_BUDGET`` (2026-12-05, without the margin: ΣF = 25 at
    K = 2, a tree predicted at 31.2 of 31.5 ms, and served hit 0.58 against 0.84 at ΣF = 24)."""
    p = plan_under_rule(calibration, alpha, batch=1)
    best = p.best_ssd
    if best is None:
        raise ValueError("the calibration has no draft timings")
    why = (f"planner at α = {alpha:.2f}: {best.tok_s / p.ar.tok_s:.2f}x AR predicted at c = 1, "
           f"fan-out {list(best.fanout)}, p_hit {best.p_hit:.2f}, tree {best.draft_ms:.0f} of "
           f"{best.verify_ms:.0f} ms")  # fmt: skip
    return best.k, best.budget, why


def tree_budgets(calibration: dict, cap: int, alpha: float = PRIOR_ALPHA, k_max: int = 7) -> list[list[int]]:
    """ΣF per request by auto-K's batch-size bucket (rows) and K = 1..k_max (entries): the planner's best
    ΣF for that K at the bucket's smallest batch with the tree within ``TREE_SHARE`` of the verify step,
    at most ``cap`` (the draft server's own ΣF, which sizes its trees' KV)."""
    return [[max(1, min(cap, pr.budget)) for pr in plan_under_rule(calibration, alpha, batch, k_max).ssd]
            for batch in bucket_batches()]  # fmt: skip


def apply(config, given: set[str], draft_model_path: str | None):
    """``config`` with the settings no flag named ⇒ (config, one log line). K defaults to ``auto``
    (K per round from live step timings, 0 = plain decoding; the draft server drafts the K chosen), and
    ΣF for auto-K to the planner's pick from the calibration (the constant without one). ``--ssd-k N``
    keeps its own ΣF default, as before."""
    if "--ssd-k" in given and "--ssd-budget" in given:
        return config, f"SSD settings from flags: K = {config.k}, ΣF = {config.budget}"
    if config.draft_endpoints:  # a draft server started elsewhere drafts with the settings it was given
        return config, f"SSD settings K = {config.k}, ΣF = {config.budget} (draft servers at --ssd-draft-endpoint)"
    if "--ssd-k" not in given:
        config = replace(config, k=DEFAULT_K)
    if config.k != "auto" or "--ssd-budget" in given:
        return config.validate(), f"SSD settings K = {config.k}, ΣF = {config.budget} (flags and defaults)"
    path = calibration_path(draft_model_path)
    if path is None or not path.is_file():
        return config.validate(), (f"SSD defaults K = auto, ΣF = {config.budget} (no calibration at {path}: "
                                   "`make models` writes one; --ssd-k / --ssd-budget override)")  # fmt: skip
    try:
        calibration = json.loads(path.read_text())
        k, budget, why = choose(calibration)
        table = tree_budgets(calibration, budget)
    except (ValueError, KeyError, TypeError) as exc:
        return config.validate(), f"SSD defaults K = auto, ΣF = {config.budget} ({path} unusable: {exc})"
    by_batch = "/".join(str(row[k - 1]) for row in table[:4])
    return replace(config, budget=budget, tree_budgets=table).validate(), (
        f"SSD settings from {path}: K = auto (chosen per round and steering the draft server's depth), "
        f"ΣF = {budget} (the planner's pick for K = {k}, {why}; per request at batch 1/2/4/8 and K = {k}: "
        f"{by_batch}; --ssd-k / --ssd-budget override)")
