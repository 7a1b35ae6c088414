"""The pure-torch `sgl_kernel` ops against hand-computed cases and SGLang's own Triton kernels.

Expected values are worked out by hand from the semantics of SGLang's Triton kernels of the same
name (`sglang/kernels/ops/...`). One test also runs those Triton kernels under Triton's CPU
interpreter (in a child process: `TRITON_INTERPRET=1` must be set before triton loads) on random
trees and compares them with our ops on the same inputs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_ssd.cpu import kernels

ROOT = Path(__file__).resolve().parents[2]

EAGLE_ONLY = (
    "build_tree_kernel_efficient_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "rotate_input_ids_cpu",
)


def test_ops_table_names_only_defined_functions():
    for name in kernels.OPS:
        assert callable(getattr(kernels, name)), name
    for sub, names in kernels.SUBMODULE_OPS.items():
        for name in names:
            assert callable(getattr(kernels, name)), f"{sub}.{name}"


# ---------------------------------------------------------------- req_to_token table writes / reads


def test_assign_req_to_token_pool_writes_each_run_into_its_row():
    req_to_token = torch.full((4, 10), -1, dtype=torch.int32)
    out_cache_loc = torch.tensor([11, 12, 21, 22, 23, 24], dtype=torch.int64)
    kernels.assign_req_to_token_pool_cpu(
        torch.tensor([2, 0]),  # request 0 lives in row 2, request 1 in row 0
        req_to_token,
        torch.tensor([3, 0]),
        torch.tensor([5, 4]),
        out_cache_loc,
        req_to_token.shape[1],
    )
    expected = torch.full((4, 10), -1, dtype=torch.int32)
    expected[2, 3:5] = torch.tensor([11, 12])
    expected[0, 0:4] = torch.tensor([21, 22, 23, 24])
    assert torch.equal(req_to_token, expected)


def test_assign_req_to_token_pool_skips_empty_runs():
    req_to_token = torch.zeros((3, 6), dtype=torch.int64)
    kernels.assign_req_to_token_pool_cpu(
        torch.tensor([0, 1, 2]),
        req_to_token,
        torch.tensor([2, 4, 1]),
        torch.tensor([2, 6, 2]),  # request 0 has nothing to write
        torch.tensor([7, 8, 9]),
        6,
    )
    assert req_to_token.tolist() == [[0] * 6, [0, 0, 0, 0, 7, 8], [0, 9, 0, 0, 0, 0]]


def test_assign_extend_cache_locs_gathers_runs_in_request_order():
    req_to_token = torch.arange(40, dtype=torch.int32).reshape(4, 10) + 100
    out = torch.full((7,), -1, dtype=torch.int64)
    kernels.assign_extend_cache_locs_cpu(
        torch.tensor([3, 1]), req_to_token, torch.tensor([5, 0]), torch.tensor([8, 3]), out, 10
    )
    # row 3 = 130..139 -> positions 5..7; row 1 = 110..119 -> positions 0..2; last slot untouched
    assert out.tolist() == [135, 136, 137, 110, 111, 112, -1]


def test_assign_extend_cache_locs_is_the_inverse_of_assign_req_to_token_pool():
    gen = torch.Generator().manual_seed(0)
    rows, starts, ends = torch.tensor([1, 4, 2]), torch.tensor([0, 3, 6]), torch.tensor([5, 7, 9])
    locs = torch.randperm(1000, generator=gen)[:12]
    table = torch.zeros((5, 16), dtype=torch.int32)
    kernels.assign_req_to_token_pool_cpu(rows, table, starts, ends, locs, 16)
    back = torch.empty(12, dtype=torch.int64)
    kernels.assign_extend_cache_locs_cpu(rows, table, starts, ends, back, 16)
    assert torch.equal(back, locs)


# ---------------------------------------------------------------- KV row moves over raw buffers


def _kv_buffers(slots: int) -> list[torch.Tensor]:
    """Two layers' K and V in different dtypes and row widths, each row filled with its slot number."""
    shapes = [((slots, 2, 4), torch.float32), ((slots, 2, 4), torch.float32), ((slots, 3), torch.bfloat16)]
    bufs = []
    for layer, (shape, dtype) in enumerate(shapes):
        rows = torch.arange(slots, dtype=torch.float32) + 100 * layer
        bufs.append(rows.reshape(-1, *[1] * (len(shape) - 1)).expand(shape).to(dtype).contiguous())
    return bufs


def _move(bufs: list[torch.Tensor], tgt: list[int], src: list[int]) -> None:
    """Calls the op the way SGLang's KV pool does: uint64 base addresses and row strides in bytes."""
    data_ptrs = torch.tensor([b.data_ptr() for b in bufs], dtype=torch.uint64)
    strides = torch.tensor([b.stride(0) * b.dtype.itemsize for b in bufs])
    kernels.copy_all_layer_kv_cache_cpu(
        data_ptrs, strides, torch.tensor(tgt, dtype=torch.int64), torch.tensor(src, dtype=torch.int64)
    )


