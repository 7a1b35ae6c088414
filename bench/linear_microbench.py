"""Small-M linear on this CPU: the roofline, and what each route costs for the target's shapes.

For every linear shape of the target (QKV, O, gate/up, down, and the logits head) and M = 1..16 rows,
one fp32 product y = x W^T on one thread, by each route:
- ``torch``: ``F.linear`` (MKL / oneDNN as torch ships them);
- ``openblas``: numpy's matmul (OpenBLAS);
- ``onednn``: torch's prepacked oneDNN linear (``torch.utils.mkldnn.to_mkldnn`` on an ``nn.Linear``);
- ``compile``: ``torch.compile`` with Inductor's C++ GEMM template (only with ``--compile``, at a few M:
  each shape and M is its own compilation);
- ``kernel``: this project's route (``sglang_ssd.cpu.linear``, the AVX2 kernel where the CPU has it);
- ``ctypes``: the same kernel called through Python and ctypes instead of the compiled entry (what a
  machine without g++ and torch's headers gets; the difference is the per-call overhead).

The roofline: streaming read bandwidth B and FMA throughput P of one core, measured here
(``bench/csrc/roofline.c``), and per shape the bound max(4·N·K / B, M·N·K / P). The memory side is
timed at every point, interleaved with the routes, as a pure read of the very same weights (on a shared
machine the bandwidth drifts; the whole-buffer B is reported too). Weights are rotated over copies that
together exceed the last-level cache, as in a real decode step, which streams 540 MB. Each output is
dropped as its product returns, as a forward consumes it (`each`). All routes run interleaved, repeat
by repeat; the table gives medians.

    python bench/linear_microbench.py                  # tables + JSON in bench/results/, summary in bench/README.md
    python bench/linear_microbench.py --quick          # fewer M, fewer repeats
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.readme_blocks import write_block  # noqa: E402
from sglang_ssd.cpu import clib  # noqa: E402
from sglang_ssd.cpu import linear as cpu_linear  # noqa: E402
from sglang_ssd.cpu.allocator import keep_freed_memory  # noqa: E402

ROTATE_BYTES = 96 << 20  # > the 32 MB L3 of the machines this was written on


def target_shapes(folder: Path) -> dict[str, tuple[int, int]]:
    """name -> (K, N) of the target's linears, from its config."""
    cfg = json.loads((folder / "config.json").read_text())
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nq, nkv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    d = cfg.get("head_dim", h // nq)
    return {
        "qkv": (h, (nq + 2 * nkv) * d),
        "o": (nq * d, h),
        "gate_up": (h, 2 * inter),
        "down": (inter, h),
        "head": (h, vocab),
    }


def probes():
    """The roofline probes (``bench/csrc/roofline.c``), compiled here."""
    lib_path = Path(tempfile.mkdtemp()) / "roofline.so"
    subprocess.run(["gcc", "-O3", "-shared", "-fPIC", "-o", str(lib_path), str(ROOT / "bench/csrc/roofline.c")],
                   check=True)  # fmt: skip
    lib = ctypes.CDLL(str(lib_path))
    lib.probe_stream_read.argtypes = [ctypes.c_void_p, ctypes.c_long]
    lib.probe_stream_read.restype = ctypes.c_float
    lib.probe_fma.argtypes = [ctypes.c_long]
    lib.probe_fma.restype = ctypes.c_float
    for fn in (lib.probe_overlap, lib.probe_overlap512):
        fn.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_int]
        fn.restype = ctypes.c_float
    lib.probe_dependent512.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_int]
    lib.probe_dependent512.restype = ctypes.c_float
    return lib


def timed(fn, *args) -> float:
    """Seconds (on the chosen clock) of one call."""
    t0 = clock()
    fn(*args)
    return clock() - t0


