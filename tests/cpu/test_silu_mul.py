"""SiLU-and-mul through the compiled entry (`cpu/silu_mul.py`) against the expression of SGLang's
`SiluAndMul.forward_native`: the same two ATen calls on the same views, so the same bits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sglang_ssd.cpu import clib, silu_mul

pytestmark = pytest.mark.skipif(clib.silu_mul_entry() is None, reason="the compiled entry is not built here")


def native(act, x):
    """SGLang 0.5's `SiluAndMul.forward_native`, as written there."""
    d = x.shape[-1] // 2
    return F.silu(x[..., :d]) * x[..., d:]


def test_the_entry_gives_the_native_paths_bits():
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(7, 3072 + 10, generator=g)
    for x in (
        torch.randn(1, 3072, generator=g),  # a decode step's row
        torch.randn(5, 3072, generator=g) * 8,  # a verify's rows, large enough to saturate the sigmoid
        torch.randn(16, 3072, generator=g),
        torch.randn(2, 3, 64, generator=g),  # leading dimensions kept
        wide[:, :3072],  # a row-strided view
        torch.randn(3, 3072, generator=g, dtype=torch.float64),
    ):
        want = native(None, x)
        got = silu_mul.forward_native_hook(native, None, x)
        assert got.shape == want.shape and got.dtype == want.dtype and torch.equal(got, want)
    # a row's result does not depend on the other rows of the call (decode vs verify)
    x = torch.randn(5, 3072, generator=g)
    one, all_rows = silu_mul.forward_native_hook(native, None, x[2:3]), silu_mul.forward_native_hook(native, None, x)
    assert torch.equal(one[0], all_rows[2])


def test_what_the_entry_does_not_take_goes_to_sglangs_code():
    calls = []

    def original(*args, **kwargs):
        calls.append(args)
        return "native"

    assert clib.silu_mul_entry()(torch.randn(2, 5)) is None  # an odd width: not two halves
    assert silu_mul.forward_native_hook(original, None, torch.randn(2, 5)) == "native"
    assert silu_mul.forward_native_hook(original, None, torch.randn(2, 6), "extra") == "native"
    assert len(calls) == 2
