"""The C RMSNorm (`cpu/rmsnorm.py`) against SGLang's own `RMSNorm.forward_native`, bit for bit.

SGLang's layer modules import only with the CPU engine's stand-ins (`SGLANG_USE_CPU_ENGINE=1`), so
the checks run in one child process, each printing `<name>: ok`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from sglang_ssd.cpu import clib, rmsnorm

ROOT = Path(__file__).resolve().parents[2]
CHECKS = ("bits", "widths", "options", "rows", "fallback", "no width")

pytestmark = pytest.mark.skipif(clib.rmsnorm_kernel() is None, reason="the C kernels are not built here")


def _norm(n: int, **kw):
    from sglang.srt.layers.layernorm import RMSNorm

    norm = RMSNorm(n, eps=1e-5, **kw)
    if norm.has_weight:
        norm.weight.data.copy_(torch.randn(n, generator=torch.Generator().manual_seed(n)) * 0.3 + 1)
    return norm


def _native():
    from sglang.srt.layers.layernorm import RMSNorm

    return RMSNorm.forward_native


def _same(a, b) -> bool:
    a, b = (a if isinstance(a, tuple) else (a,)), (b if isinstance(b, tuple) else (b,))
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


def _hook(norm, *args):
    return rmsnorm.forward_native_hook(_native(), norm, *args)


def cpu_engine_checks() -> None:
    g = torch.Generator().manual_seed(1)
    # bits: norm and new residual equal SGLang's, for widths with and without a vector tail, and the
    # kernel ran (a width was found), not SGLang's code behind the hook
    for n in (576, 1536, 64, 100, 17, 8192):
        norm = _norm(n)
        for rows in (1, 2, 5, 12, 70):
            x, res = torch.randn(rows, n, generator=g) * 4, torch.randn(rows, n, generator=g) * 10
            for residual in (None, res):
                assert _same(_hook(norm, x, residual), _native()(norm, x, residual)), (n, rows)
        assert rmsnorm._lanes[n] in rmsnorm.LANES, rmsnorm._lanes
    print("bits: ok")
    # widths: only the width found reproduces torch on a 64-row probe (the check that guards the kernel)
    norm, fn = _norm(576), clib.rmsnorm_kernel()
    x, res = torch.randn(64, 576, generator=g), torch.randn(64, 576, generator=g)
    found = rmsnorm.lanes_for(_native(), norm, fn)
    for lanes in rmsnorm.LANES:
        assert _same(rmsnorm.run(fn, norm, x, res, lanes), _native()(norm, x, res)) == (lanes == found)
    print("widths: ok")
    # options: a row-strided slice, weight * x order, fp32 residual, no weight
    x = torch.randn(6, 3 * 576, generator=g)[:, 576 : 2 * 576]
    res = torch.randn(6, 576, generator=g)
    for kw in ({}, {"cast_x_before_out_mul": True}, {"fp32_residual": True}, {"has_weight": False}):
        norm = _norm(576, **kw)
        assert _same(_hook(norm, x, res), _native()(norm, x, res)), kw
    print("options: ok")
    # rows: a row's result is the same alone and inside a batch (decode step vs verify)
    norm = _norm(576)
    x, res = torch.randn(9, 576, generator=g), torch.randn(9, 576, generator=g)
    batch, alone = _hook(norm, x, res), _hook(norm, x[4:5], res[4:5])
    assert torch.equal(batch[0][4], alone[0][0]) and torch.equal(batch[1][4], alone[1][0])
    print("rows: ok")
    # fallback: what the kernel does not take goes to SGLang's code
    calls = []

    def original(norm, x, residual=None, post=None, *args):
        calls.append(x.dtype)
        return _native()(norm, x, residual, post, *args)

    norm = _norm(64)
    x = torch.randn(3, 64, generator=g)
    rmsnorm.forward_native_hook(original, norm, x.to(torch.bfloat16))
    rmsnorm.forward_native_hook(original, norm, x, torch.randn(3, 64, generator=g), torch.ones(3, 64))
    assert calls == [torch.bfloat16, torch.float32], calls
    print("fallback: ok")
    # no width: where no width reproduces torch, SGLang's norm runs
    rmsnorm.LANES, rmsnorm._lanes = (3,), {}
    norm = _norm(576)
    x, res = torch.randn(4, 576, generator=g), torch.randn(4, 576, generator=g)
    assert _same(_hook(norm, x, res), _native()(norm, x, res)) and rmsnorm._lanes[576] == 0
    print("no width: ok")


@pytest.mark.slow  # ~10 s: the child imports SGLang's layer modules
def test_c_rmsnorm_gives_sglangs_bits():
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
    code = (
        "import torch; torch.set_num_threads(1); torch.set_grad_enabled(False)\n"
        "from sglang_ssd.cpu.stand_ins import install; install()\n"
        "from tests.cpu.test_rmsnorm import cpu_engine_checks; cpu_engine_checks()\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    for name in CHECKS:
        assert f"{name}: ok" in proc.stdout, proc.stdout


def test_the_hook_applies_only_to_plain_fp32_norms():
    from types import SimpleNamespace

    def norm(**kw):
        base = {"hidden_size": 8, "variance_size_override": None, "override_orig_dtype": None, "weight": torch.ones(8)}
        return SimpleNamespace(**{**base, **kw})

    x = torch.randn(2, 8)
    assert rmsnorm.applies(norm(), x, None) and rmsnorm.applies(norm(), x, torch.randn(2, 8))
    assert not rmsnorm.applies(norm(), x.half(), None)
    assert not rmsnorm.applies(norm(), x, torch.randn(1, 8))  # a broadcast residual
    assert not rmsnorm.applies(norm(variance_size_override=4), x, None)
    assert not rmsnorm.applies(norm(override_orig_dtype=torch.bfloat16), x, None)
    assert not rmsnorm.applies(norm(weight=torch.ones(8).half()), x, None)
