"""The draft runner's forward on CPU: fp32 or compact bf16 weights, SDPA or C attention, interleaved.

    python bench/draft_forward.py [--draft models/draft] [--context 300] [--repeats 25] [--out F.json]

Times ``DraftModel.forward`` (all layers, the head included) for the span shapes a draft server runs:
a one-token decode (backup), one each for 8 requests, a 5-token causal chain (glue), and tree steps of
2-12 branch tokens over a committed context. Variants, each a weights/attention pair:
- ``fp32/torch``: fp32 weights, SDPA per span (the runner before ``compact_linears`` and
  ``attention_c``), run twice for the run's noise band;
- ``bf16/torch``: the weights as ``compact_linears`` stores them (bf16 where exact), SDPA;
- ``bf16/c-all``: and every span through the C attention, whatever its size;
- ``bf16/auto``: the CPU default: the C attention for spans of at most ``attention_c.SMALL_SPAN``
  tokens, SDPA otherwise.
One thread, medians of ``--repeats``; ratios against ``fp32/torch``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_ssd.draft import attention_c  # noqa: E402
from sglang_ssd.draft.attention_factory import make_attention  # noqa: E402
from sglang_ssd.draft.model import DraftModel, Span  # noqa: E402
from sglang_ssd.draft.weights import linear_weights, load_weights  # noqa: E402


def cases(context: int, starts: list[int]) -> dict[str, callable]:
    def tree(nb: int) -> list[Span]:
        mask = torch.ones(nb, context + nb, dtype=torch.bool)
        mask[:, context:] = torch.eye(nb, dtype=torch.bool)  # each branch sees the context and itself
        pos = torch.full((nb,), context)
        return [Span(0, torch.full((nb,), 5), pos, torch.arange(context, context + nb), context + nb, mask=mask)]

    def chain(n: int) -> list[Span]:
        pos = torch.arange(context, context + n)
        return [Span(0, torch.full((n,), 5), pos, pos, context + n)]

    def decodes(n: int) -> list[Span]:  # n requests' backup tokens, each over its own context
        return [Span(start, torch.tensor([5]), torch.tensor([context]), torch.tensor([context]), context + 1)
                for start in starts[:n]]  # fmt: skip

    return {"decode1": lambda: chain(1), "decode1x8": lambda: decodes(8), "chain5": lambda: chain(5),
            **{f"tree{nb}": (lambda nb=nb: tree(nb)) for nb in (2, 4, 6, 8, 12)}}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draft", default="models/draft")
    ap.add_argument("--context", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=25)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model = DraftModel(args.draft, kv_slots=16384)
    extents = [model.pool.alloc(args.context + 16)[0] for _ in range(8)]  # request 0's extent starts at 0
    model.prefill([(start, list(range(100 + i, 100 + i + args.context))) for i, start in enumerate(extents)], 256)
    fn = attention_c.c_attention_kernel(model.cfg, model.pool, model.device)
    if fn is None:
        print("the C kernels do not apply here (route torch or a non-fp32 pool)")
        return 1
    compact = model.w
    full = load_weights(args.draft, model.cfg, torch.float32, model.device)
    sdpa = make_attention("torch", model.cfg, model.pool, model.device)
    variants = {"fp32/torch": (full, sdpa), "fp32/torch#2": (full, sdpa), "bf16/torch": (compact, sdpa),
                "bf16/c-all": (compact, attention_c.CAttention(model.cfg, model.pool, model.device, fn, 1 << 30)),
                "bf16/auto": (compact, make_attention("auto", model.cfg, model.pool, model.device))}  # fmt: skip
    shapes = cases(args.context, extents)
    times = {(v, c): [] for v in variants for c in shapes}
    for _ in range(args.repeats):
        for c, make in shapes.items():
            for v, (weights, attn) in variants.items():
                model.w, model.attn, spans = weights, attn, make()
                t = time.perf_counter()
                model.forward(spans)
                times[(v, c)].append(time.perf_counter() - t)
    rows = {c: {v: statistics.median(times[(v, c)]) * 1e3 for v in variants} for c in shapes}
    bf16 = sum(t.dtype is torch.bfloat16 for t in linear_weights(compact))
    print(f"draft {args.draft} ({bf16} weights stored bf16), context {args.context}, median ms of {args.repeats}")
    names = list(variants)
    head = " ".join(f"{v:>12s}" for v in names)
    print(f"{'span':8s} {head}   band  " + " ".join(f"{v:>10s}" for v in names[2:]))
    for c, r in rows.items():
        base = r["fp32/torch"]
        band = abs(r["fp32/torch#2"] / base - 1)
        print(f"{c:8s} " + " ".join(f"{r[v]:12.3f}" for v in names) + f"  {band:5.1%} "
              + " ".join(f"{r[v] / base:10.3f}" for v in names[2:]))  # fmt: skip
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"draft": args.draft, "context": args.context, "repeats": args.repeats,
                                        "small_span": attention_c.SMALL_SPAN, "median_ms": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
