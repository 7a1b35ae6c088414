"""A launch that names no SSD setting gets auto-K with ΣF from the planner over this machine's
calibration; the draft server it starts drafts the launch's K, and a round's depth steers it
(target/defaults.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ssd.draft.cli import build_server, parse_args
from sglang_ssd.launch_server import build_sglang_argv
from sglang_ssd.target import defaults
from sglang_ssd.target.auto_k import PRIOR_ALPHA, bucket_batches
from sglang_ssd.target.draft_fleet import draft_server_command
from sglang_ssd.wire import DraftClient, DraftParams, Outcome
from sglang_ssd.wire.settings import AUTO_K_MAX, DraftSettings
from sglang_ssd.wire.transport import InProcClientTransport

CALIBRATION = Path(__file__).resolve().parents[2] / "bench" / "results" / "calibration.json"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    from sglang_ssd.tools.random_model import write_random_model

    return write_random_model(tmp_path_factory.mktemp("tiny"), vocab_size=256, hidden_size=64, intermediate_size=128,
                              num_layers=2, num_heads=4, num_kv_heads=2, seed=1)  # fmt: skip


@pytest.fixture
def calibrated(tmp_path, monkeypatch, tiny_llama):
    """A draft folder with a calibration file beside it (the layout `make models` writes)."""
    draft = tmp_path / "draft"
    draft.symlink_to(tiny_llama, target_is_directory=True)
    (tmp_path / "calibration.json").write_text(CALIBRATION.read_text())
    monkeypatch.delenv(defaults.CALIBRATION_ENV, raising=False)
    return draft


def launch(draft: Path, *flags: str):
    _, _, _, config = build_sglang_argv(["--model-path", str(draft), "--device", "cpu", "--speculative-algorithm",
                                         "SSD", "--speculative-draft-model-path", str(draft), *flags])  # fmt: skip
    return config


def test_no_flag_launches_auto_k_with_the_planners_budget(calibrated, capsys):
    _, budget, _ = defaults.choose(json.loads(CALIBRATION.read_text()))
    config = launch(calibrated)
    assert (config.k, config.budget) == ("auto", budget)
    assert "K = auto (chosen per round" in capsys.readouterr().err  # the one log line says what it picked
    again = launch(calibrated, "--ssd-k", "auto")  # the same launch, spelled out
    assert (again.k, again.budget) == ("auto", budget)


def test_a_flag_overrides_the_calibration(calibrated):
    config = launch(calibrated, "--ssd-k", "5")
    assert (config.k, config.budget) == (5, DraftSettings().budget)  # a fixed K keeps its own ΣF default
    config = launch(calibrated, "--ssd-budget", "9")
    assert (config.k, config.budget) == ("auto", 9)
    config = launch(calibrated, "--ssd-k", "3", "--ssd-budget", "9")
    assert (config.k, config.budget) == (3, 9)


def test_without_a_calibration_the_constants_stay(tmp_path, tiny_llama, monkeypatch, capsys):
    monkeypatch.setenv(defaults.CALIBRATION_ENV, str(tmp_path / "missing.json"))
    config = launch(tiny_llama)
    assert (config.k, config.budget) == ("auto", DraftSettings().budget)
    assert "no calibration at" in capsys.readouterr().err


@pytest.mark.parametrize("flags", [(), ("--ssd-k", "3")])  # (a neural backup: a full first draft)
def test_the_launch_k_reaches_the_draft_server_and_it_drafts_that_depth(calibrated, flags):
    """The draft server the launcher starts drafts the launch's K: a fixed K as given, and under the
    default auto-K its ceiling until the worker's first round steers it (tests/wire/test_sockets.py)."""
    config = launch(calibrated, *flags, "--ssd-backup", "neural")
    depth = AUTO_K_MAX if config.k == "auto" else config.k
    command = draft_server_command(config, "ipc:///tmp/unused.sock")
    server = build_server(parse_args(command[3:]))  # [python, -m, module, flags...]
    assert server.engine.k == depth and server.engine.budget == config.budget
    client = DraftClient("inproc://x", transport=InProcClientTransport(server, drain=True))
    spec = client.open("a", [1, 2, 3, 4, 5], 6, DraftParams(temperature=0.0))
    tree = server.engine.requests["a"].tree  # the pre-speculation for the next round, drafted (drain)
    assert tree.steps_done == depth
    accepted, bonus = int(tree.fork_k[0]), int(tree.fork_tok[0])  # an outcome the tree cached
    assert len(spec.tokens) == depth
    hit = client.round([Outcome("a", accepted, bonus)], depth=2, budget=3)[0]
    assert hit.hit and hit.tokens.shape == (depth,)
    assert server.engine.k == 2  # the round's depth holds from the next tree on
    assert sum(server.engine.requests["a"].plan) == min(3, config.budget)  # and its ΣF
    client.close("a")


def test_larger_batches_ask_for_smaller_trees(calibrated, capsys):
    """The default launch carries auto-K's ΣF by batch and K from the planner: the batch-1 row at the
    planner's K is the launch's ΣF, no entry exceeds it, a larger batch never asks for more, and every
    entry's tree fits the rule of the batch-1 choice (at most TREE_SHARE of the verify step, at most
    MAX_BUDGET forks)."""
    cal = json.loads(CALIBRATION.read_text())
    k, budget, _ = defaults.choose(cal)
    table = launch(calibrated).tree_budgets
    assert len(table) == len(bucket_batches()) and table[0][k - 1] == budget
    assert "per request at batch 1/2/4/8" in capsys.readouterr().err
    for row, bigger in zip(table, table[1:]):
        assert all(1 <= b <= a <= budget for a, b in zip(row, bigger))
    assert table[2][k - 1] < budget  # at batch 4 the batch-1 tree would not fit
    for batch, row in zip(bucket_batches(), table):
        for p in defaults.plan_under_rule(cal, PRIOR_ALPHA, batch).ssd:
            if row[p.k - 1] > 1:
                assert p.draft_ms <= defaults.TREE_SHARE * p.verify_ms and row[p.k - 1] == min(budget, p.budget)
    assert launch(calibrated, "--ssd-budget", "9").tree_budgets == []  # a named ΣF holds at every batch


def test_the_launch_tree_stays_inside_the_verify_step_and_the_cap():
    from sglang_ssd.planner.choose import plan

    cal = json.loads(CALIBRATION.read_text())
    free = plan(cal, PRIOR_ALPHA, 1.0, k_max=7).best_ssd
    held = defaults.plan_under_rule(cal, PRIOR_ALPHA, batch=1).best_ssd
    assert held.draft_ms <= defaults.TREE_SHARE * held.verify_ms and held.budget <= defaults.MAX_BUDGET
    assert free.budget > defaults.MAX_BUDGET  # the cap changes the choice here (its tree fits the share)
    # Under the cap the share still binds at depth: on this calibration at K = 6, 5 forks where 7 fit the cap.
    capped = plan(cal, PRIOR_ALPHA, 1.0, k_max=7, max_budget=defaults.MAX_BUDGET).ssd
    ruled = defaults.plan_under_rule(cal, PRIOR_ALPHA, batch=1).ssd
    assert [r.budget for r in ruled] != [c.budget for c in capped]
    assert all(r.draft_ms <= defaults.TREE_SHARE * r.verify_ms for r in ruled)
    assert (held.k, held.budget) == defaults.choose(cal)[:2]
