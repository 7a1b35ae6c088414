"""A launch that names no SSD setting gets K and ΣF from the planner over this machine's calibration,
the draft server it starts is told that K, and it drafts that depth (target/defaults.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ssd.draft.cli import build_server, parse_args
from sglang_ssd.launch_server import build_sglang_argv
from sglang_ssd.target import defaults
from sglang_ssd.target.draft_fleet import draft_server_command
from sglang_ssd.wire import DraftClient, DraftParams, Outcome
from sglang_ssd.wire.settings import DraftSettings
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


def test_no_flag_takes_the_planners_choice(calibrated, capsys):
    k, budget, _ = defaults.choose(json.loads(CALIBRATION.read_text()))
    config = launch(calibrated)
    assert (config.k, config.budget) == (k, budget)
    assert f"K = {k}, ΣF = {budget}" in capsys.readouterr().err  # the one log line says what it picked


def test_a_flag_overrides_the_calibration(calibrated):
    assert launch(calibrated, "--ssd-k", "5").k == 5
    config = launch(calibrated, "--ssd-budget", "9")
    assert (config.k, config.budget) == (DraftSettings().k, 9)


def test_auto_k_alone_takes_the_calibrated_budget(calibrated, capsys):
    """`--ssd-k auto` chooses K per round (and steers the draft server's depth); ΣF still comes from
    the calibration unless --ssd-budget names one."""
    _, budget, _ = defaults.choose(json.loads(CALIBRATION.read_text()))
    config = launch(calibrated, "--ssd-k", "auto")
    assert (config.k, config.budget) == ("auto", budget)
    assert "auto-K picks K per round" in capsys.readouterr().err
    assert launch(calibrated, "--ssd-k", "auto", "--ssd-budget", "9").budget == 9


def test_without_a_calibration_the_constants_stay(tmp_path, tiny_llama, monkeypatch):
    monkeypatch.setenv(defaults.CALIBRATION_ENV, str(tmp_path / "missing.json"))
    config = launch(tiny_llama)
    assert (config.k, config.budget) == (DraftSettings().k, DraftSettings().budget)


def test_the_chosen_k_reaches_the_draft_server_and_it_drafts_that_depth(calibrated):
    config = launch(calibrated)
    command = draft_server_command(config, "ipc:///tmp/unused.sock")
    server = build_server(parse_args(command[3:]))  # [python, -m, module, flags...]
    assert server.engine.k == config.k
    client = DraftClient("inproc://x", transport=InProcClientTransport(server, drain=True))
    spec = client.open("a", [1, 2, 3, 4, 5], 6, DraftParams(temperature=0.0))
    tree = server.engine.requests["a"].tree  # the pre-speculation for the next round, drafted (drain)
    assert tree.steps_done == config.k
    accepted = len(spec.tokens)  # every proposed token accepted, then a bonus the tree cached
    bonus = int(tree.fork_tok[(tree.fork_k == accepted).nonzero()[0, 0]])
    hit = client.round([Outcome("a", accepted, bonus)])[0]
    assert hit.hit and hit.tokens.shape == (config.k,)
    client.close("a")


def test_the_tree_margin_keeps_the_tree_inside_the_verify_step():
    from sglang_ssd.planner.choose import plan

    cal = json.loads(CALIBRATION.read_text())
    free = plan(cal, defaults.PRIOR_ALPHA, 1.0, k_max=7).best_ssd
    held = plan(cal, defaults.PRIOR_ALPHA, 1.0, k_max=7, tree_share=defaults.TREE_SHARE).best_ssd
    assert held.draft_ms <= defaults.TREE_SHARE * held.verify_ms
    assert free.draft_ms > defaults.TREE_SHARE * free.verify_ms  # the margin changes the choice here
    assert (held.k, held.budget) == defaults.choose(cal)[:2]
