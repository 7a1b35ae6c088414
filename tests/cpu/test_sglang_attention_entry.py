"""The compiled attention entry (`csrc/entry.cpp` `attention`, through `attention.fused_attention`): the
layer's KV write and the C attention in one call. It must give the bits of the ctypes path (SGLang's
row copy into the pool, then `paged_attention`), for decode rows, chains and trees, and refuse, with
nothing written, every call whose slots, table rows, lengths, shapes or mask do not fit.
(The hooks on SGLang's real `MHATokenToKVPool` are checked in the SGLang child of
`test_verify_attention.py`.)"""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.cpu import clib
from sglang_ssd.cpu import sglang_attention as attention
from tests.cpu.test_verify_attention import (
    HEAD_DIM,
    KV_HEADS,
    PREFIX_LENS,
    TREE_PARENT,
    compact_tree_mask,
    make_case,
    write_drafts,
)


@pytest.fixture(scope="module")
def entry():
    fn = clib.attention_entry()
    if fn is None:
        pytest.skip("no compiled entry here (torch route, or the entry could not be built)")
    return fn


def _call(entry, case, mask=None, decode=False, **override):
    backend, q, k, v, layer, fb, _ = case
    pool = backend.token_to_kv_pool
    args = dict(q=q, k=k, v=v, k_cache=pool.get_key_buffer(layer.layer_id), v_cache=pool.get_value_buffer(layer.layer_id),
                loc=fb.out_cache_loc, table=backend.req_to_token_pool.req_to_token, rows=fb.req_pool_indices,
                lens=fb.seq_lens, n=fb.spec_info.draft_token_num, heads=layer.tp_q_head_num)  # fmt: skip
    args.update(override)
    return entry(args["q"], args["k"], args["v"], args["k_cache"], args["v_cache"], args["loc"], args["table"],
                 args["rows"], args["lens"], args["n"], args["heads"], float(layer.scaling), decode, mask)  # fmt: skip


def _ctypes_path(case, mask=None, decode=False):
    backend, q, k, v, layer, fb, _ = case
    write_drafts(backend, k, v, layer, fb)
    out = attention.paged_attention(clib.attention_kernel(), backend, q, layer, fb,
                                    fb.spec_info.draft_token_num, mask, decode)  # fmt: skip
    return out, backend.token_to_kv_pool


@pytest.mark.parametrize("kind", ["chain", "tree", "decode"])
def test_entry_gives_the_bits_of_the_ctypes_path(entry, kind):
    n, custom = (len(TREE_PARENT), compact_tree_mask(TREE_PARENT)) if kind == "tree" else (1 if kind == "decode" else 4, None)
    mask = None
    if kind == "tree":
        from sglang_ssd.cpu.verify_attention import tree_mask

        mask = tree_mask(make_case(n, seed=21, custom_mask=custom)[5])
        assert mask is not None
    decode = kind == "decode"
    cases = [make_case(n, seed=21, custom_mask=custom) for _ in range(2)]
    if decode:  # a decode step's lengths count the new token
        for c in cases:
            c[5].seq_lens = c[5].seq_lens + 1
    want, want_pool = _ctypes_path(cases[0], mask, decode)
    got = _call(entry, cases[1], mask, decode)
    assert got is not None and torch.equal(got, want)
    pool = cases[1][0].token_to_kv_pool
    assert all(torch.equal(a, b) for a, b in zip(pool.k + pool.v, want_pool.k + want_pool.v))


def test_entry_reads_the_pool_without_writing_when_given_no_kv(entry):
    case = make_case(4, seed=22)
    backend, q, k, v, layer, fb, _ = case
    write_drafts(backend, k, v, layer, fb)
    before = [t.clone() for t in backend.token_to_kv_pool.k + backend.token_to_kv_pool.v]
    out = _call(entry, case, k=None, v=None, loc=None)
    want = attention.paged_attention(clib.attention_kernel(), backend, q, layer, fb, 4, None, False)
    assert torch.equal(out, want)
    assert all(torch.equal(a, b) for a, b in zip(before, backend.token_to_kv_pool.k + backend.token_to_kv_pool.v))


def _with(table: torch.Tensor, row: int, col: int, value: int) -> torch.Tensor:
    out = table.clone()
    out[row, col] = value
    return out


