"""Decode and TARGET_VERIFY attention of SGLang's `torch_native` backend through the C kernel.

``csrc/attention.c`` reads the KV pool through SGLang's token table and reduces every (query, head)
pair in one fixed order, so a token's attention is bit-identical in a 1-token decode step and in a
K+1-token verify. With the linear kernel, that makes a verified token's logits equal to the plain
step's bit for bit: greedy SSD/SD output equals AR by construction, not only away from near-ties.
It also does in one call per layer what torch does with a dozen per request (gathers, masks, SDPA).

Same switch as the linear route (``SGLANG_SSD_CPU_LINEAR``, read once): ``torch`` keeps SGLang's SDPA
for decode and the SDPA verify path of ``verify_attention.py``; the kernel is used only where it
applies (fp32 Q and KV pool, int32 token table, equal Q/V head sizes, no sliding window or
cross-attention); anything else goes to torch.
"""

from __future__ import annotations

import torch

from sglang_ssd.cpu import clib
from sglang_ssd.hooks import register_once

DECODE_TARGET = "sglang.srt.layers.attention.torch_native_backend.TorchNativeAttnBackend.forward_decode"


def kernel_for(q: torch.Tensor, layer):
    """The C attention for this call, or None where it does not apply."""
    if not q.is_cpu or q.dtype is not torch.float32 or layer.qk_head_dim != layer.v_head_dim:
        return None
    window = getattr(layer, "sliding_window_size", None)
    if getattr(layer, "is_cross_attention", False) or (window is not None and window > -1):
        return None
    return clib.attention_kernel()


def plain_pool(pool) -> bool:
    """Whether ``pool`` is SGLang's plain fp32 MHA pool, whose ``set_kv_buffer`` is a row copy into
    ``[slots, kv_heads, dim]`` buffers (what the compiled entry does itself); decided once per pool."""
    plain = pool.__dict__.get("_ssd_plain_pool")
    if plain is None:
        plain = pool.__dict__["_ssd_plain_pool"] = (
            type(pool).__name__ == "MHATokenToKVPool" and getattr(pool, "kv_cache_layout", None) == "nhd"
            and not getattr(pool, "use_hnd", False) and not getattr(pool, "is_quantized_kv_cache", False)
            and not getattr(pool, "requires_physical_write_loc", False)
            and pool.dtype is torch.float32 and pool.store_dtype is torch.float32
        )  # fmt: skip
    return plain


def fused_attention(backend, q, k, v, layer, forward_batch, n: int, mask: torch.Tensor | None, decode: bool,
                    save_kv_cache: bool) -> torch.Tensor | None:
    """The layer's KV write and attention in one compiled call (``csrc/entry.cpp``): the same copy
    SGLang's plain pool makes and the same kernel, without their Python. None where it does not apply,
    with nothing written (except when the kernel finds no scratch memory, after an identical write);
    the caller then takes the ctypes path."""
    entry = clib.attention_entry()
    pool = backend.token_to_kv_pool
    if entry is None or kernel_for(q, layer) is None or not plain_pool(pool):
        return None
    if getattr(forward_batch, "encoder_lens", None) is not None:  # its table starts after the encoder's tokens
        return None
    write = save_kv_cache and k is not None and v is not None
    if write and getattr(backend, "swa_out_cache_loc", None) is not None:
        return None
    layer_id = layer.layer_id
    return entry(q, k if write else None, v if write else None, pool.get_key_buffer(layer_id),
                 pool.get_value_buffer(layer_id), forward_batch.out_cache_loc if write else None,
                 backend.req_to_token_pool.req_to_token, forward_batch.req_pool_indices, forward_batch.seq_lens, n,
                 layer.tp_q_head_num, float(layer.scaling), decode, mask)  # fmt: skip


