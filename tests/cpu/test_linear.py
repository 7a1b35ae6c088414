"""The small-M CPU linear route: batch invariance bit for bit, agreement with torch, safe fallbacks.

Batch invariance is the property that makes greedy speculation exact by construction on the
kernel's side: a row's output must not depend on how many other rows share the call or where the
row sits. Both C routes (AVX2+FMA where the CPU has it, and the portable one) are checked.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from sglang_ssd.cpu import clib
from sglang_ssd.cpu import linear as cpu_linear

ROOT = Path(__file__).resolve().parents[2]
KERNELS = cpu_linear.kernels()
KERNELS_BF16 = cpu_linear.kernels(bf16=True)
# Odd sizes on purpose: k tails (K % 8), partial register tiles (N % 4, N % 8), M across chunks.
# (1029, 13): rows longer than a page (the 8-row single-row path) with a k tail and leftover columns.
# (40, 112): whole panels in a short last group (the tiles write y directly); (64, 130): a cut-short
# last panel (through the scratch).
SHAPES = [(576, 960), (1536, 576), (1029, 13), (13, 7), (8, 9), (77, 33), (5, 1), (64, 130), (40, 112)]


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_the_kernel_builds_here():
    # gcc is on every machine this project supports; a missing kernel would silently mean torch.
    assert "portable" in KERNELS


def test_the_compiled_entry_builds_here_and_is_named():
    # g++ and torch's headers are there too; without the entry every call pays ~5 us of Python and ctypes.
    assert clib.entry() is not None
    if cpu_linear.route() != "torch":
        assert "compiled entry" in cpu_linear.describe()


@pytest.mark.parametrize("route", sorted(KERNELS))
@pytest.mark.parametrize("k,n", [(576, 960), (1029, 13), (77, 33), (64, 130)])
def test_the_compiled_entry_gives_the_ctypes_entrys_bits(route, k, n):
    # Same kernel behind both entries: every row count, bias or none, strided and 3-d rows, bf16 weights.
    g = torch.Generator().manual_seed(k + 3 * n)
    w, b = torch.randn(n, k, generator=g), torch.randn(n, generator=g)
    half = w.bfloat16()
    wide = torch.randn(3, 40, k + 5, generator=g)
    with cpu_linear.use_route(route):
        assert cpu_linear._state["fast"] is not None
        for weight in (w, half):
            cpu_linear.linear(wide[0, :1, :k], weight)  # packs it: later calls take the compiled entry
            for m in (1, 2, 5, 8, 9, 16, 17, 40):
                for x, bias in ((wide[0, :m, :k], b), (wide[:, : max(1, m // 3), 2 : k + 2], None)):
                    got = cpu_linear.linear(x, weight, bias)
                    with cpu_linear.ctypes_entry():
                        want = cpu_linear.linear(x, weight, bias)
                    assert got.shape == want.shape == (*x.shape[:-1], n)
                    assert torch.equal(got, want), (route, weight.dtype, m, x.shape)


@pytest.mark.parametrize("route", sorted(KERNELS))
@pytest.mark.parametrize("k,n", SHAPES)
def test_rows_are_bit_identical_whatever_the_batch(route, k, n):
    fn = KERNELS[route]
    g = torch.Generator().manual_seed(k * 1000 + n)
    w = torch.randn(n, k, generator=g)
    b = torch.randn(n, generator=g)
    x = torch.randn(40, k, generator=g)
    alone = torch.cat([cpu_linear.run(fn, x[i : i + 1], w, b) for i in range(40)])
    for m in list(range(1, 18)) + [23, 33, 40]:  # 17, 33: a lone row in a later 16-row chunk
        for start in (0, 40 - m):
            got = cpu_linear.run(fn, x[start : start + m], w, b)
            assert torch.equal(got, alone[start : start + m]), (route, k, n, m, start)


@pytest.mark.parametrize("route", sorted(KERNELS))
def test_non_contiguous_inputs_give_the_same_bits(route):
    fn = KERNELS[route]
    g = torch.Generator().manual_seed(1)
    w = torch.randn(48, 96, generator=g)
    wide = torch.randn(12, 200, generator=g)
    x = wide[:, 10:106]  # row-strided view
    xt = torch.randn(96, 12, generator=g).t()  # column-strided: copied first
    x3 = torch.randn(3, 4, 96, generator=g)[:, ::2]  # 3-d, strided batch
    for inp in (x, xt, x3):
        assert not inp.is_contiguous()
        got = cpu_linear.run(fn, inp, w, None)
        ref = torch.cat([cpu_linear.run(fn, r.contiguous().view(1, -1), w, None) for r in inp.reshape(-1, 96)])
        assert got.shape == (*inp.shape[:-1], 48)
        assert torch.equal(got.reshape(-1, 48), ref)


@pytest.mark.parametrize("route", sorted(KERNELS))
@pytest.mark.parametrize("k,n", SHAPES)
def test_agrees_with_torch_within_fp32_tolerance(route, k, n):
    g = torch.Generator().manual_seed(7)
    w = torch.randn(n, k, generator=g) / k**0.5
    b = torch.randn(n, generator=g)
    x = torch.randn(9, k, generator=g)
    got = cpu_linear.run(KERNELS[route], x, w, b)
    # Different summation order than MKL: agreement to a few ulps of the row's magnitude, not bits.
    torch.testing.assert_close(got, F.linear(x, w, b), rtol=1e-5, atol=1e-5 * k**0.5)


def test_linear_uses_the_kernel_for_small_fp32_batches():
    if cpu_linear.route() == "torch":
        pytest.skip(f"{clib.ENV}=torch in this environment")
    g = torch.Generator().manual_seed(3)
    w = torch.randn(20, 33, generator=g)
    x = torch.randn(5, 33, generator=g)
    fn = KERNELS[cpu_linear.route()]
    assert torch.equal(cpu_linear.linear(x, w), cpu_linear.run(fn, x, w, None))


@pytest.mark.parametrize(
    "case",
    ["bf16", "grad", "bias_grad", "many_rows", "threads", "broadcast_bias", "meta"],
)
@pytest.mark.parametrize("packed_first", [False, True])
def test_everything_else_falls_back_to_torch_exactly(case, packed_first):
    g = torch.Generator().manual_seed(4)
    w = torch.randn(16, 24, generator=g)
    x = torch.randn(3, 24, generator=g)
    b = None
    if case == "bf16":
        w, x = w.bfloat16(), x.bfloat16()
    elif case == "grad":
        x.requires_grad_(True)
    elif case == "bias_grad":
        b = torch.randn(16, generator=g, requires_grad=True)
    elif case == "many_rows":
        x = torch.randn(cpu_linear.MAX_ROWS + 1, 24, generator=g)
    elif case == "broadcast_bias":  # torch broadcasts a 1-element bias; the kernel would read past it
        b = torch.randn(1, generator=g)
    elif case == "meta":
        x, w = x.to("meta"), w.to("meta")
    if packed_first and case != "meta":  # packed: the compiled entry must hand each call back, not run it
        with torch.no_grad():
            cpu_linear.linear(torch.randn(2, 24, generator=g), w)
        assert cpu_linear.route() == "torch" or w._ssd_packed is not None
    if case == "threads":
        torch.set_num_threads(2)
    with torch.set_grad_enabled(case in ("grad", "bias_grad")):
        got = cpu_linear.linear(x, w, b)
        ref = F.linear(x, w, b)
    assert got.dtype == ref.dtype and got.device == ref.device and got.requires_grad == ref.requires_grad
    if case != "meta":
        assert torch.equal(got, ref)


@pytest.mark.parametrize("case, needle", [("fp16", "float16 rows"), ("threads", "2 torch threads")])
def test_a_kind_of_call_the_kernel_skips_is_named_once(case, needle, capsys, monkeypatch):
    # A server started in fp16 or on several threads used to log the kernel route and then never call it.
    monkeypatch.setitem(cpu_linear._state, "skipped", set())
    w, x = torch.randn(16, 24), torch.randn(3, 24)
    if case == "fp16":
        w, x = w.half(), x.half()
    else:
        torch.set_num_threads(2)
    try:
        for _ in range(3):
            cpu_linear.linear(x, w)
    finally:
        torch.set_num_threads(1)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if "kernel skipped" in ln]
    assert len(lines) == 1 and needle in lines[0]


def test_tensors_off_the_cpu_never_decide_the_route():
    # A GPU install must not build or load the kernel: the route is decided only by a CPU call.
    code = (
        "import torch; from sglang_ssd.cpu import linear as L, clib as N; "
        "L.linear(torch.zeros(2, 8, device='meta'), torch.zeros(4, 8, device='meta')); "
        "print('route' in L._state or 'route' in N._state or 'lib' in N._state)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
    assert "CPU linear route" not in done.stderr


def _route_in_child(value: str) -> subprocess.CompletedProcess:
    env = {**os.environ, clib.ENV: value, "PYTHONPATH": str(ROOT)}
    code = "from sglang_ssd.cpu import linear; print(linear.route())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_off_switch_and_bad_value():
    assert _route_in_child("torch").stdout.strip() == "torch"
    assert _route_in_child("portable").stdout.strip() == "portable"
    bad = _route_in_child("fastest")
    assert bad.returncode != 0
    assert "SGLANG_SSD_CPU_LINEAR='fastest': expected one of auto, torch, portable" in bad.stderr


def test_sglang_hooks_send_cpu_linears_and_the_head_to_the_route():
    from types import SimpleNamespace

    from sglang_ssd.cpu import linear_hooks

    g = torch.Generator().manual_seed(5)
    w = torch.randn(24, 16, generator=g)
    x = torch.randn(3, 16, generator=g)

    def original(*args, **kwargs):
        return "sglang's own"

    want = cpu_linear.linear(x, w)
    layer = SimpleNamespace(weight=w)
    assert torch.equal(linear_hooks.linear_apply_hook(original, None, layer, x), want)
    amx = SimpleNamespace(weight=w, use_intel_amx_backend=True)
    assert linear_hooks.linear_apply_hook(original, None, amx, x) == "sglang's own"

    processor = SimpleNamespace(rl_on_policy_target=None)
    head = SimpleNamespace(weight=w, quant_method=None)
    assert torch.equal(linear_hooks.lm_head_hook(original, processor, x, head), want)
    tied = SimpleNamespace(weight=w, quant_method=type("UnquantizedEmbeddingMethod", (), {})())
    assert torch.equal(linear_hooks.lm_head_hook(original, processor, x, tied), want)
    quantized = SimpleNamespace(weight=w, quant_method=type("Fp8LinearMethod", (), {})())
    assert linear_hooks.lm_head_hook(original, processor, x, quantized) == "sglang's own"
    amx_head = SimpleNamespace(weight=w, quant_method=None, use_intel_amx_backend=True)
    assert linear_hooks.lm_head_hook(original, processor, x, amx_head) == "sglang's own"
    bf16_head = SimpleNamespace(weight=w.bfloat16(), quant_method=None)
    assert linear_hooks.lm_head_hook(original, processor, x, bf16_head) == "sglang's own"
    bias = torch.zeros(24)
    assert linear_hooks.lm_head_hook(original, processor, x, head, bias) == "sglang's own"
    lora = SimpleNamespace(weight=w, quant_method=None, set_lora=None)
    assert linear_hooks.lm_head_hook(original, processor, x, lora) == "sglang's own"


@pytest.mark.parametrize("route", sorted(KERNELS))
@pytest.mark.parametrize("k,n", [(576, 960), (1536, 576), (77, 33), (13, 7)])
def test_bf16_weights_give_the_fp32_kernels_bits_on_the_widened_weight(route, k, n):
    # The bf16 build widens each weight exactly and runs the same chain: every row count, with the
    # AVX-512 tiles and without, must match the fp32 kernel on weight.float() bit for bit.
    g = torch.Generator().manual_seed(k * 7 + n)
    w16 = torch.randn(n, k, generator=g).bfloat16()
    b, x = torch.randn(n, generator=g), torch.randn(70, k, generator=g)
    w32 = w16.float()
    tiles = (True, False) if route == "avx2" and clib.avx512_tiles() else (clib.avx512_tiles(),)
    try:
        for wide in tiles:
            clib.avx512_tiles(wide)
            for m in list(range(1, 18)) + [23, 40, 64]:
                got = cpu_linear.run(KERNELS_BF16[route], x[:m], w16, b)
                assert torch.equal(got, cpu_linear.run(KERNELS[route], x[:m], w32, b)), (route, wide, m)
    finally:
        clib.avx512_tiles(True)


def test_compact_stores_exact_bf16_weights_and_linear_gives_the_same_bits():
    g = torch.Generator().manual_seed(8)
    exact = torch.randn(40, 64, generator=g).bfloat16().float()
    inexact = torch.randn(40, 64, generator=g)
    x = torch.randn(3, 64, generator=g)
    small = cpu_linear.compact(exact)
    if cpu_linear.route() == "torch":
        assert small is exact  # torch cannot take a bf16 weight with fp32 rows: nothing to gain
        return
    assert small.dtype is torch.bfloat16 and torch.equal(small.float(), exact)
    assert cpu_linear.compact(inexact) is inexact  # a weight bf16 cannot hold stays as it is
    assert torch.equal(cpu_linear.linear(x, small), cpu_linear.linear(x, exact))
    # Past the kernel's row limit, and on the torch route, the widened weight goes to torch.
    many = torch.randn(cpu_linear.MAX_ROWS + 1, 64, generator=g)
    assert torch.equal(cpu_linear.linear(many, small), F.linear(many, exact))
    with cpu_linear.use_route("torch"):
        assert torch.equal(cpu_linear.linear(x, small), F.linear(x, exact))


def test_use_route_switches_and_restores():
    g = torch.Generator().manual_seed(6)
    w = torch.randn(20, 40, generator=g)
    x = torch.randn(4, 40, generator=g)
    before = cpu_linear.linear(x, w)
    with cpu_linear.use_route("torch"):
        assert torch.equal(cpu_linear.linear(x, w), F.linear(x, w))
    with cpu_linear.use_route("portable"):
        assert torch.equal(cpu_linear.linear(x, w), cpu_linear.run(KERNELS["portable"], x, w, None))
    assert torch.equal(cpu_linear.linear(x, w), before)


def test_a_weight_changed_in_place_is_packed_again():
    # The kernel reads a packed copy kept on the weight; a weight update (in place, or a new storage)
    # must not leave it computing with the old values.
    if cpu_linear.route() == "torch":
        pytest.skip(f"{clib.ENV}=torch in this environment")
    g = torch.Generator().manual_seed(5)
    w = torch.randn(40, 24, generator=g)
    x = torch.randn(3, 24, generator=g)
    first = cpu_linear.linear(x, w)
    w.mul_(2.0)
    torch.testing.assert_close(cpu_linear.linear(x, w), 2 * first)
    w.data = torch.randn(40, 24, generator=g)
    torch.testing.assert_close(cpu_linear.linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)


def _vma_flags(addr: int) -> list[str]:
    """VmFlags of the mapping that holds ``addr`` in this process (Linux ``/proc/self/smaps``)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    for i, line in enumerate(lines):
        head = line.split()[0]
        if "-" in head and all(c in "0123456789abcdef-" for c in head):
            lo, hi = (int(v, 16) for v in head.split("-"))
            if lo <= addr < hi:
                flags = next(ln for ln in lines[i + 1 :] if ln.startswith("VmFlags:"))
                return flags.split()[1:]
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_packed_weights_share_2mb_aligned_mappings_asked_for_on_huge_pages():
    # Small weights go back to back into one mapping (576 x 576 fp32 is under 2 MB), page-aligned and
    # not overlapping; the mapping starts on a 2 MB boundary and carries MADV_HUGEPAGE ("hg").
    arena = cpu_linear._Arena()
    bufs = [arena.take(n * 576, torch.float32) for n in (576, 960, 40)] + [arena.take(1000, torch.bfloat16)]
    spans = [(b.data_ptr(), b.data_ptr() + b.numel() * b.element_size()) for b in bufs]
    assert spans[0][0] % (2 << 20) == 0 and all(lo % 4096 == 0 for lo, _ in spans)
    assert all(a_hi <= b_lo < a_hi + 4096 for (_, a_hi), (b_lo, _) in zip(spans, spans[1:]))  # back to back
    big = arena.take(80 << 20 >> 2, torch.float32)  # larger than a mapping: one of its own
    assert big.data_ptr() % (2 << 20) == 0 and big.numel() == 80 << 20 >> 2
    w = torch.randn(576, 576)
    x = torch.randn(2, 576)
    torch.testing.assert_close(cpu_linear.linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-4)
    if Path("/proc/self/smaps").exists() and hasattr(__import__("mmap"), "MADV_HUGEPAGE"):
        assert all("hg" in _vma_flags(lo) for lo, _ in [*spans, (big.data_ptr(), 0)])
        assert "hg" in _vma_flags(cpu_linear.packed(w).ptr)  # the route packs into such memory


