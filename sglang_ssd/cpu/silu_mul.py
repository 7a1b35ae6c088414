"""SGLang's SiLU-and-mul on the CPU through the compiled entry (``csrc/entry.cpp``).

On a plain CPU SGLang runs ``SiluAndMul.forward_native``: ``silu(x[..., :d]) * x[..., d:]``. Inside the
server the custom-op dispatch and the slices around those two ATen calls cost 26 µs a layer in a decode
step and 38 µs in a 5-token verify (``bench/forward_breakdown.py``). The entry makes the same two ATen
calls on the same views from C++, so the output is the native path's bit for bit
(``tests/cpu/test_silu_mul.py``): the served model does not change, only the time it takes.

An AROUND hook on ``forward_native``; CPU tensors with an even last dimension go to the entry, anything
else (and the torch route, ``SGLANG_SSD_CPU_LINEAR=torch``, or a machine without the entry) to SGLang's
own code.
"""

from __future__ import annotations

from sglang_ssd.cpu import clib
from sglang_ssd.hooks import register_once

TARGET = "sglang.srt.layers.activation.SiluAndMul.forward_native"


def forward_native_hook(original, act, x, *args, **kwargs):
    entry = clib.silu_mul_entry() if not args and not kwargs else None
    out = entry(x) if entry is not None else None
    return out if out is not None else original(act, x, *args, **kwargs)


def register() -> None:
    register_once(TARGET, forward_native_hook)
