"""TARGET_VERIFY for SGLang's `torch_native` attention backend (which has none in 0.5.23).

In a verify forward every request brings n draft tokens (root = last committed token first) whose
K/V are written at positions [seq_len, seq_len + n). Query i attends to the whole committed prefix
and to the draft tokens the verify mask allows: a custom ancestor mask M (n x n, row i = query) for
trees, lower-triangular for chains. This is what the CUDA backends do with their custom-mask kernels.

Installed through SGLang's hook registry as an AROUND hook on `TorchNativeAttnBackend.forward_extend`;
other forward modes go to the original method untouched. The same change as a source patch lives in
`patches/0001-torch-native-target-verify.patch` (its SDPA form: `torch_verify_attention`); the plugin
runs the C kernel of `attention.py` where it applies, so that verify and decode agree bit for bit.
"""

from __future__ import annotations

import contextlib

import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_ssd.cpu import sglang_attention as attention
from sglang_ssd.hooks import register_once

TARGET = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_extend"


def is_chain(spec_info) -> bool:
    """A chain verify (no custom mask, or a top-1 tree): every draft sees the drafts before it."""
    return getattr(spec_info, "custom_mask", None) is None or getattr(spec_info, "tree_topk", -1) == 1


def verify_masks(spec_info, seq_lens: list[int], device) -> list[torch.Tensor]:
    """Per request, the [n, n] bool mask over its draft tokens (True = may attend)."""
    n = spec_info.draft_token_num
    bs = len(seq_lens)
    if is_chain(spec_info):
        causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        return [causal] * bs
    flat = spec_info.custom_mask.reshape(-1).to(torch.bool)
    if flat.numel() >= bs * n * n and flat.numel() != sum((s + n) * n for s in seq_lens):
        return list(flat[: bs * n * n].view(bs, n, n))
    # Full-width layout (GPU style): each request's rows span prefix + drafts; keep the draft block.
    masks, off = [], 0
    for s in seq_lens:
        rows = flat[off : off + (s + n) * n].view(n, s + n)
        masks.append(rows[:, s:])
        off += (s + n) * n
    return masks


def verify_attention(backend, q, k, v, layer, forward_batch, save_kv_cache: bool = True) -> torch.Tensor:
    """Attention for a TARGET_VERIFY batch; q/k/v are [num_tokens, heads * head_dim]. Through the C
    kernel where it applies (`attention.py`: bit-identical to the decode step's), else torch's SDPA."""
    n = forward_batch.spec_info.draft_token_num
    out = attention.fused_attention(backend, q, k, v, layer, forward_batch, n, tree_mask(forward_batch), False,
                                    save_kv_cache)  # fmt: skip
    if out is not None:
        return out
    if save_kv_cache and k is not None and v is not None:
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        backend.token_to_kv_pool.set_kv_buffer(layer, KVWriteLoc(forward_batch.out_cache_loc, None), k, v)
    fn = attention.kernel_for(q, layer)
    if fn is not None:
        out = attention.paged_attention(fn, backend, q, layer, forward_batch, n, tree_mask(forward_batch),
                                        decode=False)
        if out is not None:
            return out
    return torch_verify_attention(backend, q, layer, forward_batch)


def tree_mask(forward_batch) -> torch.Tensor | None:
    """uint8 [bs, n, n] mask over the draft tokens, or None for chains (the kernel's causal default,
    which gives the same bits as a lower-triangular mask). Every layer asks: it is built once per
    forward and kept on the batch, for the same spec_info, custom_mask and seq_lens objects (a profile of
    the SSD server put 3 % of a verify step into rebuilding it per layer)."""
    spec_info, seq_lens = forward_batch.spec_info, forward_batch.seq_lens
    key = (spec_info, getattr(spec_info, "custom_mask", None), seq_lens)
    cached = getattr(forward_batch, "_ssd_tree_mask", None)
    if cached is not None and all(a is b for a, b in zip(cached[0], key)):
        return cached[1]
    mask = None
    if not is_chain(spec_info):
        mask = torch.stack(verify_masks(spec_info, seq_lens.tolist(), "cpu")).to(torch.uint8)
        if torch.equal(mask, torch.ones_like(mask).tril()):  # a chain sent as a mask (SSD's verify)
            mask = None
    with contextlib.suppress(AttributeError):  # a batch type that takes no new attributes: no cache
        forward_batch._ssd_tree_mask = (key, mask)
    return mask


def torch_verify_attention(backend, q, layer, forward_batch) -> torch.Tensor:
    """The same attention with torch's SDPA, one call per request (K/V already written)."""
    pool = backend.token_to_kv_pool
    spec_info = forward_batch.spec_info
    n = spec_info.draft_token_num
    seq_lens = forward_batch.seq_lens.tolist()
    req_rows = forward_batch.req_pool_indices.tolist()
    k_cache = pool.get_key_buffer(layer.layer_id)
    v_cache = pool.get_value_buffer(layer.layer_id)
    req_to_token = backend.req_to_token_pool.req_to_token

    heads, head_dim = layer.tp_q_head_num, layer.qk_head_dim
    q_ = q.reshape(-1, heads, head_dim)
    out = q.new_empty((q_.shape[0], heads, layer.v_head_dim))
    for b, (seq_len, row, draft_mask) in enumerate(
        zip(seq_lens, req_rows, verify_masks(spec_info, seq_lens, q.device))
    ):
        locs = req_to_token[row, : seq_len + n].to(torch.int64)
        keys = k_cache[locs].to(q.dtype).movedim(0, 1)  # [kv_heads, L, d]
        values = v_cache[locs].to(q.dtype).movedim(0, 1)
        mask = torch.cat([torch.ones(n, seq_len, dtype=torch.bool, device=q.device), draft_mask], dim=1)
        out[b * n : (b + 1) * n] = scaled_dot_product_attention(
            q_[b * n : (b + 1) * n].movedim(0, 1).unsqueeze(0),
            keys.unsqueeze(0),
            values.unsqueeze(0),
            attn_mask=mask,
            scale=layer.scaling,
            enable_gqa=heads != layer.tp_k_head_num,
        )[0].movedim(0, 1)
    return out.reshape(q_.shape[0], heads * layer.v_head_dim)


def forward_extend_hook(original, backend, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    """AROUND hook: route TARGET_VERIFY batches to `verify_attention`, everything else to SGLang."""
    if forward_batch.forward_mode.is_target_verify():
        return verify_attention(backend, q, k, v, layer, forward_batch, save_kv_cache)
    return original(backend, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)


def register() -> None:
    register_once(TARGET, forward_extend_hook)
