"""Shared fixtures: tiny random-weight model folders written once per session."""

from __future__ import annotations

import os

import pytest
import torch

from sglang_ssd.tools.random_model import write_random_model

torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("tiny_llama"), **TINY, seed=1)


@pytest.fixture(scope="session")
def tiny_reduced(tmp_path_factory):
    """Tiny Llama whose head covers only every other token id (reduced-vocabulary head)."""
    return write_random_model(
        tmp_path_factory.mktemp("tiny_reduced"), **TINY, draft_token_ids=list(range(0, 256, 2)), seed=2
    )
