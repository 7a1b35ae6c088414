"""SGLang's native RMSNorm (with its residual add) on the CPU in one C call (``csrc/rmsnorm.c``).

On a plain CPU SGLang runs ``RMSNorm.forward_native``: about seven small torch ops per norm, two norms
per layer, a tenth of a decode step of the 135M target (py-spy, in the server). The C kernel performs
torch's rounded operations in torch's order, including the order in which torch sums a row, so the
output and the new residual are bit-identical to the native path's (``tests/cpu/test_rmsnorm.py``): the
served model does not change, only the time it takes.

torch's row sum depends on its vector width, which is a property of the torch build and the CPU. So
the first call per hidden size checks the kernel against SGLang's own code on 64 random rows with a
residual, for each width torch may use, and takes the width whose bits agree; if none does, that size
stays on SGLang's code (said once in the log). A wrong width agrees with torch on some rows by chance,
never on 64.

An AROUND hook on ``forward_native``; the kernel runs where it applies (fp32 CPU rows and weight, no
variance-size override, no post-residual addition) and SGLang's code runs everywhere else. Same switch
as the linear route: ``SGLANG_SSD_CPU_LINEAR=torch`` turns it off.
"""

from __future__ import annotations

import os
import sys

import torch

from sglang_ssd.cpu import clib
from sglang_ssd.hooks import register_once

TARGET = "sglang.srt.layers.layernorm.RMSNorm.forward_native"
# torch's Vectorized<float> width: 8 lanes on AVX2 builds, 16 on AVX-512 ones
LANES = (8, 16)
PROBE_ROWS = 64

_lanes: dict[int, int] = {}  # hidden size -> lanes whose bits agree with torch (0: none, use torch)
_F32 = torch.float32


def static_ok(norm) -> bool:
    """What about ``norm`` lets the kernel stand in for it (checked once per module)."""
    ok = norm.__dict__.get("_ssd_rmsnorm_ok")
    if ok is None:
        ok = norm.__dict__["_ssd_rmsnorm_ok"] = (
            norm.variance_size_override is None and norm.override_orig_dtype in (None, _F32)
        )
    return ok


def applies(norm, x: torch.Tensor, residual: torch.Tensor | None) -> bool:
    """Whether the kernel computes what ``norm.forward_native(x, residual)`` would, for this call."""
    w = norm.weight  # may be replaced by a weight reload: checked per call
    return (
        static_ok(norm) and x.is_cpu and x.dtype is _F32 and x.dim() >= 1 and x.shape[-1] == norm.hidden_size
        and w.is_cpu and w.dtype is _F32 and w.dim() == 1 and w.is_contiguous()
        and (residual is None or (residual.is_cpu and residual.dtype is _F32 and residual.shape == x.shape))
    )  # fmt: skip


def run(fn, norm, x: torch.Tensor, residual: torch.Tensor | None, lanes: int):
    """One C call: the normalized rows (and the new residual, x + residual) as new tensors."""
    n = x.shape[-1]
    x2, ldx = clib.rows_of(x)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if residual is None:
        r_ptr = ldr = res_ptr = 0
    else:
        r2, ldr = clib.rows_of(residual)
        res_out = torch.empty_like(out)
        r_ptr, res_ptr = r2.data_ptr(), res_out.data_ptr()
    rc = fn(x2.data_ptr(), ldx, r_ptr, ldr, norm.weight.data_ptr(), norm.variance_epsilon, out.data_ptr(), res_ptr,
            x.numel() // n, n, lanes)  # fmt: skip
    if rc != 0:
        raise ValueError(f"ssd_rmsnorm refused lanes={lanes}")
    return out if residual is None else (out, res_out)


def lanes_for(original, norm, fn) -> int:
    """The vector width whose sums are torch's for this hidden size, checked on random rows; 0 if none."""
    n = norm.hidden_size
    if n not in _lanes:
        g = torch.Generator().manual_seed(n)
        x = torch.randn(PROBE_ROWS, n, generator=g) * torch.logspace(-2, 2, PROBE_ROWS)[:, None]
        res = torch.randn(PROBE_ROWS, n, generator=g)
        want = original(norm, x, res, None)
        _lanes[n] = next((lanes for lanes in LANES
                          if all(torch.equal(a, b) for a, b in zip(run(fn, norm, x, res, lanes), want))), 0)  # fmt: skip
        if _lanes[n]:
            print(f"sglang_ssd: C RMSNorm at hidden size {n} (torch's row sums in {_lanes[n]} lanes, pid "
                  f"{os.getpid()})", file=sys.stderr, flush=True)  # fmt: skip
        else:
            print(f"sglang_ssd: C RMSNorm does not reproduce this torch's sums at hidden size {n}; SGLang's "
                  f"native RMSNorm runs (pid {os.getpid()})", file=sys.stderr, flush=True)  # fmt: skip
    return _lanes[n]


def forward_native_hook(original, norm, x, residual=None, post_residual_addition=None, *args, **kwargs):
    fn = clib.rmsnorm_kernel() if post_residual_addition is None else None
    if fn is None or not applies(norm, x, residual):
        return original(norm, x, residual, post_residual_addition, *args, **kwargs)
    lanes = _lanes.get(norm.hidden_size) or lanes_for(original, norm, fn)
    if not lanes:
        return original(norm, x, residual, post_residual_addition, *args, **kwargs)
    return run(fn, norm, x, residual, lanes)


def register() -> None:
    register_once(TARGET, forward_native_hook)
