"""The served C attention (``sglang_ssd/cpu/csrc/attention.c``) for a decode step and a 5-token verify.

Plain script, not a test:  python bench/attention_microbench.py [--repeats 31] [--context 300] [--code-b DIR]

The 135M target's shape (9 query heads over 3 KV heads of 64), one request with ``--context`` tokens,
one thread. Times 30 calls (a forward's layers) with n = 1 and n = 5 query tokens: on one layer's KV
pool (it stays in L2) and on 30 pools (one per layer, as in a forward), with the sequence's slots in
order or scattered over the pool. Prints the median ms per 30 calls and µs per (query token, head) pair.
``--code-b DIR`` also builds ``DIR/sglang_ssd/cpu/csrc/attention.c`` (another checkout, e.g. a git worktree
of an older commit) with the same flags and times its AVX2 route interleaved with this one's: ``b/a`` is
its time over this checkout's.
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sglang_ssd.cpu import clib  # noqa: E402
from sglang_ssd.cpu import sglang_attention as attention

HEADS, KV_HEADS, DIM = 9, 3, 64


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=31)
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--code-b", default="", help="another checkout whose csrc/attention.c to time as well")
    args = ap.parse_args()
    torch.set_num_threads(1)
    fn = clib.attention_kernel()
    if fn is None:
        sys.exit("the C attention is off here (torch route, or no compiler)")
    kernels = {"a": fn}
    if args.code_b:
        kernels["b"] = build_other(Path(args.code_b))
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
                t = {name: [] for name in kernels}
                for _ in range(args.repeats):
                    for name, kernel in kernels.items():  # interleaved, repeat by repeat
                        t0 = time.perf_counter()
                        for _ in range(30 // layers):
                            for k, v in zip(ks, vs):
                                attention.attend(kernel, q, k, v, table, rows, lens, n, KV_HEADS, DIM**-0.5,
                                                 decode=True)  # fmt: skip
                        t[name].append((time.perf_counter() - t0) * 1e3)
                ms = statistics.median(t["a"])
                line = (f"{layers:2d} pool(s), slots {slots:9s}, n = {n}: {ms:.3f} ms per 30 calls, "
                        f"{ms / 30 / (n * HEADS) * 1e3:.2f} µs per pair")  # fmt: skip
                if "b" in t:
                    ms_b = statistics.median(t["b"])
                    line += f" | code-b {ms_b:.3f} ms, b/a = {ms_b / ms:.2f}"
                print(line, flush=True)


def build_other(checkout: Path):
    """The AVX2 attention of another checkout, compiled here with this route's flags."""
    src = checkout / "sglang_ssd/cpu/csrc/attention.c"
    lib_path = Path(tempfile.mkdtemp()) / "attention_b.so"
    subprocess.run(["gcc", *clib._CFLAGS, "-o", str(lib_path), str(src), "-lm"], check=True)
    fn = ctypes.CDLL(str(lib_path)).ssd_attention_avx2
    p, n = ctypes.c_void_p, ctypes.c_long
    fn.argtypes = [p, n, p, p, p, n, p, n, p, p, ctypes.c_int, n, n, p, n, n, n, ctypes.c_float]
    fn.restype = ctypes.c_int
    return fn


if __name__ == "__main__":
    main()
