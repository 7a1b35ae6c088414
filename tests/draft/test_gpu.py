"""FlashInfer tree attention against the torch path (needs a CUDA device; skipped elsewhere)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from sglang_ssd.draft.model import DraftModel, Span
from sglang_ssd.draft.model_config import ModelConfig
from sglang_ssd.tools.random_model import random_weights
from sglang_ssd.tools.tree_gpu_check import SMALL

HAS_FLASHINFER = torch.cuda.is_available() and importlib.util.find_spec("flashinfer") is not None


def test_random_weights_build_a_runnable_model():
    """The in-memory random model used by the GPU check runs on the CPU too (torch path)."""
    cfg = ModelConfig.from_dict({**SMALL, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                                 "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16})  # fmt: skip
    model = DraftModel(None, "cpu", torch.float32, 256, attention="torch", parts=(cfg, random_weights(cfg, torch.float32, torch.device("cpu"))))
    start, _ = model.pool.alloc(16)
    pos = torch.arange(8)
    out = model.forward([Span(start, torch.arange(8), pos, pos, 8)])[0]
    assert out.shape == (8, 512) and torch.isfinite(out).all()


def test_agreement_harness_on_cpu():
    """The mirroring harness itself (torch against torch here): identical forwards agree exactly."""
    from sglang_ssd.tools.tree_gpu_check import agreement

    tiny = {**SMALL, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip
    report = agreement("cpu", torch.float32, cfg=tiny, other="torch")
    assert report["forwards"] > 8 and report["max_rel_logit_diff"] == 0.0 and report["ok"]


def test_timing_harness_on_cpu():
    """The timing rows `make gpu-check` reports (tree step vs the same tokens without a tree mask).

    At b = 2 the prompts (2 x 2100 tokens) exceed one work step's token cap, so prefill takes two steps:
    the harness must work until every request has branched (the first GPU run broke here)."""
    from sglang_ssd.tools.tree_gpu_check import timing

    tiny = {**SMALL, "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip
    rows = timing("cpu", batches=(1, 2), context=2100, repeats=2, cfg_dict=tiny, backends=[], dtype=torch.float32)
    assert [(r["attention"], r["batch"], r["tokens"]) for r in rows] == [("torch", 1, 24), ("torch", 2, 48)]
    assert all(r["tree_step_ms"] > 0 and r["plain_same_tokens_ms"] > 0 and r["glue_ms"] > 0 for r in rows)


@pytest.mark.skipif(not HAS_FLASHINFER, reason="needs a CUDA device with flashinfer installed")
def test_flashinfer_tree_attention_matches_torch():
    from sglang_ssd.tools.tree_gpu_check import agreement

    report = agreement("cuda:0")
    assert report["forwards"] > 8
    assert report["ok"], report