def _row_ids(buf: torch.Tensor, layer: int) -> list[int]:
    first = buf.reshape(buf.shape[0], -1).float()
    assert torch.equal(first, first[:, :1].expand_as(first)), "a row was torn"
    return (first[:, 0] - 100 * layer).round().int().tolist()


def test_copy_all_layer_kv_cache_moves_rows_in_every_buffer():
    bufs = _kv_buffers(8)
    before = [b.clone() for b in bufs]
    _move(bufs, tgt=[6, 1], src=[2, 5])
    for layer, (buf, old) in enumerate(zip(bufs, before)):
        assert _row_ids(buf, layer) == [0, 5, 2, 3, 4, 5, 2, 7]
        assert torch.equal(buf[[0, 2, 3, 4, 5, 7]], old[[0, 2, 3, 4, 5, 7]])


@pytest.mark.parametrize(
    "tgt, src, expected",
    [
        # compaction after a verify: accepted rows 4, 6, 7 slide left onto 3, 4, 5
        ([3, 4, 5], [4, 6, 7], [0, 1, 2, 4, 6, 7, 6, 7]),
        # a right shift over itself: a row-by-row forward copy would smear row 2 everywhere
        ([3, 4, 5], [2, 3, 4], [0, 1, 2, 2, 3, 4, 6, 7]),
        # a swap
        ([1, 6], [6, 1], [0, 6, 2, 3, 4, 5, 1, 7]),
    ],
)
def test_copy_all_layer_kv_cache_overlapping_moves_read_all_sources_first(tgt, src, expected):
    bufs = _kv_buffers(8)
    _move(bufs, tgt, src)
    for layer, buf in enumerate(bufs):
        assert _row_ids(buf, layer) == expected


def test_copy_all_layer_kv_cache_without_locations_changes_nothing():
    bufs = _kv_buffers(4)
    before = [b.clone() for b in bufs]
    _move(bufs, [], [])
    _move(bufs, [0], [0])  # SGLang's warm-up call
    assert all(torch.equal(b, o) for b, o in zip(bufs, before))


# ---------------------------------------------------------------- verify outputs


def test_fill_bonus_tokens_takes_the_last_emitted_token_of_each_request():
    accept_tokens = torch.tensor([[5, 6, 7, -1], [8, -1, -1, -1], [9, 10, 11, 12]], dtype=torch.int32)
    bonus = torch.full((3,), -1, dtype=torch.int64)
    kernels.fill_bonus_tokens_cpu(accept_tokens, torch.tensor([3, 1, 4], dtype=torch.int32), bonus, 4)
    assert bonus.tolist() == [7, 8, 12]


def test_fill_accept_out_cache_loc_compacts_accepted_slots_in_order():
    accept_index = torch.tensor([[0, 1, -1], [3, -1, -1], [6, 7, 8]], dtype=torch.int32)
    out_cache_loc = torch.arange(100, 109, dtype=torch.int64)
    dest = torch.full((9,), -1, dtype=torch.int64)
    kernels.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, dest)
    assert dest.tolist() == [100, 101, 103, 106, 107, 108, -1, -1, -1]


def _greedy(candidates, retrive_index, next_token, next_sibling, target, num_spec):
    bs, n = candidates.shape
    predicts = torch.full((bs * n,), -1, dtype=torch.int32)
    accept_index = torch.full((bs, num_spec), -1, dtype=torch.int32)
    accept_num = torch.full((bs,), -1, dtype=torch.int32)
    kernels.verify_tree_greedy_cpu(
        predicts, accept_index, accept_num, candidates, retrive_index, next_token, next_sibling, target
    )
    return predicts.tolist(), accept_index.tolist(), accept_num.tolist()


def test_verify_tree_greedy_on_chains():
    # three requests, chain root -> 1 -> 2 -> 3; partial, full and no acceptance
    candidates = torch.tensor([[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]])
    target = torch.tensor([[11, 12, 99, 77], [21, 22, 23, 24], [40, 41, 42, 43]])
    retrive_index = torch.arange(12).reshape(3, 4)
    next_token = torch.tensor([[1, 2, 3, -1]] * 3)
    next_sibling = torch.full((3, 4), -1)
    predicts, accept_index, accept_num = _greedy(
        candidates, retrive_index, next_token, next_sibling, target, 4
    )
    assert accept_num == [2, 3, 0]
    assert accept_index == [[0, 1, 2, -1], [4, 5, 6, 7], [8, -1, -1, -1]]
    # target tokens at the accepted slots, plus the bonus at the last one; other slots untouched
    assert predicts == [11, 12, 99, -1, 21, 22, 23, 24, 40, -1, -1, -1]


