"""The compact runner against HF transformers, and its KV pool."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_ssd.draft.kv_pool import KVPool, PoolExhausted
from sglang_ssd.draft.model import DraftModel, Span
from sglang_ssd.draft.model_config import ModelConfig
from sglang_ssd.tools.random_model import write_random_model
from tests.model_paths import require_model

from .conftest import TINY

TARGET = Path(__file__).resolve().parents[2] / "models" / "target"
ATOL = 1e-4
# The 135M target's logits (magnitude up to about 30) through 30 layers: the CPU linear kernel sums each
# output in one sequential FMA chain (what makes it batch-invariant), MKL in blocks, so they part by a
# few ulps per product; measured up to 1.04e-4 after 30 layers.
TARGET_ATOL = 3e-4


def hf_logits(folder, tokens: torch.Tensor) -> torch.Tensor:
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(tokens[None]).logits[0].float()


def prefill_logits(model: DraftModel, tokens: torch.Tensor) -> torch.Tensor:
    start, length = model.pool.alloc(tokens.shape[0])
    try:
        pos = torch.arange(tokens.shape[0])
        return model.full_logits(model.forward([Span(start, tokens, pos, pos, tokens.shape[0])])[0])
    finally:
        model.pool.release(start, length)


VARIANTS = {
    "llama": {},
    "tied": {"tie_word_embeddings": True},
    "qwen3": {"arch": "qwen3"},
    "llama3-rope": {"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                     "high_freq_factor": 4.0, "original_max_position_embeddings": 32}},
    "linear-rope": {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 100000.0},
}  # fmt: skip


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_logits_match_transformers(tmp_path, variant):
    folder = write_random_model(tmp_path, **TINY, **VARIANTS[variant], seed=7)
    model = DraftModel(folder, kv_slots=1024)
    tokens = torch.randint(0, 256, (80,), generator=torch.Generator().manual_seed(0))
    ref = hf_logits(folder, tokens)
    torch.testing.assert_close(prefill_logits(model, tokens), ref, atol=ATOL, rtol=0)


def test_incremental_and_batched_decoding_agree(tiny_llama):
    """Chunked prefill + one-token decode, two requests sharing each forward, equals one full prefill."""
    model = DraftModel(tiny_llama, kv_slots=2048)
    g = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 256, (n,), generator=g) for n in (50, 33)]
    full = [prefill_logits(model, s) for s in seqs]
    ext = [model.pool.alloc(64) for _ in seqs]
    cut = 20
    for (start, _), s in zip(ext, seqs):
        pos = torch.arange(cut)
        model.forward([Span(start, s[:cut], pos, pos, cut)])
    outs = [[], []]
    for i in range(cut, 50):
        spans, who = [], []
        for r, ((start, _), s) in enumerate(zip(ext, seqs)):
            if i < s.shape[0]:
                p = torch.tensor([i])
                spans.append(Span(start, s[i : i + 1], p, p, i + 1))
                who.append(r)
        for r, lg in zip(who, model.forward(spans)):
            outs[r].append(lg)
    for r, s in enumerate(seqs):
        torch.testing.assert_close(torch.cat(outs[r]), full[r][cut : s.shape[0]], atol=ATOL, rtol=0)


def test_reduced_head_full_logits(tiny_reduced):
    model = DraftModel(tiny_reduced, kv_slots=512)
    assert model.head_vocab_size == 128 and model.vocab_size == 256
    logits = prefill_logits(model, torch.tensor([1, 2, 3, 4]))
    assert logits.shape == (4, 256)
    assert torch.isinf(logits[:, 1::2]).all() and torch.isfinite(logits[:, ::2]).all()
    ids = torch.tensor([0, 2, 254])
    assert torch.equal(model.to_full_ids(model.to_head_ids(ids)), ids)
    assert int(model.to_head_ids(torch.tensor([3]))[0]) == -1


def test_kv_pool_allocator(tiny_llama):
    cfg = ModelConfig.from_folder(tiny_llama)
    pool = KVPool(cfg, 256, torch.float32, torch.device("cpu"), page_size=16)
    a = pool.alloc(20)
    b = pool.alloc(16)
    assert a == (0, 32) and b == (32, 16) and pool.used_slots == 48
    pool.k[:, 0:5] = 1.0
    # b blocks in-place growth of a: a moves and keeps its first slots.
    a2 = pool.grow(*a, need=40, keep=5)
    assert a2[0] != 0 and bool((pool.k[:, a2[0] : a2[0] + 5] == 1.0).all())
    # b can grow in place into the space a left behind.
    pool.release(32, 16)
    b2 = pool.alloc(16)
    assert pool.grow(*b2, need=32, keep=0)[0] == b2[0]
    with pytest.raises(PoolExhausted):
        pool.alloc(10_000)
    # the touched part ends where the moved extent a2 ends, and releasing does not untouch it
    assert pool.high_water == a2[0] + a2[1]
    assert pool.touched_bytes() == pool.nbytes() * (a2[0] + a2[1]) // 256
    pool.release(*a2)
    pool.release(b2[0], 32)
    assert pool.used_slots == 0 and pool.free_slots() == 256 and len(pool._free) == 1
    assert pool.high_water == a2[0] + a2[1]


def test_target_folder_loads_and_matches_transformers():
    require_model(TARGET)
    cfg = ModelConfig.from_folder(TARGET)
    # SmolLM2-135M: tied embeddings, rope_theta 1e5, 9 query / 3 KV heads.
    assert cfg.tie_word_embeddings and cfg.rope_theta == 100000.0 and (cfg.num_heads, cfg.num_kv_heads) == (9, 3)
    model = DraftModel(TARGET, kv_slots=512)
    tokens = torch.randint(0, cfg.vocab_size, (24,), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(prefill_logits(model, tokens), hf_logits(TARGET, tokens), atol=TARGET_ATOL, rtol=0)