def roofline(lib) -> dict:
    """One core's streaming read bandwidth (GB/s) and fp32 FMA rate (G FMA/s), best of a few runs."""
    # 512 MB (nothing of it stays in cache between passes), on the 2 MB pages the packed weights use
    buf = cpu_linear.huge_page_bytes(512 << 20).view(torch.float32)
    buf.normal_()
    best_bw = 0.0
    for _ in range(5):
        best_bw = max(best_bw, buf.numel() * 4 / timed(lib.probe_stream_read, buf.data_ptr(), buf.numel()) / 1e9)
    del buf
    iters = 20_000_000
    best_fma = 0.0
    for _ in range(5):
        best_fma = max(best_fma, iters * 12 * 8 / timed(lib.probe_fma, iters) / 1e9)
    return {"read_gb_s": round(best_bw, 2), "fma_g_per_s": round(best_fma, 2)}


def overlap(lib, avx512: bool, repeats: int = 7) -> dict:
    """The best memory/compute overlap of one core: a streaming read and FMAs that do not wait for it,
    balanced to take equal time alone (FMA rounds per KB calibrated here), timed together; the ratio
    to the longer alone. Variants: AVX2 or AVX-512 FMAs, with or without a software prefetch 4 KB
    ahead. The bound max(read, FMAs) assumes perfect overlap; this is the most of it one core gives.
    FMAs that consume the streamed data, as a product's do, get less (``dependent_overlap``)."""
    buf = torch.randn(256 << 20 >> 2)  # 256 MB: streamed from memory every pass
    ptr, n = buf.data_ptr(), buf.numel()
    fns = [("avx2", lib.probe_overlap)] + ([("avx512", lib.probe_overlap512)] if avx512 else [])
    out = {}
    for name, fn in fns:
        for pf in (0, 4096):
            t_read = min(timed(fn, ptr, n, 0, pf, 1) for _ in range(3))
            t_round = min(timed(fn, ptr, n, 8, 0, 0) for _ in range(3)) / 8
            fmas = max(1, round(t_read / t_round))
            ratios = []
            for _ in range(repeats):  # read, FMAs, both: interleaved, as the bandwidth drifts
                tr, tc, tb = (timed(fn, ptr, n, f, p, r) for f, p, r in ((0, pf, 1), (fmas, 0, 0), (fmas, pf, 1)))
                ratios.append(tb / max(tr, tc))
            out[f"{name}, prefetch {pf} B"] = {"fma_rounds_per_kb": fmas, "both_over_longer": round(statistics.median(ratios), 3)}
    best = min(out, key=lambda k: out[k]["both_over_longer"])
    res = {"variants": out, "best": best, "best_ratio": out[best]["both_over_longer"]}
    if avx512:
        res["dependent"] = dependent_overlap(lib, buf, repeats)
    return res


def dependent_overlap(lib, buf: torch.Tensor, repeats: int) -> dict:
    """The same for FMAs that consume the streamed weights (``probe_dependent512``: 9 rows x 3 vectors,
    one sequential stream, FMAs about as long as the read): with the hardware prefetcher alone, and with
    a T1 prefetch tied to the stream at a few distances ahead. Ratio to the longer of read and FMAs."""
    x = torch.rand(256 * 9)
    steps = buf.numel() // 48
    out = {}
    for pf in (0, 16 << 10, 64 << 10, 256 << 10):
        ratios = []
        for _ in range(repeats):
            tr = timed(lib.probe_stream_read, buf.data_ptr(), buf.numel())
            tc = timed(lib.probe_dependent512, buf.data_ptr(), steps, x.data_ptr(), 0, 1)
            tb = timed(lib.probe_dependent512, buf.data_ptr(), steps, x.data_ptr(), pf, 0)
            ratios.append((tb / max(tr, tc), tc / tr))
        out[f"prefetch {pf >> 10} KB ahead" if pf else "hardware prefetch only"] = {
            "both_over_longer": round(statistics.median(r[0] for r in ratios), 3),
            "fmas_over_read": round(statistics.median(r[1] for r in ratios), 3),
        }
    return out


