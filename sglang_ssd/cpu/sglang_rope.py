"""SGLang's native rotary embedding on the CPU in one C call (``csrc/rope.c``).

On a plain CPU SGLang runs ``RotaryEmbedding.forward_native``: about twenty small torch ops per layer
and step, which cost a tenth of a decode step of the 135M target (profiled in the server). The C
kernel performs the same rounded products and sums in the same order, so its q and k are
bit-identical to the native path's (``tests/cpu/test_rope.py``): the served model does not change,
only the time it takes.

An AROUND hook on ``forward_native``; the kernel runs where it applies (fp32 CPU q/k and cache, the
plain ``apply_rotary_emb``, no position offsets, no precomputed per-batch cache) and SGLang's code
runs everywhere else. The kernel is called through the compiled entry (``csrc/entry.cpp``: same
checks, made in C++) where it is built, through ctypes otherwise. Same switch as the linear route:
``SGLANG_SSD_CPU_LINEAR=torch`` turns it off.
"""

from __future__ import annotations

import torch

from sglang_ssd.cpu import clib
from sglang_ssd.hooks import register_once

TARGET = "sglang.srt.layers.rotary_embedding.base.RotaryEmbedding.forward_native"


def plain(emb) -> bool:
    """Whether ``emb`` rotates as the plain native path does (checked once per module)."""
    from sglang.srt.layers.rotary_embedding.utils import apply_rotary_emb

    rot = emb.rotary_dim
    return (
        rot % 2 == 0 and 0 < rot <= emb.head_size
        and not hasattr(emb, "sin_cos_cache")  # a subclass's per-batch cache: its own semantics
        and emb._apply_rotary_emb_wrapped is apply_rotary_emb  # not a compiled or replaced variant
    )  # fmt: skip


def plain_once(emb) -> bool:
    """``plain(emb)``, decided on the first call and kept on the module."""
    static = emb.__dict__.get("_ssd_rope_plain")
    if static is None:
        static = emb.__dict__["_ssd_rope_plain"] = plain(emb)
    return static


def applies(emb, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> bool:
    """Whether the kernel computes exactly what ``emb.forward_native`` would, for this call."""
    cache, head = emb.cos_sin_cache, emb.head_size  # the cache may be regrown between calls
    return (
        plain_once(emb) and query.is_cpu and key.is_cpu and query.dtype is torch.float32 and key.dtype is torch.float32
        and cache.is_cpu and cache.dtype is torch.float32 and cache.dim() == 2 and cache.stride(1) == 1
        and cache.shape[1] == emb.rotary_dim and query.shape[-1] % head == 0 and key.shape[-1] % head == 0
        and query.numel() // query.shape[-1] == positions.numel() == key.numel() // key.shape[-1]
    )  # fmt: skip


def forward_native_hook(original, emb, positions, query, key, offsets=None, fused_set_kv_buffer_arg=None,
                        **kwargs):  # fmt: skip
    simple = offsets is None and fused_set_kv_buffer_arg is None and not kwargs
    entry = clib.rope_entry() if simple and plain_once(emb) else None
    if entry is not None:  # the same kernel from C++, which checks the tensors itself (ctypes: 25-35 us more)
        out = entry(positions, query, key, emb.cos_sin_cache, emb.head_size, emb.rotary_dim, bool(emb.is_neox_style))
        if out is not None:
            return out
    fn = clib.rope_kernel() if simple else None
    if fn is None or not applies(emb, positions, query, key):
        return original(emb, positions, query, key, offsets, fused_set_kv_buffer_arg, **kwargs)
    q2, ldq = clib.rows_of(query)
    k2, ldk = clib.rows_of(key)
    pos = positions.reshape(-1).to(torch.int64).contiguous()
    oq, ok = torch.empty(query.shape, dtype=torch.float32), torch.empty(key.shape, dtype=torch.float32)
    cache, head = emb.cos_sin_cache, emb.head_size
    rc = fn(q2.data_ptr(), ldq, k2.data_ptr(), ldk, oq.data_ptr(), ok.data_ptr(), pos.data_ptr(), pos.numel(),
            q2.shape[1] // head, k2.shape[1] // head, head, emb.rotary_dim, int(bool(emb.is_neox_style)),
            cache.data_ptr(), cache.stride(0), cache.shape[0])  # fmt: skip
    if rc != 0:  # a position outside the cache: SGLang's own code raises or grows it
        return original(emb, positions, query, key, offsets, fused_set_kv_buffer_arg, **kwargs)
    return oq, ok


def register() -> None:
    register_once(TARGET, forward_native_hook)
