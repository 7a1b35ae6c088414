"""bench/calibrate.py's `draft:` fixed-form line, from a calibration result and the eval files."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.calibrate import DRAFT_PREFIX, draft_line  # noqa: E402


def test_the_draft_line(tmp_path):
    for name, alpha in (("sharegpt_held_out", 0.5123), ("prompt_set", 0.4456)):
        (tmp_path / f"draft_eval_{name}.json").write_text(json.dumps({"greedy": {"alpha_per_token": alpha}}))
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"draft_vocab_size": 8192}))
    result = {"target": {"verify_ms": [30.0, 31.0]}, "draft": {"decode_ms": {"1": 3.3}, "vocab_size": 49152}}
    line = draft_line(result, draft, weights=tmp_path)
    assert line.startswith(DRAFT_PREFIX)
    assert line.startswith("draft: greedy α = 0.512 (ShareGPT held-out), 0.446 (prompt set); "
                           "step = 0.11 of a target step; head = 8192 tokens (")
    assert draft_line({"target": result["target"], "draft": None}, draft, weights=tmp_path) is None
