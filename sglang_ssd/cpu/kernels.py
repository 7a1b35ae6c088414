"""Pure-torch versions of the `sgl_kernel` `*_cpu` ops SGLang's CPU engine imports.

Only the ops on the paths we serve (plain decoding, chunked prefill, chain/tree TARGET_VERIFY with KV
compaction) are implemented; EAGLE's draft-side ops raise a clear error if ever called. Semantics
follow SGLang's Triton kernels of the same name (`sglang/kernels/ops/...`): same arguments, same
in-place outputs. Tested against hand-computed cases in `tests/cpu/test_kernels.py`.
"""

from __future__ import annotations

import ctypes

import torch


def assign_req_to_token_pool_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """req_to_token[req_pool_indices[i], start[i]:end[i]] = the i-th consecutive run of out_cache_loc."""
    del pool_len  # row width; implied by req_to_token
    lengths = (end_offset - start_offset).tolist()
    starts = start_offset.tolist()
    rows = req_pool_indices.tolist()
    pos = 0
    for row, start, n in zip(rows, starts, lengths):
        req_to_token[row, start : start + n] = out_cache_loc[pos : pos + n].to(req_to_token.dtype)
        pos += n


def copy_all_layer_kv_cache_cpu(
    data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor, src_loc: torch.Tensor
) -> None:
    """For every KV buffer (one base pointer + row stride in bytes per buffer): row[tgt] = row[src].

    SGLang hands raw buffer addresses here (all layers' K and V at once). All source rows are read
    before any target row is written, so overlapping moves (KV compaction) are safe.
    """
    tgt = tgt_loc.tolist()
    src = src_loc.tolist()
    if not tgt:
        return
    for base, stride in zip(data_ptrs.tolist(), strides.tolist()):
        saved = [ctypes.string_at(base + s * stride, stride) for s in src]
        for t, row in zip(tgt, saved):
            ctypes.memmove(base + t * stride, row, stride)


def assign_extend_cache_locs_cpu(
    req_pool_indices: torch.Tensor,
    req_to_token: torch.Tensor,
    start_offset: torch.Tensor,
    end_offset: torch.Tensor,
    out_cache_loc: torch.Tensor,
    pool_len: int,
) -> None:
    """out_cache_loc = concat_i req_to_token[req_pool_indices[i], start[i]:end[i]] (the inverse gather)."""
    del pool_len
    pos = 0
    for row, start, end in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        n = end - start
        out_cache_loc[pos : pos + n] = req_to_token[row, start:end].to(out_cache_loc.dtype)
        pos += n


def reconstruct_indices_from_tree_mask(
    tree_mask: torch.Tensor,
    verified_seq_len: torch.Tensor,
    positions: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    batch_size: int,
    draft_token_num: int,
) -> None:
    """Verify-tree metadata from a flat [bs, n, n] ancestor mask (mask[b, i, j]: j is an ancestor of i).

    positions = depth + verified length; retrive_index = b*n + i; next_token = first child;
    next_sibling = next node with the same parent (-1 for the root and last siblings).
    """
    n = draft_token_num
    m = tree_mask.reshape(-1)[: batch_size * n * n].reshape(batch_size, n, n).to(torch.bool)
    order = torch.arange(n)
    ancestors = m & (order[None, :] < order[:, None])[None]  # [b, i, j], strict
    depth = ancestors.sum(-1)
    positions.reshape(-1)[: batch_size * n] = (depth + verified_seq_len.reshape(-1, 1).to(depth.dtype)).reshape(-1)
    retrive_index.reshape(batch_size, n)[:] = (torch.arange(batch_size)[:, None] * n + order[None]).to(
        retrive_index.dtype
    )
    parent = torch.where(ancestors.any(-1), (ancestors * order).argmax(-1), torch.full_like(depth, -1))
    is_child = parent[:, :, None] == order[None, None, :]  # [b, k, tid]: k's parent is tid
    first_child = torch.where(is_child, order[None, :, None].expand_as(is_child), n).min(1).values
    retrive_next_token.reshape(batch_size, n)[:] = torch.where(first_child < n, first_child, -1)
    later_same = (parent[:, :, None] == parent[:, None, :]) & (order[:, None] > order[None, :])[None]
    sib = torch.where(later_same, order[None, :, None].expand_as(later_same), n).min(1).values
    sib = torch.where((parent >= 0) & (sib < n), sib, -1)
    retrive_next_sibling.reshape(batch_size, n)[:] = sib


