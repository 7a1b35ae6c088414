"""What the Python around one C linear call costs: ``cpu.linear.linear`` against the bare ctypes call
and torch's ``F.linear``, on a product too small to matter (1 x 16 by 16 x 16), one thread.

    python bench/linear_call_overhead.py [--calls 20000] [--repeats 5] [--code-b DIR]

``--code-b DIR`` also times ``linear`` of another checkout's ``sglang_ssd/cpu/linear.py`` (e.g. a git
worktree of an older commit), interleaved with this one's.

A forward makes 121 such calls (4 linears in each of 30 layers, and the head), so each microsecond
here is about 0.12 ms a step.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
import sys
import timeit
from pathlib import Path

import torch
import torch.nn.functional as F

from sglang_ssd.cpu import linear as cpu_linear


def _load(checkout: Path):
    """``cpu/linear.py`` of another checkout, imported inside that checkout's ``sglang_ssd/cpu`` loaded as
    the package ``code_b_cpu``, so that its own relative imports (``clib``) resolve there too."""
    cpu = checkout / "sglang_ssd" / "cpu"
    spec = importlib.util.spec_from_file_location("code_b_cpu", cpu / "__init__.py", submodule_search_locations=[str(cpu)])
    package = importlib.util.module_from_spec(spec)
    sys.modules["code_b_cpu"] = package
    spec.loader.exec_module(package)
    return importlib.import_module("code_b_cpu.linear")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--code-b", default="", help="another checkout whose cpu/linear.py to time as well")
    args = ap.parse_args()
    torch.set_num_threads(1)
    x, w, y = torch.randn(1, 16), torch.randn(16, 16), torch.empty(1, 16)
    if cpu_linear.route() == "torch":
        print("the kernel route is off (SGLANG_SSD_CPU_LINEAR=torch): nothing to compare")
        return 1
    fn = cpu_linear.kernels()[cpu_linear.route()]
    plan = cpu_linear.packed(w)
    cases = {
        "cpu.linear.linear": lambda: cpu_linear.linear(x, w),
        "bare ctypes call": lambda: fn(x.data_ptr(), 16, plan.ptr, None, y.data_ptr(), 16, 1, 16, 16, None, 0),
        "torch F.linear": lambda: F.linear(x, w),
    }
    if args.code_b:
        other = _load(Path(args.code_b))
        w_b = torch.randn(16, 16)  # its own weight: the two modules cache different things on it
        cases[f"linear of {args.code_b}"] = lambda: other.linear(x, w_b)
    times = {name: [] for name in cases}
    with torch.inference_mode():  # as served: no autograd bookkeeping
        for _ in range(args.repeats):  # cases interleaved, medians
            for name, call in cases.items():
                times[name].append(timeit.timeit(call, number=args.calls) / args.calls * 1e6)
    for name, ts in times.items():
        print(f"{name:28s} {statistics.median(ts):6.2f} us per call (median of {args.repeats} x {args.calls})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
