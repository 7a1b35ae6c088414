"""The served C attention (``sglang_ssd/cpu/csrc/attention.c``) for a decode step and a 5-token verify.

Plain script, not a test:  python bench/attention_microbench.py [--repeats 31] [--context 300]

The 135M target's shape (9 query heads over 3 KV heads of 64), one request with ``--context`` tokens,
one thread. Times 30 calls (a forward's layers) with n = 1 and n = 5 query tokens: on one layer's KV
pool (it stays in L2) and on 30 pools (one per layer, as in a forward), with the sequence's slots in
order or scattered over the pool. Prints the median ms per 30 calls and µs per (query token, head) pair.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sglang_ssd.cpu import attention  # noqa: E402
from sglang_ssd.cpu import linear as cpu_linear  # noqa: E402

HEADS, KV_HEADS, DIM = 9, 3, 64


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--context", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    fn = cpu_linear.attention_kernel()
    if fn is None:
        sys.exit("the C attention is off here (torch route, or no compiler)")
    g = torch.Generator().manual_seed(0)
    cap = args.context + 100
    rows = torch.zeros(1, dtype=torch.int64)
    for layers in (1, 30):
        ks = [torch.randn(cap, KV_HEADS, DIM, generator=g) for _ in range(layers)]
        vs = [torch.randn(cap, KV_HEADS, DIM, generator=g) for _ in range(layers)]
        for slots, table in (("in order", torch.arange(cap)), ("scattered", torch.randperm(cap, generator=g))):
            table = table.to(torch.int32)[None].contiguous()
            for n in (1, 5):
                q = torch.randn(n, HEADS * DIM, generator=g)
                lens = torch.tensor([args.context + n])
                t = []
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    for _ in range(30 // layers):
                        for k, v in zip(ks, vs):
                            attention.attend(fn, q, k, v, table, rows, lens, n, KV_HEADS, DIM**-0.5, decode=True)
                    t.append((time.perf_counter() - t0) * 1e3)
                ms = statistics.median(t)
                print(f"{layers:2d} pool(s), slots {slots:9s}, n = {n}: {ms:.3f} ms per 30 calls, "
                      f"{ms / 30 / (n * HEADS) * 1e3:.2f} µs per pair", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