def paged_attention(fn, backend, q, layer, forward_batch, n: int, mask: torch.Tensor | None,
                    decode: bool) -> torch.Tensor | None:
    """Attention of ``forward_batch``'s queries (n per request) over the pool, K/V already written.
    ``mask``: uint8 [bs, n, n] over the query tokens (None = causal chain); ``decode``: seq_lens
    include the queries. None when the pool or table has a layout the kernel does not take."""
    pool = backend.token_to_kv_pool
    k_cache, v_cache = pool.get_key_buffer(layer.layer_id), pool.get_value_buffer(layer.layer_id)
    table = backend.req_to_token_pool.req_to_token
    heads, kv_heads, dim = layer.tp_q_head_num, layer.tp_k_head_num, layer.qk_head_dim
    if (
        k_cache.dtype is not torch.float32 or v_cache.dtype is not torch.float32 or table.dtype is not torch.int32
        or k_cache.stride() != v_cache.stride() or k_cache.stride()[1:] != (dim, 1) or table.stride(1) != 1
        or heads % kv_heads or getattr(forward_batch, "encoder_lens", None) is not None
    ):  # fmt: skip
        return None
    q2 = q.reshape(-1, heads * dim)
    if q2.stride(1) != 1:
        q2 = q2.contiguous()
    rows = forward_batch.req_pool_indices.to(torch.int64).contiguous()
    lens = forward_batch.seq_lens.to(torch.int64).contiguous()
    if mask is not None:
        mask = mask.to(torch.uint8).contiguous()
    return attend(fn, q2, k_cache, v_cache, table, rows, lens, n, kv_heads, float(layer.scaling), decode=decode,
                  mask=mask)  # fmt: skip


def attend(fn, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
           rows: torch.Tensor, lens: torch.Tensor, n: int, kv_heads: int, scaling: float, *, decode: bool,
           mask: torch.Tensor | None = None) -> torch.Tensor | None:
    """One call of the C attention (the argument layout of ``csrc/attention.c`` lives only here).
    ``q``: [requests * n, heads * dim] with unit column stride; ``k_cache``/``v_cache``: [slots,
    kv_heads, dim] with equal strides; ``table``: int32 [*, capacity] token table, ``rows`` its int64
    row per request; ``lens``: int64 sequence lengths; ``mask``: uint8 [requests, n, n] or None (causal).
    Returns [requests * n, heads * dim], or None when the kernel refuses the layout."""
    dim = k_cache.shape[-1]
    heads = q.shape[1] // dim
    out = torch.empty((q.shape[0], heads * dim), dtype=torch.float32)
    rc = fn(q.data_ptr(), q.stride(0), out.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), k_cache.stride(0),
            table.data_ptr(), table.stride(0), rows.data_ptr(), lens.data_ptr(), int(decode), rows.numel(), n,
            None if mask is None else mask.data_ptr(), heads, kv_heads, dim, scaling)  # fmt: skip
    return out if rc == 0 else None


def forward_decode_hook(original, backend, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
    """AROUND hook on ``forward_decode``: the C attention where it applies, SGLang's SDPA otherwise."""
    out = fused_attention(backend, q, k, v, layer, forward_batch, 1, None, True, save_kv_cache)
    if out is not None:
        return out
    fn = kernel_for(q, layer)
    if fn is None:
        return original(backend, q, k, v, layer, forward_batch, save_kv_cache, **kwargs)
    if save_kv_cache and k is not None and v is not None:
        from sglang.srt.mem_cache.memory_pool import KVWriteLoc

        loc = KVWriteLoc(forward_batch.out_cache_loc, getattr(backend, "swa_out_cache_loc", None))
        backend.token_to_kv_pool.set_kv_buffer(layer, loc, k, v)
    out = paged_attention(fn, backend, q, layer, forward_batch, 1, None, decode=True)
    if out is None:  # K/V are written: SGLang's path must not write them again
        return original(backend, q, k, v, layer, forward_batch, False, **kwargs)
    return out


def register() -> None:
    register_once(DECODE_TARGET, forward_decode_hook)
