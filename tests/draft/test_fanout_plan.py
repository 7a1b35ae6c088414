"""The draft server's backup choice (sglang_ssd/draft/fanout_plan.py): forced modes, and auto's tries of
the backup its policy did not pick."""

from __future__ import annotations

import pytest

from sglang_ssd.draft.fanout_plan import EXPLORE_EVERY, BackupChooser


@pytest.mark.parametrize("mode", ["neural", "fast"])
def test_a_forced_backup_is_always_that_backup(mode):
    chooser = BackupChooser(mode, k=4)
    assert {chooser.choose(b) for b in range(1, 200)} == {mode}


def test_auto_tries_the_other_backup_at_a_fixed_interval():
    """Without the tries, a backup the policy stops picking keeps its prior figures for good."""
    chooser = BackupChooser("auto", k=4)
    picked = chooser.policy.choose(1)
    kinds = [chooser.choose(1) for _ in range(4 * EXPLORE_EVERY)]
    other = "fast" if picked == "neural" else "neural"
    assert [i for i, kind in enumerate(kinds) if kind == other] == [EXPLORE_EVERY * j - 1 for j in range(1, 5)]


def test_auto_feeds_the_next_rounds_hit_rate_to_the_policy():
    chooser = BackupChooser("auto", k=4)
    chooser.observe(hits=2, requests=4, tokens_hit=4.0, tokens_miss=2.0, backup="neural", t_verify=1.0,
                    t_spec=0.5, t_backup=0.2, next_hits={"neural": (0, 2), "hit": (2, 2)})
    assert chooser.policy.hit_rate("neural") < chooser.policy.hit_rate("fast")
    with pytest.raises(ValueError, match="backup must be"):
        BackupChooser("slow", k=4)