@pytest.mark.skipif("avx2" not in KERNELS or not clib.avx512_tiles(), reason="no AVX-512F on this CPU")
@pytest.mark.parametrize("k,n", [(576, 960), (1536, 576), (64, 130), (77, 200)])
def test_avx512_tiles_give_the_avx2_tiles_bits(k, n):
    # The AVX-512 tiles run the same FMA chain per element: switching them must not move a bit, for
    # every row count (2-6 row tiles, their splits above 6, and the chunks above 64).
    fn = KERNELS["avx2"]
    g = torch.Generator().manual_seed(k + n)
    w, b, x = torch.randn(n, k, generator=g), torch.randn(n, generator=g), torch.randn(70, k, generator=g)
    try:
        for m in list(range(1, 18)) + [23, 40, 64]:
            assert clib.avx512_tiles(True)
            wide = cpu_linear.run(fn, x[:m], w, b)
            assert not clib.avx512_tiles(False)
            assert torch.equal(wide, cpu_linear.run(fn, x[:m], w, b)), (k, n, m)
    finally:
        clib.avx512_tiles(True)


@pytest.mark.parametrize("entry", ["compiled", "ctypes"])
def test_each_product_learns_the_one_that_follows_it(entry, monkeypatch):
    # A forward runs its linears in a fixed order; each weight's plan points the kernel's prefetch at
    # the weight that ran after it last time, and a new order replaces the old guess. Both entries
    # keep that chain (a weight's first call always goes through Python, later ones through C++).
    cpu_linear.route()
    monkeypatch.setitem(cpu_linear._state, "fast", cpu_linear._state["fast"])  # restored afterwards
    if entry == "ctypes":
        monkeypatch.setitem(clib._state, "entry", None)
    g = torch.Generator().manual_seed(7)
    a, b, c = (torch.randn(96, 64, generator=g) for _ in range(3))
    x = torch.randn(8, 64, generator=g)
    with cpu_linear.use_route("portable"):
        assert (cpu_linear._state["fast"] is None) == (entry == "ctypes")
        for w in (a, b, c, a, b):
            cpu_linear.linear(x, w)
        pa, pb, pc = (cpu_linear.packed(w) for w in (a, b, c))
        assert (pa.next_ptr, pb.next_ptr, pc.next_ptr) == (pb.ptr, pc.ptr, pa.ptr)
        assert pa.next_bytes == pb.lead_bytes > 0
        cpu_linear.linear(x, a)
        cpu_linear.linear(x, c)  # b is now followed by a, a by c
        assert (pb.next_ptr, pa.next_ptr) == (pa.ptr, pc.ptr)