# A small tree in breadth-first order:      0
#                                         /   \
#                                        1     2
#                                        |    / \
#                                        3   4   5
TREE_PARENT = [-1, 0, 0, 1, 2, 2]
TREE_NEXT_TOKEN = [1, 3, 4, -1, -1, -1]
TREE_NEXT_SIBLING = [-1, 2, -1, -1, 5, -1]


def test_verify_tree_greedy_follows_the_matching_sibling():
    #             root  1   2   3   4   5
    candidates = torch.tensor([[7, 50, 60, 70, 80, 90], [7, 50, 60, 70, 80, 90]])
    target = torch.tensor(
        [
            [60, 71, 90, 72, 73, 55],  # root -> 2 (second child), 2 -> 5 (second child), bonus 55
            [50, 70, 1, 66, 2, 3],  # root -> 1, 1 -> 3 (leaf), bonus 66
        ]
    )
    retrive_index = torch.arange(12).reshape(2, 6)
    next_token = torch.tensor([TREE_NEXT_TOKEN] * 2)
    next_sibling = torch.tensor([TREE_NEXT_SIBLING] * 2)
    predicts, accept_index, accept_num = _greedy(
        candidates, retrive_index, next_token, next_sibling, target, 4
    )
    assert accept_num == [2, 2]
    assert accept_index == [[0, 2, 5, -1], [6, 7, 9, -1]]
    assert predicts[:6] == [60, -1, 90, -1, -1, 55]
    assert predicts[6:] == [50, 70, -1, 66, -1, -1]


def test_verify_tree_greedy_stops_when_no_child_matches():
    candidates = torch.tensor([[7, 50, 60, 70, 80, 90]])
    target = torch.tensor([[60, 0, 81, 0, 0, 0]])  # root -> 2; 2's children are 80, 90, not 81
    predicts, accept_index, accept_num = _greedy(
        candidates,
        torch.arange(6)[None],
        torch.tensor([TREE_NEXT_TOKEN]),
        torch.tensor([TREE_NEXT_SIBLING]),
        target,
        4,
    )
    assert accept_num == [1]
    assert accept_index == [[0, 2, -1, -1]]
    assert predicts == [60, -1, 81, -1, -1, -1]


# ---------------------------------------------------------------- verify-tree metadata from masks


def _ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[n, n] bool, row i = i's ancestors and itself (how SGLang's NGRAM tree masks look)."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def _reconstruct(masks: list[torch.Tensor], verified: list[int]):
    bs, n = len(masks), masks[0].shape[0]
    outs = [torch.full((bs * n,), -7, dtype=torch.int64) for _ in range(4)]
    kernels.reconstruct_indices_from_tree_mask(
        torch.stack(masks).reshape(-1), torch.tensor(verified), *outs, bs, n
    )
    return [o.reshape(bs, n).tolist() for o in outs]


def test_reconstruct_indices_on_a_chain_and_a_tree():
    chain = _ancestor_mask([-1, 0, 1, 2, 3, 4])
    tree = _ancestor_mask(TREE_PARENT)
    positions, retrive_index, next_token, next_sibling = _reconstruct([chain, tree], [10, 3])
    assert positions == [[10, 11, 12, 13, 14, 15], [3, 4, 4, 5, 5, 5]]
    assert retrive_index == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    assert next_token == [[1, 2, 3, 4, 5, -1], TREE_NEXT_TOKEN]
    assert next_sibling == [[-1] * 6, TREE_NEXT_SIBLING]


def test_reconstruct_indices_on_a_depth_first_tree():
    # 0 -> 1 -> 2 and 0 -> 3 -> 4: node 1's next sibling (3) is not adjacent to it
    positions, _, next_token, next_sibling = _reconstruct([_ancestor_mask([-1, 0, 1, 0, 3])], [0])
    assert positions == [[0, 1, 2, 1, 2]]
    assert next_token == [[1, 2, -1, 4, -1]]
    assert next_sibling == [[-1, 3, -1, -1, -1]]


def test_reconstruct_indices_ignores_the_diagonal_and_upper_triangle():
    strict = _ancestor_mask(TREE_PARENT) & torch.ones(6, 6, dtype=torch.bool).tril(-1)
    noisy = _ancestor_mask(TREE_PARENT) | torch.ones(6, 6, dtype=torch.bool).triu()
    assert (
        _reconstruct([strict], [4])
        == _reconstruct([noisy], [4])
        == _reconstruct([_ancestor_mask(TREE_PARENT)], [4])
    )