def make_routes(names: list[str], ws: list[torch.Tensor], lib) -> dict:
    """name -> callable(x) running the product over every weight copy once. ``read`` only streams
    the kernel's packed copies of the same weights (the memory side of the bound: the bytes and pages
    the kernel reads, timed under the same conditions as the rest)."""
    packs = [cpu_linear.packed(w).wp for w in ws]
    routes = {"read": lambda x: each(lambda p: lib.probe_stream_read(p.data_ptr(), p.numel()), packs)}
    if "torch" in names:
        routes["torch"] = lambda x: each(lambda w: F.linear(x, w), ws)
    if "kernel" in names:
        routes["kernel"] = lambda x: each(lambda w: cpu_linear.linear(x, w), ws)
    if "ctypes" in names:  # the same kernel called through Python and ctypes, not the compiled entry

        def through_ctypes(x):
            with cpu_linear.ctypes_entry():
                each(lambda w: cpu_linear.linear(x, w), ws)

        routes["ctypes"] = through_ctypes
    if "openblas" in names:
        wts = [w.numpy().T for w in ws]
        routes["openblas"] = lambda x: each(lambda wt: x.numpy() @ wt, wts)
    if "onednn" in names:
        from torch.utils import mkldnn

        mods = []
        for w in ws:
            lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
            lin.weight.data = w
            mods.append(mkldnn.to_mkldnn(lin))
        routes["onednn"] = lambda x: each(lambda m: m(x), mods)
    return routes


def each(product, items) -> None:
    """One product per item, each output dropped as soon as it returns, as a forward consumes a
    linear's output at once and the allocator hands the same, still cached, memory to the next one.
    (Keeping every copy's output alive until the pass ends made each product store into cold memory:
    5-10 % on the kernel at M = 5-9 for o and qkv, in one interleaved throwaway run.)"""
    for item in items:
        product(item)


def compiled_route(w: torch.Tensor):
    """Inductor's C++ GEMM template on one frozen weight (max-autotune, CPP backend)."""
    import torch._inductor.config as inductor

    inductor.freezing = True
    inductor.max_autotune_gemm_backends = "CPP,ATEN"
    lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False).eval()
    lin.weight.data = w
    return torch.compile(lin, mode="max-autotune-no-cudagraphs", dynamic=False)


CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}
clock = time.perf_counter


def measure(routes: dict, xs: dict[int, torch.Tensor], copies: int, repeats: int) -> dict[int, dict[str, float]]:
    """Median ms per single product for every row count and route. Each repeat times every M and
    every route in turn, so the machine's drifting bandwidth falls on all of them alike: both the
    route ratios and cost(M) / cost(1) come from interleaved timings."""
    for x in xs.values():
        for fn in routes.values():
            fn(x)
    times = {m: {k: [] for k in routes} for m in xs}
    for _ in range(repeats):
        for m, x in xs.items():
            for name, fn in routes.items():
                times[m][name].append(timed(fn, x) * 1e3 / copies)
    return {m: {k: statistics.median(v) for k, v in by_route.items()} for m, by_route in times.items()}