@pytest.mark.parametrize("route", sorted(KERNELS))
@pytest.mark.parametrize("m", [1, 5, 6, 9, 16])
def test_a_wrong_or_unmapped_successor_changes_nothing(route, m):
    # The successor is only prefetched: a stale pointer (freed memory, an unmapped page) must neither
    # fault nor change a bit, whatever the row count (the stream runs from 6 rows on).
    fn = KERNELS[route]
    g = torch.Generator().manual_seed(m)
    w, x, bias = torch.randn(200, 96, generator=g), torch.randn(m, 96, generator=g), torch.randn(200, generator=g)
    plan = cpu_linear.packed(w)
    want = torch.empty(m, 200)
    fn(x.data_ptr(), 96, plan.ptr, bias.data_ptr(), want.data_ptr(), 200, m, 200, 96, None, 0)
    for stale in (4096, 1 << 46, plan.ptr):  # page 1 (never mapped), far beyond any mapping, itself
        got = torch.empty(m, 200)
        fn(x.data_ptr(), 96, plan.ptr, bias.data_ptr(), got.data_ptr(), 200, m, 200, 96, stale, 1 << 20)
        assert torch.equal(got, want), (route, m, stale)
    assert torch.allclose(want, F.linear(x, w, bias), rtol=1e-5, atol=1e-4)
