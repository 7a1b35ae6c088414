"""One branch-tree step vs one plain decode step of the same token count, on the draft model.

Tree step: B requests × ΣF_k branches = N tokens in one forward, flat in KV with a custom mask (each
request's branches share its prefix). Plain decode step: N independent sequences, one token each, in one
forward. Also timed: the glue forward (B·(K+1) tokens) and a single-request decode step. Medians of
interleaved repeats (A B A B ...), one intra-op thread unless told otherwise.

    python bench/tree_step_microbench.py                       # draft folder, else target, else random
    python bench/tree_step_microbench.py --model models/target --batch 1,4 --context 256
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_ssd.draft.model import DraftModel, Span  # noqa: E402
from sglang_ssd.draft.request import RequestState, Stage  # noqa: E402
from sglang_ssd.draft.sampler import RowParams  # noqa: E402
from sglang_ssd.draft.tree import glue_span, select_forks, tree_span  # noqa: E402
from sglang_ssd.tools.random_model import write_random_model  # noqa: E402


def pick_model(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    for cand in (ROOT / "models" / "draft", ROOT / "models" / "target"):
        if (cand / "config.json").is_file():
            return cand
    folder = Path(tempfile.mkdtemp(prefix="bench-model-"))
    print("no draft/target folder: using a random SmolLM2-135M-shaped model", file=sys.stderr)
    return write_random_model(folder, vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                              num_heads=9, num_kv_heads=3, tie_word_embeddings=True)  # fmt: skip


def uniform_plan(k: int, budget: int) -> list[int]:
    base, extra = divmod(budget, k + 1)
    return [base + (1 if i < extra else 0) for i in range(k + 1)]


def timed(fn, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--budget", type=int, default=24)
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    folder = pick_model(args.model)
    batches = [int(b) for b in args.batch.split(",")]
    k, budget, ctx = args.k, args.budget, args.context
    n_max = max(batches) * budget
    slots = max(batches) * (ctx + 2 * (k + 1) + k * budget + 64) + n_max * (ctx + 16) + 1024
    model = DraftModel(folder, device=args.device, kv_slots=slots)
    cfg = model.cfg
    print(f"model {folder} ({cfg.num_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, "
          f"{model.dtype}, {args.device}, {torch.get_num_threads()} thread(s)); K={k}, ΣF={budget}, context {ctx}")
    g = torch.Generator().manual_seed(0)
    plan = uniform_plan(k, budget)
    rows = []
    for b in batches:
        n = b * budget
        reqs = []
        for i in range(b):
            toks = torch.randint(0, cfg.vocab_size, (ctx + k + 1,), generator=g).tolist()
            ext = model.pool.alloc(ctx + 2 * (k + 1) + k * budget + 64)
            r = RequestState(f"r{i}", "", i, RowParams(0.0), 0, toks[: ctx + 1], ext)
            pos = torch.arange(ctx)
            model.forward([Span(ext[0], torch.tensor(toks[:ctx]), pos, pos, ctx, out_rows=torch.empty(0, dtype=torch.long))])
            r.kv_len, r.spec = ctx, toks[ctx + 1 :]
            reqs.append(r)
        glue_logits = model.forward([glue_span(r) for r in reqs])
        for r, lg in zip(reqs, glue_logits):
            r.tree = select_forks(r, lg, plan, model, k)
            r.stage = Stage.TREE
            r.tree.steps_done = 3  # a mid-tree step: branches attend to a few own tokens
        # Plain decode: n sequences with their own context, one token each.
        seqs = []
        for _ in range(n):
            ext = model.pool.alloc(ctx + 1)
            toks = torch.randint(0, cfg.vocab_size, (ctx + 1,), generator=g)
            pos = torch.arange(ctx)
            model.forward([Span(ext[0], toks[:ctx], pos, pos, ctx, out_rows=torch.empty(0, dtype=torch.long))])
            seqs.append((ext, toks))

        def tree_step(reqs=reqs):
            model.forward([tree_span(r) for r in reqs])

        def plain_step(seqs=seqs):
            p = torch.tensor([ctx])
            model.forward([Span(e[0], t[ctx:], p, p, ctx + 1) for e, t in seqs])

        def glue_step(reqs=reqs):
            model.forward([glue_span(r) for r in reqs])

        def one_decode(seqs=seqs):
            p = torch.tensor([ctx])
            e, t = seqs[0]
            model.forward([Span(e[0], t[ctx:], p, p, ctx + 1)])

        tree_step(), plain_step()  # warm-up
        tt, pt, gt, ot = [], [], [], []
        for _ in range(args.repeats):  # interleaved
            tt += timed(tree_step, 1)
            pt += timed(plain_step, 1)
            gt += timed(glue_step, 1)
            ot += timed(one_decode, 1)
        med = statistics.median
        rows.append((b, n, med(tt), med(pt), med(gt), med(ot)))
        for e, _ in seqs:
            model.pool.release(*e)
        for r in reqs:
            model.pool.release(*r.extent)
    print()
    print("| B | tokens N = B·ΣF | tree step ms | plain decode step (N seqs) ms | tree/plain | glue B·(K+1) ms | 1-token decode ms |")
    print("|---|---|---|---|---|---|---|")
    for b, n, t, p, gl, o in rows:
        print(f"| {b} | {n} | {t:.2f} | {p:.2f} | {t / p:.2f} | {gl:.2f} | {o:.2f} |")


if __name__ == "__main__":
    main()
