"""The Triton tree-attention kernel against the torch path on the same pool and spans (interpreted on
the CPU: ``TRITON_INTERPRET=1``; `make gpu-check` compiles and times it on a GPU)."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel is defined: run it on the CPU

import pytest  # noqa: E402
import torch  # noqa: E402

from sglang_ssd.draft.attention import TorchAttention  # noqa: E402
from sglang_ssd.draft.attention_factory import make_attention  # noqa: E402
from sglang_ssd.draft.kv_pool import KVPool  # noqa: E402
from sglang_ssd.draft.model import Span  # noqa: E402
from sglang_ssd.draft.model_config import ModelConfig  # noqa: E402

pytest.importorskip("triton")

CFG = {"model_type": "llama", "vocab_size": 64, "hidden_size": 64, "intermediate_size": 128,
       "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}  # fmt: skip


def _span(start: int, n: int, kv_len: int, mask=None) -> Span:
    pos = torch.arange(kv_len - n, kv_len)
    return Span(start, torch.zeros(n, dtype=torch.long), pos, pos, kv_len, mask)


def test_matches_torch_on_prefill_chain_and_tree_spans():
    cfg = ModelConfig.from_dict(CFG)
    pool = KVPool(cfg, 512, torch.float32, torch.device("cpu"))
    a, _ = pool.alloc(100)
    b, _ = pool.alloc(100)
    c, _ = pool.alloc(100)
    g = torch.Generator().manual_seed(0)
    pool.k.normal_(generator=g)  # after allocation, which zeroes the extents
    pool.v.normal_(generator=g)
    # A tree step: 6 branch tokens over a 40-token context, each seeing the context and its own ancestors.
    tree = torch.ones(6, 46, dtype=torch.bool)
    tree[:, 40:] = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0],
                                 [0, 0, 1, 1, 0, 0], [1, 1, 0, 0, 1, 0], [0, 0, 0, 0, 0, 1]], dtype=torch.bool)  # fmt: skip
    tree[5, :7] = False  # a row that also skips rejected slots in the middle of the extent
    spans = [_span(a, 70, 70), _span(b, 4, 33), _span(c, 6, 46, tree), _span(a, 1, 90)]
    q = torch.randn(sum(s.n for s in spans), 4, 16, generator=g)
    ref_attn = TorchAttention(cfg, pool, torch.device("cpu"))
    tri_attn = make_attention("triton", cfg, pool, torch.device("cpu"))
    ref = ref_attn.run(ref_attn.plan(spans), 0, q, 0.25)
    got = tri_attn.run(tri_attn.plan(spans), 0, q, 0.25)
    assert ref.abs().mean() > 0.1  # the extents hold noise, not zeros
    assert torch.allclose(got, ref, atol=1e-5, rtol=1e-4), (got - ref).abs().max()


def test_bad_head_dim_is_refused():
    from sglang_ssd.draft.attention_triton import TritonAttention

    cfg = ModelConfig.from_dict({**CFG, "hidden_size": 48, "head_dim": 12})
    with pytest.raises(ValueError, match="power-of-two"):
        TritonAttention(cfg, None, torch.device("cpu"))