def fill_bonus_tokens_cpu(
    accept_tokens: torch.Tensor, accept_lens: torch.Tensor, bonus_tokens: torch.Tensor, accept_stride: int
) -> None:
    """bonus[i] = accept_tokens.flat[i * stride + accept_lens[i] - 1] (the last emitted token)."""
    n = accept_lens.numel()
    idx = torch.arange(n, dtype=torch.int64) * accept_stride + accept_lens.to(torch.int64) - 1
    bonus_tokens[:n] = accept_tokens.reshape(-1)[idx].to(bonus_tokens.dtype)


def fill_accept_out_cache_loc_cpu(
    accept_index: torch.Tensor, out_cache_loc: torch.Tensor, accept_out_cache_loc: torch.Tensor
) -> None:
    """Compact the KV locations of accepted slots (accept_index != -1) to the front, in order."""
    flat = accept_index.reshape(-1)
    kept = flat[flat != -1].to(torch.int64)
    accept_out_cache_loc[: kept.numel()] = out_cache_loc[kept].to(accept_out_cache_loc.dtype)


def verify_tree_greedy_cpu(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Greedy tree walk: at each depth follow the child whose token equals the target's argmax.

    predicts[flat slot] receives the target token at every accepted slot and at the last one (bonus);
    accept_index[b, :n+1] the flat slots accepted (root first); accept_token_num[b] = n.
    """
    batch, num_draft = candidates.shape
    num_spec = accept_index.shape[1]
    cand = candidates.tolist()
    ridx = retrive_index.tolist()
    nxt = retrive_next_token.tolist()
    sib = retrive_next_sibling.tolist()
    target = target_predict.reshape(-1).tolist()
    for b in range(batch):
        last = ridx[b][0]
        accept_index[b, 0] = last
        accepted = 0
        cur = 0
        for _ in range(1, num_spec):
            cur = nxt[b][cur]
            want = target[last]
            while cur != -1 and cand[b][cur] != want:
                cur = sib[b][cur]
            if cur == -1:
                break
            predicts[last] = want
            accepted += 1
            accept_index[b, accepted] = ridx[b][cur]
            last = ridx[b][cur]
        accept_token_num[b] = accepted
        predicts[last] = target[last]


def _eagle_only(name: str):
    def unsupported(*args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{name} (EAGLE draft-side op) has no pure-torch version: EAGLE/STANDALONE "
            "drafting is not supported on the plain-CPU route; use --speculative-algorithm SSD or NGRAM"
        )

    unsupported.__name__ = name
    return unsupported


build_tree_kernel_efficient_cpu = _eagle_only("build_tree_kernel_efficient_cpu")
assign_draft_cache_locs_contiguous_cpu = _eagle_only("assign_draft_cache_locs_contiguous_cpu")
rotate_input_ids_cpu = _eagle_only("rotate_input_ids_cpu")

# The names the `sgl_kernel` stand-in answers; every other name raises ImportError.
OPS = (
    "assign_req_to_token_pool_cpu",
    "copy_all_layer_kv_cache_cpu",
    "fill_bonus_tokens_cpu",
    "assign_extend_cache_locs_cpu",
    "fill_accept_out_cache_loc_cpu",
    "verify_tree_greedy_cpu",
    "build_tree_kernel_efficient_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "rotate_input_ids_cpu",
)

# Submodules the stand-in answers, with their names.
SUBMODULE_OPS = {"speculative": ("reconstruct_indices_from_tree_mask",)}
