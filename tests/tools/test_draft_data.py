"""Draft data: training on what is cached so far reads exactly the cached batches and generates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_ssd.tools import draft_data
from sglang_ssd.tools.draft_data import DataSpec, build_dataset
from tests.model_paths import require_model

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "models" / "target"


def _record(i: int) -> dict:
    return {"prompt": torch.tensor([1, 2, i]), "answer": torch.tensor([i, 2]), "top_ids": torch.zeros(2, 1),
            "top_logits": torch.zeros(2, 1)}  # fmt: skip


def test_cached_only_reads_the_cached_batches_and_generates_nothing(tmp_path, monkeypatch):
    spec = DataSpec(n_greedy=4, n_sampled=4, batch=2, source="templates", route="server")
    tag = f"srv_g4_s4_t{spec.temperature}_n{spec.max_new}_k{spec.top_k}_b2_seed0"
    for bi in (0, 2):  # batches 1 and 3 are not there yet (a generator still running)
        torch.save([_record(10 * bi), _record(10 * bi + 1)], tmp_path / f"{tag}_batch_{bi:04d}.pt")

    def no_server(*a, **kw):
        raise AssertionError("cached_only must not start a server")

    monkeypatch.setattr(draft_data, "_start_server", no_server)
    records = build_dataset(require_model(TARGET), tmp_path, spec, cached_only=True)
    assert [int(r["prompt"][-1]) for r in records] == [0, 1, 20, 21]
    with pytest.raises(AssertionError, match="must not start"):
        build_dataset(TARGET, tmp_path, spec)  # without it, the missing batch 1 is generated
