"""The draft runner's C attention (``draft/attention_c.py``, the CPU fp32 default) against the torch
path on the same pool and spans: prefill chunks, causal chains, tree steps with arbitrary masks, and a
one-token decode; and a row's output does not depend on the other spans in its forward."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.cpu import clib
from sglang_ssd.draft.attention import TorchAttention
from sglang_ssd.draft.attention_c import CAttention
from sglang_ssd.draft.attention_factory import make_attention
from sglang_ssd.draft.kv_pool import KVPool
from sglang_ssd.draft.model import Span
from sglang_ssd.draft.model_config import ModelConfig

CFG = {"model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
       "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip

pytestmark = pytest.mark.skipif(clib.attention_kernel() is None, reason="the C kernel route is off")


def _span(start: int, n: int, kv_len: int, mask=None) -> Span:
    pos = torch.arange(kv_len - n, kv_len)
    return Span(start, torch.zeros(n, dtype=torch.long), pos, pos, kv_len, mask)


def _pool(cfg, *sizes):
    """A pool with extents of these sizes, filled with noise after allocation (which zeroes them)."""
    pool = KVPool(cfg, 512, torch.float32, torch.device("cpu"))
    starts = [pool.alloc(n)[0] for n in sizes]
    g = torch.Generator().manual_seed(0)
    pool.k.normal_(generator=g)
    pool.v.normal_(generator=g)
    return pool, g, starts


def test_matches_torch_on_prefill_chain_tree_and_decode_spans():
    cfg = ModelConfig.from_dict(CFG)
    pool, g, (a, b, c) = _pool(cfg, 100, 100, 100)
    tree = torch.ones(6, 46, dtype=torch.bool)
    tree[:, 40:] = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0],
                                 [0, 0, 1, 1, 0, 0], [1, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1]], dtype=torch.bool)  # fmt: skip
    tree[5, :7] = False  # a row that also skips rejected slots in the middle of the extent
    small = tree[:4, :44].clone()  # four branch rows: the C kernel's; the six-row step stays on SDPA
    small[3, 10:13] = False
    spans = [_span(a, 70, 70), _span(b, 4, 33), _span(c, 6, 46, tree), _span(a, 1, 90), _span(c, 4, 44, small)]
    q = torch.randn(sum(s.n for s in spans), 4, 16, generator=g)
    ref_attn = TorchAttention(cfg, pool, torch.device("cpu"))
    c_attn = make_attention("auto", cfg, pool, torch.device("cpu"))
    assert isinstance(c_attn, CAttention)  # the CPU default
    plan = c_attn.plan(spans)
    assert plan.index.tolist() == [*range(70, 74), 80, *range(81, 85)]  # the small spans' rows
    ref = ref_attn.run(ref_attn.plan(spans), 0, q, 0.25)
    got = c_attn.run(plan, 0, q, 0.25)
    assert ref.abs().mean() > 0.1  # the extents hold noise (allocation zeroes them)
    assert torch.allclose(got, ref, atol=1e-5, rtol=1e-4), (got - ref).abs().max()
    # A wrong visible set is caught: hide one more slot from a C-covered tree row.
    bad = small.clone()
    bad[2, 42] = False
    spans[4] = _span(c, 4, 44, bad)
    off = c_attn.run(c_attn.plan(spans), 0, q, 0.25)
    assert not torch.allclose(off[83], ref[83], atol=1e-5, rtol=1e-4)
    assert torch.allclose(off[:83], ref[:83], atol=1e-5, rtol=1e-4) and torch.allclose(off[84:], ref[84:], atol=1e-5, rtol=1e-4)


def test_a_rows_output_does_not_depend_on_its_batch():
    cfg = ModelConfig.from_dict(CFG)
    pool, g, (a, b) = _pool(cfg, 100, 100)
    attn = make_attention("c", cfg, pool, torch.device("cpu"))
    alone = [_span(a, 1, 57)]
    mixed = [_span(b, 9, 80), _span(a, 1, 57), _span(b, 3, 20)]  # SDPA, C, C
    q_row = torch.randn(1, 4, 16, generator=g)
    q_mixed = torch.randn(13, 4, 16, generator=g)
    q_mixed[9] = q_row[0]
    one = attn.run(attn.plan(alone), 0, q_row, 0.25)
    many = attn.run(attn.plan(mixed), 0, q_mixed, 0.25)
    assert torch.equal(one[0], many[9])


def test_bad_masks_are_refused():
    cfg = ModelConfig.from_dict(CFG)
    pool, _, (a,) = _pool(cfg, 64)
    attn = make_attention("c", cfg, pool, torch.device("cpu"))
    with pytest.raises(ValueError, match="span mask must be"):
        attn.plan([_span(a, 2, 10, torch.ones(2, 9, dtype=torch.bool))])
    with pytest.raises(ValueError, match="at least one slot"):
        attn.plan([_span(a, 2, 10, torch.zeros(2, 10, dtype=torch.bool))])
    assert isinstance(make_attention("torch", cfg, pool, torch.device("cpu")), TorchAttention)
