"""The C attention (`sglang_ssd/cpu/sglang_attention.py`, `csrc/attention.c`): equal to SDPA references within
fp32 tolerance on chains, trees and grouped-query heads, on both C routes; and batch-invariant bit for
bit: every draft's row of a verify call equals the row a 1-token decode call gives for that token, which
is what makes greedy SSD/SD equal AR by construction."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from sglang_ssd.cpu import clib
from sglang_ssd.cpu import linear as cpu_linear
from sglang_ssd.cpu import sglang_attention as attention
from sglang_ssd.cpu import verify_attention as va
from tests.cpu.test_verify_attention import (
    PREFIX_LENS,
    TREE_PARENT,
    chain_reference,
    compact_tree_mask,
    make_case,
    tree_reference,
    write_drafts,
)

LIB_ROUTES = [r for r in ("avx2", "portable") if r in cpu_linear.kernels()]
pytestmark = pytest.mark.skipif(not LIB_ROUTES, reason="the C kernels could not be built here")


def _fn(route: str):
    return getattr(clib.library(), f"ssd_attention_{route}")


def _verify(case, route: str, mask=None) -> torch.Tensor:
    backend, q, k, v, layer, fb, _ = case
    write_drafts(backend, k, v, layer, fb)
    out = attention.paged_attention(_fn(route), backend, q, layer, fb, fb.spec_info.draft_token_num, mask, False)
    assert out is not None
    return out


def _decode_rows(case, route: str) -> torch.Tensor:
    """Each draft token alone, as a decode step sees it: one query, seq_lens counting it."""
    backend, q, k, v, layer, fb, _ = case
    n = fb.spec_info.draft_token_num
    rows = []
    for b in range(len(PREFIX_LENS)):
        for i in range(n):
            one = SimpleNamespace(req_pool_indices=fb.req_pool_indices[b: b + 1],
                                  seq_lens=torch.tensor([PREFIX_LENS[b] + i + 1]))  # fmt: skip
            rows.append(attention.paged_attention(_fn(route), backend, q[b * n + i: b * n + i + 1], layer, one, 1,
                                                  None, decode=True))  # fmt: skip
    return torch.cat(rows)


@pytest.mark.parametrize("route", LIB_ROUTES)
def test_chain_and_tree_match_sdpa_references(route):
    case = make_case(4, seed=11)
    torch.testing.assert_close(_verify(case, route), chain_reference(case[-1], 4), atol=1e-5, rtol=1e-5)
    case = make_case(len(TREE_PARENT), seed=12, custom_mask=compact_tree_mask(TREE_PARENT))
    mask = va.tree_mask(case[5])
    torch.testing.assert_close(_verify(case, route, mask), tree_reference(case[-1], TREE_PARENT), atol=1e-5,
                               rtol=1e-5)  # fmt: skip


def test_the_tree_mask_is_built_once_per_forward_and_a_chain_mask_is_none():
    case = make_case(len(TREE_PARENT), seed=12, custom_mask=compact_tree_mask(TREE_PARENT))
    fb = case[5]
    first = va.tree_mask(fb)
    assert first is not None and first.dtype is torch.uint8 and va.tree_mask(fb) is first  # kept on the batch
    fb.seq_lens = fb.seq_lens.clone()  # another forward's lengths: built again, same values
    again = va.tree_mask(fb)
    assert again is not first and torch.equal(again, first)
    # SSD's verify sends its chain as a full lower-triangular mask: the kernel's causal default (None).
    n = fb.spec_info.draft_token_num
    bs = len(PREFIX_LENS)
    fb.spec_info.custom_mask = torch.ones(n, n, dtype=torch.bool).tril().repeat(bs, 1, 1).flatten()
    assert va.tree_mask(fb) is None


@pytest.mark.parametrize("route", LIB_ROUTES)
def test_verify_rows_equal_decode_rows_bit_for_bit(route):
    case = make_case(5, seed=13)
    verify = _verify(case, route)
    decode = _decode_rows(case, route)
    assert torch.equal(verify, decode)
    torch.testing.assert_close(decode, chain_reference(case[-1], 5), atol=1e-5, rtol=1e-5)


def test_the_target_shape_grouped_heads_and_a_strided_query():
    """9 query heads over 3 KV heads of 64 (the served target), q a column slice of a wider qkv row."""
    gen = torch.Generator().manual_seed(14)
    heads, kv_heads, dim, n, prefix = 9, 3, 64, 5, 37
    slots = torch.randperm(200, generator=gen)[: prefix + n]
    table = torch.zeros(2, 64, dtype=torch.int32)
    table[1, : prefix + n] = slots.to(torch.int32)
    k_cache, v_cache = torch.randn(200, kv_heads, dim, generator=gen), torch.randn(200, kv_heads, dim, generator=gen)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=gen)
    q = qkv[:, : heads * dim]  # row stride wider than the row: passed as is
    pool = SimpleNamespace(get_key_buffer=lambda i: k_cache, get_value_buffer=lambda i: v_cache)
    backend = SimpleNamespace(token_to_kv_pool=pool, req_to_token_pool=SimpleNamespace(req_to_token=table))
    layer = SimpleNamespace(tp_q_head_num=heads, tp_k_head_num=kv_heads, qk_head_dim=dim, v_head_dim=dim,
                            scaling=dim**-0.5, layer_id=0)  # fmt: skip
    fb = SimpleNamespace(req_pool_indices=torch.tensor([1]), seq_lens=torch.tensor([prefix]))
    keys = k_cache[slots.long()].repeat_interleave(3, 1).transpose(0, 1)
    values = v_cache[slots.long()].repeat_interleave(3, 1).transpose(0, 1)
    mask = torch.ones(n, prefix + n, dtype=torch.bool).tril(prefix)
    ref = torch.nn.functional.scaled_dot_product_attention(q.reshape(n, heads, dim).transpose(0, 1), keys, values,
                                                           attn_mask=mask, scale=dim**-0.5)  # fmt: skip
    for route in LIB_ROUTES:
        out = attention.paged_attention(_fn(route), backend, q, layer, fb, n, None, decode=False)
        torch.testing.assert_close(out, ref.transpose(0, 1).reshape(n, heads * dim), atol=2e-5, rtol=2e-5)


def test_verify_attention_takes_the_kernel_where_it_applies(monkeypatch):
    if cpu_linear.route() == "torch":
        pytest.skip("SGLANG_SSD_CPU_LINEAR=torch: the kernel is off by request")

    def no_torch(*args, **kwargs):
        raise AssertionError("the SDPA path ran")

    monkeypatch.setattr(va, "torch_verify_attention", no_torch)
    case = make_case(len(TREE_PARENT), seed=15, custom_mask=compact_tree_mask(TREE_PARENT))
    backend, q, k, v, layer, fb, seqs = case
    write_drafts(backend, k, v, layer, fb)
    out = va.verify_attention(backend, q, k, v, layer, fb, save_kv_cache=False)
    torch.testing.assert_close(out, tree_reference(seqs, TREE_PARENT), atol=1e-5, rtol=1e-5)


def test_decode_hook_falls_back_where_the_kernel_does_not_apply(monkeypatch):
    case = make_case(1, seed=16)
    backend, q, k, v, layer, fb, _ = case
    calls = []

    def original(*args, **kwargs):
        calls.append(args)
        return "original"

    for odd in ({"sliding_window_size": 8}, {"is_cross_attention": True}, {"v_head_dim": 4}):
        odd_layer = SimpleNamespace(**{**vars(layer), **odd})
        assert attention.forward_decode_hook(original, backend, q, k, v, odd_layer, fb, True) == "original"
    assert attention.forward_decode_hook(original, backend, q.double(), k, v, layer, fb, True) == "original"
    assert len(calls) == 4 and all(c[6] is True for c in calls)  # nothing written: SGLang writes K/V
    # A pool the kernel cannot read (bf16): K/V already written, so SGLang must not write them again.
    monkeypatch.setattr(backend.token_to_kv_pool, "get_key_buffer", lambda i: torch.zeros(1, dtype=torch.bfloat16))
    if cpu_linear.route() != "torch":
        assert attention.forward_decode_hook(original, backend, q, k, v, layer, fb, False) == "original"
        assert calls[-1][6] is False


@pytest.mark.skipif("avx2" not in LIB_ROUTES, reason="no AVX2 route on this CPU")
def test_grouped_pairs_give_the_bits_of_one_pair_at_a_time():
    """The AVX2 route runs every pair that reads one kv head (grouped query heads x the tokens of a
    verify) together, sharing the key and value reads; each pair must keep the bits it gets alone: random
    head groupings, head sizes with a 8-float tail, chains and trees, decode and verify lengths, prefixes
    around the 8-key blocks, strided queries, and more pairs than one pass holds (n x G > 24)."""
    grouped, alone = _fn("avx2"), _fn("avx2_pairwise")
    gen = torch.Generator().manual_seed(17)

    def pick(options):
        return options[int(torch.randint(len(options), (1,), generator=gen))]

    for _ in range(60):
        dim, kv_heads, group = pick([8, 24, 40, 64, 64]), pick([1, 2, 3]), pick([1, 2, 3, 4])
        heads, n, bs = kv_heads * group, pick([1, 2, 5, 9, 16]), pick([1, 2, 3])
        k_cache, v_cache = torch.randn(400, kv_heads, dim, generator=gen), torch.randn(400, kv_heads, dim, generator=gen)
        table = torch.stack([torch.randperm(400, generator=gen) for _ in range(4)]).to(torch.int32)
        rows = torch.randperm(4, generator=gen)[:bs].to(torch.int64)
        prefix = [pick([0, 1, 7, 8, 9, 33, 200]) for _ in range(bs)]
        decode = bool(pick([0, 1]))
        lens = torch.tensor([p + (n if decode else 0) for p in prefix], dtype=torch.int64)
        mask = None
        if n > 1 and pick([0, 1]):
            mask = (torch.rand(bs, n, n, generator=gen) < 0.6).to(torch.uint8)
            mask.diagonal(dim1=1, dim2=2).fill_(1)
        q = torch.randn(bs * n, heads * dim + 8, generator=gen)[:, : heads * dim]  # a strided query
        args = (q, k_cache, v_cache, table, rows, lens, n, kv_heads, dim**-0.5)
        a = attention.attend(grouped, *args, decode=decode, mask=mask)
        b = attention.attend(alone, *args, decode=decode, mask=mask)
        assert a is not None and torch.equal(a, b), (dim, kv_heads, group, n, bs, prefix, decode, mask is not None)
