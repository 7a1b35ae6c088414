"""Small-M CPU linear route: weight-stationary and batch-invariant (``csrc/linear.c``).

A decode step and a K+1-token verify both read every weight once; torch's fp32 GEMM on AVX2 CPUs
costs 1.3–3× more at M = 4–16 rows than at M = 1, and even its M = 1 product is far below the
machine's read bandwidth. The kernel here reads each weight row once per call, reuses it for all
rows, and reduces every output element in one fixed order, so row r of an M-row call is
bit-identical to the same row computed alone.

The route (``avx2``, ``portable`` or ``torch``, from ``SGLANG_SSD_CPU_LINEAR``) and the library that
holds the kernel are ``clib.py``'s, shared with the other C kernels.

The kernel takes fp32 CPU rows with up to ``MAX_ROWS`` rows, fp32 or bf16 weights, a single intra-op
thread (it is single-threaded; with more torch threads torch is used), and no autograd. Anything else
goes to torch, so the route is always safe to call. A bf16 weight is widened to fp32 exactly inside the
kernel: the result is the fp32 kernel's on the widened weight, bit for bit, for half the bytes read.
``compact`` stores a weight as bf16 where that loses nothing (the draft's weights are trained and
shipped in bf16), which is how the draft runner halves its weight stream. Bit-identity between a decode step and a verify step
therefore holds while both batches have at most ``MAX_ROWS`` rows (e.g. 12 requests x 5 tokens).

``python -m sglang_ssd.cpu.linear --build`` builds the library and the compiled entry (``make install``
runs it) and says which route this machine takes.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import subprocess
import sys
import threading

import torch
import torch.nn.functional as F

from . import clib

# Above this many rows (prefill) torch's blocked GEMM is the better tool, and batch invariance
# between decode and verify needs only the small sizes.
MAX_ROWS = 64

_lock = threading.Lock()
_state: dict = {}  # this route's kernels and the compiled entry's linear, decided at the first CPU call
_UNRESOLVED = object()
_F32 = torch.float32
_BF16 = torch.bfloat16


def _resolve() -> tuple[str, object | None]:
    """(route name, C function or None) for this process; decided once."""
    with _lock:
        if "route" in _state:
            return _state["route"], _state["fn"]
        route = clib.route()
        _state["fn"] = kernels().get(route) if route != "torch" else None
        _state["fn_bf16"] = kernels(bf16=True).get(route) if route != "torch" else None
        _state["route"] = route
        _hand_to_entry()
        return route, _state["fn"]


def _hand_to_entry() -> None:
    """Give the compiled entry the kernels ``linear`` runs now (none on the torch route)."""
    entry = clib.entry(load=_state["fn"] is not None)
    if entry is not None:
        entry.set_kernels(clib.address(_state["fn"]), clib.address(_state["fn_bf16"]), MAX_ROWS)
    _state["fast"] = entry.linear if entry is not None and _state["fn"] is not None else None


def route() -> str:
    """'avx2', 'portable' or 'torch': what ``linear`` runs for the calls the kernel takes."""
    return _resolve()[0]


def describe() -> str:
    r = route()
    if r == "torch":
        return "torch F.linear (kernel off)"
    tiles = " (AVX-512 tiles from 2 rows)" if r == "avx2" and clib.avx512_tiles() else ""
    entry = "compiled entry" if clib.entry() is not None else "ctypes entry"
    return f"sglang_ssd {r} kernel{tiles}, {entry}, for fp32 rows <= {MAX_ROWS} at 1 thread, torch otherwise"


def compact(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` stored as bf16 when every value is exactly a bf16 and the C route is on (the kernel
    widens it back exactly: same results, half the bytes streamed); otherwise ``weight`` itself."""
    if not weight.is_cpu or weight.dtype is not _F32 or weight.dim() != 2 or route() == "torch":
        return weight
    half = weight.to(_BF16)
    return half if torch.equal(half.float(), weight) else weight


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)``; through the kernel when the route and the inputs allow.

    This sits on every layer of every step. A weight that has been packed goes straight to the
    compiled entry (``csrc/entry.cpp``: about 1 us a call against 5 us through Python and ctypes),
    which makes the checks below and runs the kernel, or hands the call back. Everything else takes
    the Python checks, ordered cheapest-first. Tensors off the CPU are never packed and return before
    the route is even decided: a GPU run never builds or loads the kernel.
    """
    fast = _state.get("fast")
    if fast is not None:
        plan = getattr(weight, "_ssd_packed", None)
        if plan is not None:
            y = fast(x, weight, bias, plan.meta)
            if y is not None:
                return y
    # Everything else: the first call of a weight, calls the kernel does not take, and no compiled entry.
    if not x.is_cpu:
        return F.linear(x, weight, bias)
    if x.dtype is not _F32 or (weight.dtype is not _F32 and weight.dtype is not _BF16):
        _skipped(f"{str(x.dtype).removeprefix('torch.')} rows with {str(weight.dtype).removeprefix('torch.')} "
                 "weights (it takes fp32 rows; serve with --dtype float32)")  # fmt: skip
        if x.dtype != weight.dtype and x.is_floating_point() and weight.is_floating_point():
            x = x.to(weight.dtype)  # torch refuses mixed dtypes: the rows take the model's (the weight's)
        return F.linear(x, weight, bias)
    fn = _state.get("fn", _UNRESOLVED)
    if fn is _UNRESOLVED:
        fn = _resolve()[1]
    if weight.dtype is _BF16:  # a compact weight (see `compact`); torch needs it widened
        fn = _state["fn_bf16"]
        if fn is None:
            return F.linear(x, weight.float(), bias)
    if fn is None:
        return F.linear(x, weight, bias)
    k = weight.shape[-1]
    rows = x.numel() // k if k else 0
    if (
        rows == 0
        or rows > MAX_ROWS
        or x.shape[-1] != k
        or weight.dim() != 2
        or not weight.is_cpu
        or not weight.is_contiguous()
        or (bias is not None and (bias.dtype is not _F32 or not bias.is_cpu or bias.shape != weight.shape[:1]
                                  or not bias.is_contiguous()))
        or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                         or (bias is not None and bias.requires_grad)))
    ):  # fmt: skip
        return F.linear(x, weight if weight.dtype is _F32 else weight.float(), bias)
    if torch.get_num_threads() != 1:
        _skipped(f"{torch.get_num_threads()} torch threads (it runs on one; set OMP_NUM_THREADS=1)")
        return F.linear(x, weight if weight.dtype is _F32 else weight.float(), bias)
    return run(fn, x, weight, bias)


def _skipped(reason: str) -> None:
    """Say once per process and reason that the kernel route is on but a kind of call goes to torch
    (the route's start-up line alone would claim the kernel for a server that never calls it)."""
    seen = _state.setdefault("skipped", set())
    if reason in seen:
        return
    seen.add(reason)
    if route() != "torch":
        print(f"sglang_ssd: CPU linear kernel skipped for {reason}; torch F.linear runs these calls (pid "
              f"{os.getpid()})", file=sys.stderr, flush=True)  # fmt: skip


def run(fn, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Call one C route (``kernels(bf16)[name]``, bf16 = the weight's dtype) on checked inputs; rows may
    have any stride."""
    n_out, k = weight.shape
    x2, ld = clib.rows_of(x)
    rows = x2.shape[0]
    plan = packed(weight)
    _follows(plan)
    # sizes as separate ints: torch parses them faster than a tuple (this runs for every linear call)
    y = torch.empty(rows, n_out, dtype=_F32) if x.dim() == 2 else torch.empty(*x.shape[:-1], n_out, dtype=_F32)
    fn(x2.data_ptr(), ld, plan.ptr, 0 if bias is None else bias.data_ptr(), y.data_ptr(), n_out, rows, n_out, k,
       plan.next_ptr, plan.next_bytes)  # fmt: skip
    return y


class Packed:
    """A weight in the kernel's layout (``csrc/linear.c``), and the product that ran after it last time.

    A forward runs its linears in the same order every step, so the weight that followed this one last
    time will follow it again: the kernel prefetches that weight's first panels while it computes this
    product (from 6 rows on, where the arithmetic leaves the memory bus idle). In one interleaved run,
    qkv, o and gate_up were 3-20 % faster at M = 6-12, down and the head unchanged within the spread
    (bench/results/kernel_ab/next.txt). A wrong guess costs only bandwidth: a prefetch never faults,
    even on memory that has since been freed.
    """

    __slots__ = ("key", "wp", "ptr", "lead_bytes", "meta", "_view")
    # Slots of ``meta`` that change (the rest mirrors key, ptr, lead_bytes); the layout's one
    # description is the Meta enum of csrc/entry.cpp.
    _NEXT_PTR, _NEXT_BYTES = 4, 5

    def __init__(self, key: tuple, wp: torch.Tensor, lead_bytes: int):
        self.key, self.wp, self.ptr, self.lead_bytes = key, wp, wp.data_ptr(), lead_bytes
        # What the compiled entry reads and updates (layout in csrc/entry.cpp); the successor lives
        # only here, so both entries keep one chain.
        self.meta = torch.tensor([*key, self.ptr, lead_bytes, 0, 0], dtype=torch.int64)
        self._view = self.meta.numpy()

    @property
    def next_ptr(self) -> int:
        return int(self._view[self._NEXT_PTR])

    @property
    def next_bytes(self) -> int:
        return int(self._view[self._NEXT_BYTES])

    def set_next(self, ptr: int, nbytes: int) -> None:
        self._view[self._NEXT_PTR], self._view[self._NEXT_BYTES] = ptr, nbytes


_chain = threading.local()  # per thread: the Packed of the product this thread ran last


def _follows(plan: Packed) -> None:
    """Record ``plan`` as the successor of the product this thread ran before it."""
    entry = clib.entry(load=False)
    if entry is not None:  # its chain, so that calls through either entry keep one order
        entry.follows(plan.meta)
        return
    prev = getattr(_chain, "last", None)
    if prev is not None and prev.next_ptr != plan.ptr:
        prev.set_next(plan.ptr, plan.lead_bytes)
    _chain.last = plan


def _version(t: torch.Tensor) -> int:
    try:
        return t._version
    except RuntimeError:  # an inference tensor has no version counter (and cannot be changed in place)
        return -1


_HUGE = 2 << 20
_ARENA_BYTES = 64 << 20  # one mapping holds many packed weights (all of a small model's small ones)
_ALIGN = 4096


class _Arena:
    """Packed weights, back to back in anonymous mappings on 2 MB pages where the kernel allows them
    (transparent huge pages in ``madvise`` mode). Each 4 KB page of a weight stream costs a TLB miss
    (a two-level walk under a hypervisor) and the hardware prefetcher stops at every 4 KB boundary:
    in one interleaved ``bench/kernel_ab.sh`` run the same kernel on 2 MB pages took 0.70-0.73x the
    time at M = 6-10 and 0.88-0.94x at M = 1 (``bench/NOTEBOOK.md``). Sharing mappings puts the weights
    under 2 MB (576 x 576 fp32 is 1.3 MB) on large pages too, without a partly used page each. A
    whole forward gains little from those (``bench/page_size_ab.py``: the same 0.95-0.98x of all-4 KB
    with or without them); one shape streamed on its own, as the draft server's steps and the
    per-linear benchmark run it, gains the full amount.

    A mapping is freed when the last weight carved from it is (each view holds it), so repacking a
    whole model releases the old copies; the current mapping's unused tail is never touched, so it
    costs address space, not memory."""

    def __init__(self) -> None:
        self.region: torch.Tensor | None = None  # the current mapping's 2 MB-aligned bytes
        self.used = 0
        self.lock = threading.Lock()

    def take(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        nbytes = numel * torch.empty((), dtype=dtype).element_size()
        with self.lock:
            if self.region is None or self.used + nbytes > self.region.numel():
                self.region, self.used = huge_page_bytes(max(nbytes, _ARENA_BYTES)), 0
            start = self.used
            self.used += -(-nbytes // _ALIGN) * _ALIGN
            return self.region[start : start + nbytes].view(dtype)


def huge_page_bytes(nbytes: int) -> torch.Tensor:
    """``nbytes`` (rounded up to 2 MB) of fresh anonymous memory, 2 MB-aligned, asked for on huge pages
    (uint8; the packed weights' memory, and what ``bench/linear_microbench.py`` reads for the roofline)."""
    nbytes = -(-nbytes // _HUGE) * _HUGE
    region = mmap.mmap(-1, nbytes + _HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            region.madvise(mmap.MADV_HUGEPAGE)
    whole = torch.frombuffer(region, dtype=torch.uint8)  # holds a reference to the mapping
    skip = -whole.data_ptr() % _HUGE
    return whole[skip : skip + nbytes]


_arena = _Arena()


def _huge_page_buffer(numel: int, dtype: torch.dtype = _F32) -> torch.Tensor:
    """A buffer of ``numel`` elements for a packed weight, on 2 MB pages where possible (``_Arena``)."""
    return _arena.take(numel, dtype)


def packed(weight: torch.Tensor) -> Packed:
    """The kernel's layout of ``weight`` [N, K] (panels of 16 output columns, ``csrc/linear.c``),
    built at its first use and kept on the tensor; rebuilt if the weight is changed in place or
    re-pointed (a weight reload). The copy costs as much memory as the weight itself, in its dtype
    (fp32 or bf16)."""
    key = (weight.data_ptr(), _version(weight))
    cached = getattr(weight, "_ssd_packed", None)
    if cached is not None and cached.key == key:
        return cached
    lib = clib.library()
    n_out, k = weight.shape
    wp = _huge_page_buffer(lib.ssd_packed_size(n_out, k), weight.dtype)
    (lib.ssd_pack_bf16 if weight.dtype is _BF16 else lib.ssd_pack)(weight.data_ptr(), n_out, k, wp.data_ptr())
    weight._ssd_packed = Packed(key, wp, lib.ssd_lead_bytes(n_out, k, wp.element_size()))
    return weight._ssd_packed


def kernels(bf16: bool = False) -> dict[str, object]:
    """Every C route this CPU can run, by name, for fp32 or (``bf16``) bf16 weights (for tests and
    benchmarks; serving uses ``linear``)."""
    lib = clib.library()
    if lib is None:
        return {}
    suffix = "_bf16" if bf16 else ""
    out = {"portable": getattr(lib, "ssd_linear_portable" + suffix)}
    if lib.ssd_cpu_has_avx2_fma():
        out["avx2"] = getattr(lib, "ssd_linear_avx2" + suffix)
    return out


def route_module(module: torch.nn.Module) -> int:
    """Send every ``nn.Linear`` of ``module`` (e.g. a transformers model) through ``linear``, as the
    server's hooks do for SGLang's layers. Returns the number of linears rerouted."""
    count = 0
    for mod in module.modules():
        if isinstance(mod, torch.nn.Linear):
            mod.forward = lambda x, m=mod: linear(x, m.weight, m.bias)
            count += 1
    return count


@contextlib.contextmanager
def use_route(name: str):
    """Within the block, ``linear`` runs route ``name`` ('torch' or a key of ``kernels()``): lets a
    benchmark time both routes in one process, interleaved."""
    _resolve()
    saved = _state["fn"], _state["fn_bf16"]
    _state["fn"], _state["fn_bf16"] = (None, None) if name == "torch" else (kernels()[name], kernels(True)[name])
    _hand_to_entry()
    try:
        yield
    finally:
        _state["fn"], _state["fn_bf16"] = saved
        _hand_to_entry()


@contextlib.contextmanager
def ctypes_entry():
    """Within the block, ``linear`` calls the kernel through Python and ctypes even where the compiled
    entry is built (a benchmark compares the two; both run the same kernel, bit for bit)."""
    _resolve()
    saved = _state["fast"]
    _state["fast"] = None
    try:
        yield
    finally:
        _state["fast"] = saved


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m sglang_ssd.cpu.linear", description=__doc__.split("\n")[0])
    ap.add_argument("--build", action="store_true", help="compile the kernel now (make install does)")
    args = ap.parse_args(argv)
    if args.build:
        try:
            print(f"sglang_ssd: CPU linear kernel built: {clib.build()}")
            print(f"sglang_ssd: CPU linear entry built: {clib.build_entry()}")
        except (OSError, subprocess.CalledProcessError) as exc:
            # Not fatal: without the kernel every call goes to torch, without the entry through
            # ctypes; the log says which.
            detail = (getattr(exc, "stderr", None) or "").strip()[-500:]
            print(f"sglang_ssd: CPU linear kernel or entry not built ({exc} {detail})", file=sys.stderr)
    print(f"sglang_ssd: CPU linear route: {describe()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
