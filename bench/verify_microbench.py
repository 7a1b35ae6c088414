"""Throughput of exact chain verification (``sglang_ssd.algo.verify_chain``), K = 7, V = 49152.

Plain script, not a test:  python bench/verify_microbench.py [--device cuda] [--repeats 20]

For each batch size and proposal kind (dense q′, sparse top-S q′, point masses) it times one
verify_chain call (target processing at T = 1 + the SD rule) with input checks off (the hot path) and
prints the median per call, requests/s, and the time of the value checks as a separate column.
On CUDA it runs the torch path and, when FlashInfer is importable, the FlashInfer path.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch

from sglang_ssd.algo import SamplingBatch, saguaro_sample, verify_chain
from sglang_ssd.algo.verify import _flashinfer_kernel


def make_inputs(batch: int, K: int, V: int, kind: str, support: int, device: str):
    g = torch.Generator(device=device).manual_seed(batch)
    target = torch.randn(batch, K + 1, V, device=device, generator=g) * 3
    draft = target[:, :K].reshape(-1, V) + torch.randn(batch * K, V, device=device, generator=g)
    tokens, q = saguaro_sample(
        draft, 1.0, num_top=4, C=0.3, support=support if kind == "sparse" else None, generator=g
    )
    tokens = tokens.view(batch, K)
    if kind == "point":
        q = None
    elif kind == "sparse":
        q = q.reshape(batch, K)
    else:
        q = q.view(batch, K, V)
    return target, tokens, q, SamplingBatch.make(batch, 1.0, device=device)


def timed(fn, repeats: int, device: str) -> float:
    def sync():
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64")
    ap.add_argument("--K", type=int, default=7)
    ap.add_argument("--vocab", type=int, default=49152)
    ap.add_argument("--support", type=int, default=64, help="S of the sparse q′")
    ap.add_argument("--kinds", default="dense,sparse,point")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    backends = ["torch"]
    if args.device.startswith("cuda") and _flashinfer_kernel() is not None:
        backends.append("flashinfer")
    print(
        f"# verify_chain  K={args.K}  V={args.vocab}  device={args.device}  "
        f"threads={torch.get_num_threads()}  torch={torch.__version__}  median of {args.repeats}"
    )
    header = f"{'batch':>5} {'kind':>6} {'backend':>10} {'ms/call':>9} {'req/s':>10} {'+checks ms':>10}"
    print(header)
    print("-" * len(header))
    for batch in [int(b) for b in args.batches.split(",")]:
        for kind in args.kinds.split(","):
            target, tokens, q, sampling = make_inputs(
                batch, args.K, args.vocab, kind, args.support, args.device
            )
            for backend in backends:
                run = functools.partial(verify_chain, target, tokens, q, sampling, backend=backend)

                t = timed(functools.partial(run, check=False), args.repeats, args.device)
                tc = timed(functools.partial(run, check=True), max(3, args.repeats // 3), args.device)
                print(
                    f"{batch:>5} {kind:>6} {backend:>10} {t * 1e3:>9.3f} {batch / t:>10.0f} "
                    f"{(tc - t) * 1e3:>10.3f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
