"""Per-call time of SGLang's native RMSNorm against the C one (`sglang_ssd/cpu/rmsnorm.py`), one thread.

    SGLANG_USE_CPU_ENGINE=1 python bench/rmsnorm_microbench.py [--hidden 576] [--repeats 7] [--calls 500]

The two run interleaved, repeat by repeat, on the same rows with a residual (as in a decoder layer);
medians of the per-repeat means, in microseconds. Both give the same bits (tests/cpu/test_rmsnorm.py).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--hidden", type=int, default=576)
    ap.add_argument("--rows", default="1,5,12")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--calls", type=int, default=500)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    from sglang_ssd.cpu.stand_ins import install

    install()
    from sglang.srt.layers.layernorm import RMSNorm

    from sglang_ssd.cpu import rmsnorm

    norm = RMSNorm(args.hidden, eps=1e-5)
    native = RMSNorm.forward_native
    for rows in map(int, args.rows.split(",")):
        x, res = torch.randn(rows, args.hidden), torch.randn(rows, args.hidden)
        routes = {
            "native": lambda x=x, res=res: native(norm, x, res),
            "C": lambda x=x, res=res: rmsnorm.forward_native_hook(native, norm, x, res),
        }
        times: dict[str, list[float]] = {name: [] for name in routes}
        for f in routes.values():
            for _ in range(50):
                f()
        for _ in range(args.repeats):
            for name, f in routes.items():
                t = time.perf_counter()
                for _ in range(args.calls):
                    f()
                times[name].append((time.perf_counter() - t) / args.calls * 1e6)
        med = {name: statistics.median(v) for name, v in times.items()}
        print(f"rows {rows}: native {med['native']:.1f} us, C {med['C']:.1f} us per call "
              f"({med['native'] / med['C']:.2f}x)")  # fmt: skip


if __name__ == "__main__":
    main()
