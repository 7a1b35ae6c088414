"""The target's linears in forward order, with their packed weights on 2 MB pages or on 4 KB pages.

Plain script, not a test:  python bench/page_size_ab.py [--repeats 25] [--rows 1,5,9]

Builds two sets of the 135M target's linear shapes (30 x qkv, o, gate_up, down, then the head; random
fp32 weights, 540 MB each): one packed by the route (``cpu.linear._huge_page_buffer``: every weight,
back to back, in shared ``MADV_HUGEPAGE`` mappings), one packed into plain
``torch.empty`` memory (4 KB pages under transparent huge pages in ``madvise`` mode). Then runs every
linear of one set in order, as a forward does (the route learns each product's successor and
prefetches it), for each row count, the two sets interleaved repeat by repeat; prints the median and
minimum ms per pass and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sglang_ssd.cpu import linear as cpu_linear  # noqa: E402

SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]  # (N, K)


def packed_set(alloc, g: torch.Generator) -> list[torch.Tensor]:
    """The target's weights, packed into buffers from ``alloc`` in place of the route's own allocator."""
    ws = [torch.randn(n, k, generator=g) * 0.05 for n, k in SHAPES]
    route_alloc = cpu_linear._huge_page_buffer
    cpu_linear._huge_page_buffer = alloc
    try:
        for w in ws:
            cpu_linear.packed(w)
    finally:
        cpu_linear._huge_page_buffer = route_alloc
    return ws


def huge_kb() -> int:
    return int(re.search(r"AnonHugePages:\s+(\d+)", Path("/proc/self/smaps_rollup").read_text()).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--rows", default="1,5,9")
    args = ap.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    before = huge_kb()
    sets = {"route": packed_set(cpu_linear._huge_page_buffer, g)}
    print(f"route's set: {(huge_kb() - before) >> 10} MB on huge pages", flush=True)
    sets["4KB"] = packed_set(lambda numel, dtype=torch.float32: torch.empty(numel, dtype=dtype), g)
    rows = [int(r) for r in args.rows.split(",")]
    xs = {m: {k: torch.randn(m, k, generator=g) for k in (576, 1536)} for m in rows}

    def one_pass(name: str, m: int) -> float:
        t0 = time.perf_counter()
        for w in sets[name]:
            cpu_linear.linear(xs[m][w.shape[1]], w)
        return time.perf_counter() - t0

    for name in sets:  # warm-up: the successor chain is learned on the first pass
        for m in rows:
            one_pass(name, m)
    t = {(name, m): [] for name in sets for m in rows}
    for _ in range(args.repeats):
        for m in rows:
            for name in sets:
                t[(name, m)].append(one_pass(name, m) * 1e3)
    for m in rows:
        med = {name: statistics.median(t[(name, m)]) for name in sets}
        print(f"M = {m:2d}: " + "  ".join(f"{n} {med[n]:.2f} ms (min {min(t[(n, m)]):.2f})" for n in sets)
              + f"  route/4KB = {med['route'] / med['4KB']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