def _refusals(case):
    backend, q, k, v, layer, fb, _ = case
    table = backend.req_to_token_pool.req_to_token
    slots = backend.token_to_kv_pool.get_key_buffer(layer.layer_id).shape[0]
    bad_loc = fb.out_cache_loc.clone()
    bad_loc[-1] = slots  # one past the pool
    return {
        "a slot past the pool": dict(loc=bad_loc),
        "a negative slot": dict(loc=-fb.out_cache_loc - 1),
        "a table row past the table": dict(rows=torch.tensor([2, 0, table.shape[0]])),
        "a length past the table's width": dict(lens=torch.tensor([3, 7, table.shape[1]])),
        "K rows that do not match the slots": dict(k=k[:-1]),
        "K without V and slots": dict(v=None, loc=None),
        "a mask of the wrong size": dict(mask=torch.ones(2, 2, dtype=torch.uint8)),
        "a bool mask": dict(mask=torch.ones(len(PREFIX_LENS), 4, 4, dtype=torch.bool).tril()),
        "queries for another n": dict(n=3),
        "fp64 queries": dict(q=q.double()),
        "an int64 table": dict(table=table.long()),
        "a bf16 pool": dict(k_cache=torch.zeros(80, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16),
                            v_cache=torch.zeros(80, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16)),
        "a negative table row": dict(rows=torch.tensor([2, -1, 3])),
        "a table slot past the pool": dict(table=_with(table, 2, 0, slots)),
        "a negative table slot": dict(table=_with(table, 0, 1, -1)),
        "K rows in another order": dict(k=k.reshape(-1, KV_HEADS, HEAD_DIM).transpose(0, 1)),
        "head counts that do not divide": dict(heads=3),
    }


@pytest.mark.parametrize("what", list(_refusals(make_case(4, seed=23))))
def test_entry_refuses_what_does_not_fit_and_writes_nothing(entry, what):
    case = make_case(4, seed=23)
    pool = case[0].token_to_kv_pool
    before = [t.clone() for t in pool.k + pool.v]
    override = _refusals(case)[what]
    mask = override.pop("mask", None)
    assert _call(entry, case, mask, **override) is None, what
    assert all(torch.equal(a, b) for a, b in zip(before, pool.k + pool.v)), what


def test_a_decode_step_needs_its_own_token_in_the_lengths(entry):
    case = make_case(1, seed=25)  # a decode call: its seq_lens count the new token, so 0 leaves it no room
    case[5].seq_lens = torch.tensor([0, 8, 13])
    pool = case[0].token_to_kv_pool
    before = [t.clone() for t in pool.k + pool.v]
    assert _call(entry, case, decode=True) is None
    assert all(torch.equal(a, b) for a, b in zip(before, pool.k + pool.v))


def test_strided_kv_views_are_written_as_sglang_writes_them(entry):
    """K and V as RadixAttention hands them: [T, kv_heads, dim] views into one wider projection output."""
    cases = [make_case(4, seed=26) for _ in range(2)]
    backend, q, k, v, layer, fb, _ = cases[1]
    wide = torch.cat([torch.randn(k.shape[0], 16), k, v], dim=1)  # q-like columns first, as qkv_proj gives
    k_view = wide[:, 16 : 16 + k.shape[1]].view(-1, KV_HEADS, HEAD_DIM)
    v_view = wide[:, 16 + k.shape[1] :].view(-1, KV_HEADS, HEAD_DIM)
    assert not k_view.is_contiguous() and k_view.stride(0) == wide.shape[1]
    want, want_pool = _ctypes_path(cases[0])
    got = _call(entry, cases[1], k=k_view, v=v_view)
    assert got is not None and torch.equal(got, want)
    pool = backend.token_to_kv_pool
    assert all(torch.equal(a, b) for a, b in zip(pool.k + pool.v, want_pool.k + want_pool.v))


@pytest.mark.parametrize("why", ["not SGLang's pool", "an encoder-decoder batch", "a sliding-window pool"])
def test_fused_attention_leaves_what_it_does_not_know_to_the_ctypes_path(entry, monkeypatch, why):
    """The fused call declines, nothing written: the test pool is not SGLang's MHATokenToKVPool (and
    for the other cases the test pretends it is)."""
    case = make_case(4, seed=24)
    backend, q, k, v, layer, fb, _ = case
    pool = backend.token_to_kv_pool
    if why != "not SGLang's pool":
        monkeypatch.setattr(attention, "plain_pool", lambda p: True)
        assert attention.fused_attention(backend, q, k, v, layer, fb, 4, None, False, False) is not None
    if why == "an encoder-decoder batch":
        fb.encoder_lens = torch.tensor([2, 2, 2])
    if why == "a sliding-window pool":
        backend.swa_out_cache_loc = fb.out_cache_loc
    before = [t.clone() for t in pool.k + pool.v]
    assert why != "not SGLang's pool" or not attention.plain_pool(pool)
    assert attention.fused_attention(backend, q, k, v, layer, fb, 4, None, False, True) is None
    assert all(torch.equal(a, b) for a, b in zip(before, pool.k + pool.v))
