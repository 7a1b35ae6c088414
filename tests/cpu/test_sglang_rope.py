"""The C rotary embedding (`cpu/sglang_rope.py`) against SGLang's own `RotaryEmbedding.forward_native`."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.cpu import clib
from sglang_ssd.cpu import sglang_rope as rope

pytestmark = pytest.mark.skipif(clib.rope_kernel() is None, reason="the C kernels are not built here")


@pytest.fixture
def make_emb(monkeypatch):
    import sglang.srt.layers.rotary_embedding.base as base

    monkeypatch.setattr(base, "_is_cpu", True)  # what SGLang's CPU engine sees (no vllm fallback kernel)

    def make(head: int, rot: int, neox: bool, max_pos: int = 4096):
        return base.RotaryEmbedding(head, rot, max_pos, 100000, neox, torch.float32)

    return make


def qk_slices(tokens: int, heads: int, kv_heads: int, head: int, g: torch.Generator):
    """q and k as SGLang's attention has them: column slices of one fused QKV output (row-strided)."""
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head, generator=g)
    q, k, _ = qkv.split([heads * head, kv_heads * head, kv_heads * head], dim=-1)
    return q, k


VIAS = ["entry", "ctypes"] if clib.rope_entry() is not None else ["ctypes"]


@pytest.mark.parametrize("via", VIAS)
@pytest.mark.parametrize("neox", [True, False])
@pytest.mark.parametrize("rot", [64, 32])
def test_the_kernel_gives_the_native_paths_bits(make_emb, monkeypatch, neox, rot, via):
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    if via == "ctypes":  # the same kernel without the compiled entry
        monkeypatch.setattr(clib, "rope_entry", lambda: None)
    emb = make_emb(64, rot, neox)
    g = torch.Generator().manual_seed(rot + neox)
    for tokens in (1, 2, 5, 16, 40):
        q, k = qk_slices(tokens, 9, 3, 64, g)
        pos = torch.randint(0, 4096, (tokens,), generator=g)
        pos[0] = 4095  # the cache's last row
        assert rope.applies(emb, pos, q, k)
        want = RotaryEmbedding.forward_native(emb, pos, q, k)
        got = rope.forward_native_hook(RotaryEmbedding.forward_native, emb, pos, q, k)
        for w, o in zip(want, got):
            assert o.shape == w.shape and torch.equal(o, w)
    # a token's result does not depend on the other tokens of the call (decode vs verify)
    alone = rope.forward_native_hook(RotaryEmbedding.forward_native, emb, pos[3:4], q[3:4], k[3:4])
    assert torch.equal(alone[0][0], got[0][3]) and torch.equal(alone[1][0], got[1][3])


def test_what_the_kernel_does_not_take_goes_to_sglangs_code(make_emb):
    from sglang.srt.layers.rotary_embedding.base import RotaryEmbedding

    emb = make_emb(64, 64, True, max_pos=64)
    g = torch.Generator().manual_seed(1)
    q, k = qk_slices(3, 9, 3, 64, g)
    calls = []

    def native(*args, **kwargs):
        calls.append(args[4] if len(args) > 4 else kwargs.get("offsets"))
        return RotaryEmbedding.forward_native(*args, **kwargs)

    pos = torch.tensor([1, 2, 3])
    offsets = torch.tensor([10, 10, 10])
    want = RotaryEmbedding.forward_native(emb, pos, q, k, offsets)
    got = rope.forward_native_hook(native, emb, pos, q, k, offsets)
    assert len(calls) == 1 and all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises((IndexError, RuntimeError)):  # past the cache: SGLang's own error, not garbage
        rope.forward_native_hook(native, emb, torch.tensor([1, 64, 3]), q, k)
    assert len(calls) == 2
    half = rope.forward_native_hook(native, emb, pos, q.to(torch.float64), k.to(torch.float64))
    assert len(calls) == 3 and half[0].dtype == torch.float64


@pytest.mark.skipif("entry" not in VIAS, reason="the compiled entry is not built here")
def test_the_entry_refuses_what_it_does_not_take(make_emb):
    """None, nothing computed, for every call the kernel would read wrongly; rope.py then decides."""
    emb = make_emb(64, 64, True, max_pos=64)
    entry, cache = clib.rope_entry(), emb.cos_sin_cache
    g = torch.Generator().manual_seed(2)
    q, k = qk_slices(3, 9, 3, 64, g)
    pos = torch.tensor([1, 2, 3])
    assert entry(pos, q, k, cache, 64, 64, True) is not None
    for args in (
        (pos, q.double(), k, cache, 64, 64, True),  # dtype
        (pos, q, k[:, :100], cache, 64, 64, True),  # a width that is not whole heads
        (pos[:2], q, k, cache, 64, 64, True),  # fewer positions than rows
        (pos, q, k, cache[:, :32], 64, 64, True),  # a cache row that is not rot wide
        (pos, q, k, cache.t(), 64, 64, True),  # a strided cache
        (pos, q, k, cache, 64, 66, True),  # rot > head
        (pos, q, k, cache, 64, 63, True),  # odd rot
        (torch.tensor([1, 64, 3]), q, k, cache, 64, 64, True),  # a position past the cache
        (torch.tensor([1, -1, 3]), q, k, cache, 64, 64, True),  # a negative position
    ):
        assert entry(*args) is None