def run(args) -> dict:
    torch.set_num_threads(1)
    malloc = "keep" if keep_freed_memory() else "default"  # as the servers run (sglang_ssd/cpu/allocator.py)
    shapes = target_shapes(Path(args.target))
    lib = probes()
    roof = roofline(lib)
    print(f"roofline: read {roof['read_gb_s']} GB/s, FMA {roof['fma_g_per_s']} G/s (one core)", flush=True)
    roof["overlap"] = overlap(lib, clib.avx512_tiles())
    print(f"overlap: read + FMAs of equal time run {roof['overlap']['best_ratio']}x the longer alone "
          f"(best: {roof['overlap']['best']})", flush=True)
    ms_list = [1, 2, 4, 8, 16] if args.quick else list(range(1, 17))
    names = args.routes.split(",")
    out = {"roofline": roof, "kernel_route": cpu_linear.describe(), "malloc": malloc, "clock": args.clock, "shapes": {},
           "loadavg": list(os.getloadavg())}  # fmt: skip
    g = torch.Generator().manual_seed(0)
    for name, (k, n) in shapes.items():
        if args.shapes and name not in args.shapes.split(","):
            continue
        copies = max(1, -(-ROTATE_BYTES // (n * k * 4)))
        ws = [torch.randn(n, k, generator=g) / k**0.5 for _ in range(copies)]
        routes = make_routes(names, ws, lib)
        xs = {m: torch.randn(m, k, generator=g) for m in ms_list}
        rows = {}
        for m, t in measure(routes, xs, copies, args.repeats).items():
            # Memory side: the weights' pure read, timed interleaved with the routes (the machine's
            # bandwidth drifts with its load); compute side: the FMAs at the probed peak.
            bound = max(t["read"], m * n * k / (roof["fma_g_per_s"] * 1e9) * 1e3)
            rows[m] = {"bound_ms": bound, **t}
        if args.compile:
            for m in (1, 4, 16):
                x = torch.randn(m, k, generator=g)
                try:
                    cm = compiled_route(ws[0])
                    cm(x)
                    t = measure({"compile": lambda x, cm=cm: cm(x)}, {m: x}, 1, args.repeats)
                    # One weight only (no rotation): an optimistic figure, it may sit in cache.
                    rows[m]["compile"] = t[m]["compile"]
                except Exception as exc:  # noqa: BLE001 - reported, the table goes on
                    rows[m]["compile_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        out["shapes"][name] = {"K": k, "N": n, "copies": copies, "by_m": rows}
        k1 = rows[1]["kernel"]
        print(f"{name:8s} K={k:5d} N={n:6d}  kernel/bound "
              + " ".join(f"{rows[m]['kernel'] / rows[m]['bound_ms']:.2f}" for m in ms_list)
              + " | kernel(M)/kernel(1) " + " ".join(f"{rows[m]['kernel'] / k1:.2f}" for m in ms_list)
              + (" | kernel/torch " + " ".join(f"{rows[m]['kernel'] / rows[m]['torch']:.2f}" for m in ms_list)
                 if "torch" in rows[1] else "")
              + (" | ctypes/kernel " + " ".join(f"{rows[m]['ctypes'] / rows[m]['kernel']:.2f}" for m in ms_list)
                 if "ctypes" in rows[1] else ""),
              flush=True)  # fmt: skip
    out["loadavg_end"] = list(os.getloadavg())
    out["checks"] = checks(out, ms_list)
    return out


def checks(out: dict, ms_list: list[int]) -> dict:
    """The issue's targets, per shape: within 1.3x of the bound, never slower than torch, flat to M = 4."""
    res = {}
    for name, s in out["shapes"].items():
        r = s["by_m"]
        res[name] = {
            "worst_kernel_over_bound": round(max(r[m]["kernel"] / r[m]["bound_ms"] for m in ms_list), 3),
            "m_over_1_3x_bound": [m for m in ms_list if r[m]["kernel"] / r[m]["bound_ms"] > 1.3],
            "worst_kernel_over_torch": round(max(r[m]["kernel"] / r[m]["torch"] for m in ms_list), 3)
            if "torch" in r[1] else None,
            "worst_m_le_4_over_m1": round(max(r[m]["kernel"] / r[1]["kernel"] for m in ms_list if m <= 4), 3),
        }
    return res


def markdown(out: dict) -> str:
    roof = out["roofline"]
    lines = [
        f"Roofline of one core, measured by `bench/linear_microbench.py`: streaming read **{roof['read_gb_s']} GB/s**, "
        f"fp32 FMA **{roof['fma_g_per_s']} G/s**. Kernel route: {out['kernel_route']}. "
        f"Load average {out['loadavg'][0]:.2f} at the start, {out['loadavg_end'][0]:.2f} at the end.",
        "",
    ]
    if "overlap" in roof:
        ov = roof["overlap"]
        lines += [
            "Memory/compute overlap of this core (`probe_overlap` in `bench/csrc/roofline.c`): a streaming read and "
            "FMAs that do not depend on it, balanced to take equal time alone, run together in "
            f"**{ov['best_ratio']}x** the longer of the two (best of "
            + ", ".join(f"{k} {v['both_over_longer']}x" for k, v in ov["variants"].items())
            + "). The bound below assumes perfect overlap (1.0x)."
            + (" FMAs that consume the stream (`probe_dependent512`, 9 rows x 3 vectors, FMAs "
               f"{next(iter(ov['dependent'].values()))['fmas_over_read']}x the read's time): "
               + ", ".join(f"{k} {v['both_over_longer']}x" for k, v in ov["dependent"].items())
               + ". A small-M product's FMAs consume its weights as these do: read its cells at the crossover M "
               "(read about equal to FMAs) against these figures, not against 1.0x."
               if "dependent" in ov else ""),
            "",
        ]
    lines += [
        "Milliseconds per product (medians, routes and row counts interleaved, weights rotated past the L3 cache; clock: "
        + ("this thread's CPU time, which leaves out time the thread was not running on the shared machine "
           "but not the other processes' pull on memory" if out.get("clock") == "thread" else "wall")
        + "); `read` = a pure streaming read (one stream) of the kernel's packed copies of the same weights, timed with the routes; "
        "`bound` = max(read, FMAs / FMA rate). `compile` (Inductor's C++ GEMM template) is timed on one "
        "weight copy, not rotated: for the small shapes that copy can sit in cache, an optimistic figure.",
        "",
    ]
    for name, s in out["shapes"].items():
        by_m = s["by_m"]
        cols = [c for c in ("read", "bound_ms", "kernel", "ctypes", "torch", "openblas", "onednn") if c in by_m[1]] + (
            ["compile"] if any("compile" in v for v in by_m.values()) else []
        )
        lines.append(f"**{name}** (K = {s['K']}, N = {s['N']})")
        lines.append("")
        lines.append("| M | " + " | ".join(c.replace("_ms", "") for c in cols) + " | kernel / bound | kernel / torch |")
        lines.append("|---" * (len(cols) + 3) + "|")
        for m, v in by_m.items():
            cells = [f"{v[c]:.3f}" if c in v else "–" for c in cols]
            lines.append(f"| {m} | " + " | ".join(cells)
                         + f" | {v['kernel'] / v['bound_ms']:.2f} | "
                         + (f"{v['kernel'] / v['torch']:.2f} |" if "torch" in v else "– |"))  # fmt: skip
        lines.append("")
    lines += check_table(out)
    return "\n".join(lines)


def check_table(out: dict) -> list[str]:
    """One row per shape: the worst cells of its table against the targets."""
    lines = ["| shape | worst kernel / bound | M over 1.3x the bound | worst kernel / torch | worst cost(M ≤ 4) / cost(1) |",
             "|---|---|---|---|---|"]
    for name, c in out["checks"].items():
        over = ", ".join(str(m) for m in c["m_over_1_3x_bound"]) or "none"
        lines.append(f"| {name} | {c['worst_kernel_over_bound']} | {over} | {c['worst_kernel_over_torch']} | "
                     f"{c['worst_m_le_4_over_m1']} |")  # fmt: skip
    return lines


def summary(out: dict, tables: str) -> str:
    """The results page's block: the roofline line and the per-shape worst cells; the per-M tables stay in
    ``tables`` (the markdown file next to the JSON)."""
    first = markdown(out).split("\n", 1)[0]
    return "\n".join([first, "", *check_table(out), "", f"Per shape and M: `{tables}`."])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=str(ROOT / "models" / "target"))
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--quick", action="store_true", help="M in 1, 2, 4, 8, 16 and 3 repeats")
    ap.add_argument("--compile", action="store_true", help="also time torch.compile's C++ GEMM template")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "linear_microbench.json"))
    ap.add_argument("--no-readme", action="store_true")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="thread = this thread's CPU time: on a shared machine it leaves out time the "
                    "thread was not running (not memory contention)")  # fmt: skip
    ap.add_argument("--shapes", default="", help="comma-separated subset of qkv,o,gate_up,down,head")
    ap.add_argument("--routes", default="torch,openblas,onednn,kernel,ctypes")
    args = ap.parse_args()
    global clock
    clock = CLOCKS[args.clock]
    if args.quick:
        args.repeats = min(args.repeats, 3)
    out = run(args)
    Path(args.out).write_text(json.dumps(out, indent=1))
    md = markdown(out)
    tables = Path(args.out).with_suffix(".md")
    tables.write_text(md + "\n")
    if not args.no_readme:
        shown = tables.resolve().relative_to(ROOT / "bench") if tables.resolve().is_relative_to(ROOT / "bench") else tables
        write_block("linear-microbench", summary(out, str(shown)))
    print(json.dumps(out["checks"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