def test_reconstructed_indices_drive_verify_tree_greedy():
    _, retrive_index, next_token, next_sibling = _reconstruct([_ancestor_mask(TREE_PARENT)], [5])
    candidates = torch.tensor([[7, 50, 60, 70, 80, 90]])
    target = torch.tensor([[60, 0, 90, 0, 0, 55]])
    _, accept_index, accept_num = _greedy(
        candidates,
        torch.tensor(retrive_index),
        torch.tensor(next_token),
        torch.tensor(next_sibling),
        target,
        4,
    )
    assert accept_num == [2] and accept_index == [[0, 2, 5, -1]]


# ---------------------------------------------------------------- EAGLE-only ops


@pytest.mark.parametrize("name", EAGLE_ONLY)
def test_eagle_only_ops_raise_naming_the_op(name):
    assert name in kernels.OPS
    with pytest.raises(NotImplementedError, match=name):
        getattr(kernels, name)(torch.zeros(1), 1, k=2)


# ---------------------------------------------------------------- against SGLang's Triton kernels

_TRITON_CHILD = """
import torch
torch.set_num_threads(1)
from tests.cpu.test_kernels import triton_cross_check
triton_cross_check()
print("cross-check ok")
"""


def triton_cross_check(trials: int = 6) -> None:
    """Runs in a child with TRITON_INTERPRET=1: SGLang's Triton kernels vs our ops on random inputs."""
    from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs
    from sglang.kernels.ops.speculative.eagle import fill_accept_out_cache_loc, fill_bonus_tokens
    from sglang.kernels.ops.speculative.reconstruct_tree import reconstruct_indices_from_tree_mask_triton
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton

    gen = torch.Generator().manual_seed(1234)

    def randint(hi, size):
        return torch.randint(0, hi, size, generator=gen)

    for trial in range(trials):
        bs, n = 3, 7
        parents = [[-1] + [int(randint(i, (1,))) for i in range(1, n)] for _ in range(bs)]
        mask = torch.stack([_ancestor_mask(p) for p in parents]).reshape(-1)
        verified = randint(50, (bs,))
        ours = [torch.zeros(bs * n, dtype=torch.int64) for _ in range(4)]
        theirs = [torch.zeros(bs * n, dtype=torch.int64) for _ in range(4)]
        kernels.reconstruct_indices_from_tree_mask(mask, verified, *ours, bs, n)
        reconstruct_indices_from_tree_mask_triton(mask, verified, *theirs, bs, n)
        for a, b in zip(ours, theirs):
            assert torch.equal(a, b), (trial, parents, ours, theirs)

        ridx, nxt, sib = (t.reshape(bs, n) for t in ours[1:])
        candidates = randint(3, (bs, n))  # a 3-token vocabulary so that matches happen
        target = randint(3, (bs, n))
        results = []
        for fn in (kernels.verify_tree_greedy_cpu, verify_tree_greedy_triton):
            predicts = torch.full((bs * n,), -1, dtype=torch.int64)
            accept_index = torch.full((bs, n), -1, dtype=torch.int64)
            accept_num = torch.zeros(bs, dtype=torch.int64)
            fn(predicts, accept_index, accept_num, candidates, ridx, nxt, sib, target)
            results.append((predicts, accept_index, accept_num))
        for a, b in zip(*results):
            assert torch.equal(a, b), (trial, parents, candidates, target, results)

        accept_index = results[0][1]
        accept_lens = results[0][2] + 1
        accept_tokens = randint(1000, (bs, n))
        bonus = [torch.zeros(bs, dtype=torch.int64) for _ in range(2)]
        kernels.fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus[0], n)
        fill_bonus_tokens[(bs,)](accept_tokens, accept_lens, bonus[1], n)
        assert torch.equal(*bonus), (trial, bonus)

        out_cache_loc = randint(10_000, (bs * n,))
        dest = [torch.full((bs * n,), -1, dtype=torch.int64) for _ in range(2)]
        kernels.fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, dest[0])
        flat = accept_index.reshape(-1).contiguous()
        fill_accept_out_cache_loc[(flat.numel(),)](flat, out_cache_loc, dest[1], 32)
        assert torch.equal(*dest), (trial, accept_num, dest)

        table = randint(10_000, (5, 40)).to(torch.int32)
        rows = torch.randperm(5, generator=gen)[:bs]
        starts = randint(20, (bs,))
        ends = starts + randint(15, (bs,))
        total = int((ends - starts).sum())
        locs = [torch.full((total + 2,), -1, dtype=torch.int64) for _ in range(2)]
        kernels.assign_extend_cache_locs_cpu(rows, table, starts, ends, locs[0], 40)
        assign_extend_cache_locs[(bs,)](rows, table, starts, ends, locs[1], 40, 4)
        assert torch.equal(*locs), (trial, locs)


@pytest.mark.slow  # ~6 s of CPU: the child imports SGLang and interprets the kernels in Python
def test_ops_match_sglang_triton_kernels_under_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", _TRITON_CHILD], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0 and "cross-check ok" in proc.stdout, proc.stderr[-4000:]
