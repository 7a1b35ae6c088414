"""auto-K under the step-time noise of this host (bench/auto_k_noise.py): one noisy plain step or a few
unlucky first drafts must not park a batch where drafting wins, and it still parks where plain wins."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.auto_k_noise import WORLDS, efficiency, main  # noqa: E402

WORLD = {w.name: w for w in WORLDS}


def test_batch_one_keeps_drafting_under_heavy_step_noise():
    # 30 % step noise, drafting wins by about a fifth: before the plain steps were averaged first and
    # the ratios kept a long memory, 3 of these 10 runs parked and ran at 0.67-0.72 of the best fixed K
    # (mean 0.87; now 0.93-1.01, mean 0.97; figures of the simulation before misses drafted nothing).
    eff = efficiency(WORLD["c1"], 0.3, seeds=10)
    assert eff[1] >= 0.9 and sum(eff) / len(eff) >= 0.93, eff


def test_batch_four_keeps_drafting_after_re_opens():
    # Each return from plain decoding re-opens the batch, and its first round drafts from the open's
    # backup. When those rounds taught the yield, 10 of these 20 runs parked at 0.80-0.82 of the best
    # fixed K (mean 0.89), as grid h did at c = 4; now 18 run at 0.96-0.99 (mean 0.97).
    eff = efficiency(WORLD["c4"], 0.15, seeds=20)
    assert eff[2] >= 0.9 and sum(eff) / len(eff) >= 0.94, eff


def test_batch_two_is_not_parked_by_the_slow_rounds_after_re_opens():
    # The first two drafted rounds after plain decoding at 2x their cost (grid c24_coldfix_2026-12-07j's
    # parked c = 2 run): sampling the second one, auto-K reached 0.83 of the best fixed K (10th
    # percentile 0.74); sampling from the third, 0.97.
    eff = efficiency(WORLD["c2-reopen"], 0.15, seeds=10)
    assert eff[1] >= 0.9 and sum(eff) / len(eff) >= 0.93, eff


def test_a_batch_where_plain_decoding_wins_still_parks():
    eff = efficiency(WORLD["c8-plain"], 0.3, seeds=10)
    assert sum(eff) / len(eff) >= 0.95, eff


def test_the_script_writes_its_rows(tmp_path, capsys):
    out = tmp_path / "noise.json"
    main(["--seeds", "2", "--noise", "0.1", "--rounds", "300", "--out", str(out)])
    assert "c4-near" in capsys.readouterr().out
    assert out.read_text().count('"world"') == len(WORLDS)
