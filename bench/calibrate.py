"""Cost calibration for the planner (``python -m sglang_ssd.planner``): what one forward costs on this machine.

Target (transformers, the folder ``--target``): T_v(n) = time of ONE forward over n new tokens on top of a
``--context``-token KV cache (logits for all n rows, as a verification needs them), n = 1..``--max-n``, at
batch 1 (and at the extra batch sizes of ``--target-batches``: b sequences of n new tokens each).

Draft (the project's draft runner, ``sglang_ssd/draft/model.py``, on ``--draft``; when that folder is
missing, the first ``--draft-layers`` layers of the target folder stand in, and the JSON says so):
- ``chain_ms[n]``: one causal forward of n new tokens of one request (the glue of a round is K+1 of these);
- ``decode_ms[b]``: one forward of b requests × 1 token (an SD draft step / a neural-backup step at batch b);
- ``tree[BxF]``: one whole pre-speculation round of the draft server's tree code for B requests and
  ΣF_k = F branches each, K = ``--k``: the glue forward, then K branch steps (forward + sampling);
  per-step median and whole-round median.

All times are medians in milliseconds over interleaved repeats (A B A B ...), one intra-op thread.
The machine is shared, so the load average is recorded before and after.

    python bench/calibrate.py --quick --out bench/results/calibration.json
    python bench/calibrate.py --out bench/results/calibration.json --target-batches 2,4
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_ssd.cpu import clib  # noqa: E402
from sglang_ssd.cpu import linear as cpu_linear  # noqa: E402
from sglang_ssd.cpu import sglang_attention as cpu_attention  # noqa: E402
from sglang_ssd.cpu.allocator import keep_freed_memory  # noqa: E402
from sglang_ssd.draft.model import DraftModel, Span  # noqa: E402
from sglang_ssd.draft.model_config import ModelConfig  # noqa: E402
from sglang_ssd.draft.request import RequestState, Stage  # noqa: E402
from sglang_ssd.draft.sampler import RowParams  # noqa: E402
from sglang_ssd.draft.tree import advance_tree, glue_span, select_forks, tree_span  # noqa: E402
from sglang_ssd.draft.weights import linear_weights, load_weights  # noqa: E402


def log(msg: str) -> None:
    print(msg, flush=True)


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples), 3)


def interleaved(
    fns: dict[str, callable], repeats: int, warmup: int = 1
) -> tuple[dict[str, float], dict[str, float]]:
    """(median ms, min ms) of each zero-argument callable, run round-robin so that load drifts hit all
    alike. On a shared machine the median is the cost as it will be met; the min is closer to the cost
    of the work alone."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for key, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[key].append((time.perf_counter() - t0) * 1e3)
    return {k: median_ms(v) for k, v in times.items()}, {k: round(min(v), 3) for k, v in times.items()}


def machine_info() -> dict:
    cpu = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "logical_cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "loadavg_start": list(os.getloadavg()),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
    }


# ---- target ---------------------------------------------------------------------------------------


class ServedAttention:
    """The served target's attention for the transformers forward: the C kernel of ``cpu/sglang_attention.py``
    over a KV pool in SGLang's layout ([slots, kv_heads, head_dim], ``capacity`` slots per sequence,
    read through a token table), so T_v(n) is timed with the attention the server runs, not SDPA.
    Each call writes only its new tokens into the pool, as SGLang's ``set_kv_buffer`` does; transformers'
    own cache still holds the same K/V (and is what ``crop`` rewinds). ``on = False`` (the torch route)
    runs SDPA, as the server does on that route."""

    NAME = "ssd_served"

    def __init__(self, fn, layers: int, batch: int, capacity: int, kv_heads: int, dim: int) -> None:
        self.fn, self.capacity, self.on = fn, capacity, True
        self.k = torch.zeros(layers, batch * capacity, kv_heads, dim)
        self.v = torch.zeros_like(self.k)
        slots = torch.arange(batch, dtype=torch.int32)[:, None] * capacity + torch.arange(capacity, dtype=torch.int32)
        self.table, self.rows = slots.contiguous(), torch.arange(batch, dtype=torch.int64)

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        b, heads, n, dim = query.shape
        s, kv_heads = key.shape[2], key.shape[1]
        if not self.on or s > self.capacity:
            return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                          scaling=scaling, **kwargs)  # fmt: skip
        k_pool, v_pool = self.k[module.layer_idx], self.v[module.layer_idx]
        k_pool.view(b, self.capacity, kv_heads, dim)[:, s - n : s] = key[:, :, s - n :].transpose(1, 2)
        v_pool.view(b, self.capacity, kv_heads, dim)[:, s - n : s] = value[:, :, s - n :].transpose(1, 2)
        q = query.transpose(1, 2).reshape(b * n, heads * dim)  # SGLang's [tokens, heads * dim]
        lens = torch.full((b,), s, dtype=torch.int64)
        out = cpu_attention.attend(self.fn, q, k_pool, v_pool, self.table, self.rows, lens, n, kv_heads,
                                   float(scaling), decode=True)  # fmt: skip
        if out is None:
            raise RuntimeError("the C attention refused the calibration's KV pool")
        return out.view(b, n, heads, dim), None


def served_attention(model, batch: int, capacity: int) -> ServedAttention | None:
    """Route ``model``'s attention through ``ServedAttention`` where the server runs the C attention."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    fn = clib.attention_kernel()
    if fn is None:
        return None
    cfg = model.config
    attn = ServedAttention(fn, cfg.num_hidden_layers, batch, capacity, cfg.num_key_value_heads,
                           cfg.hidden_size // cfg.num_attention_heads)  # fmt: skip
    AttentionInterface.register(ServedAttention.NAME, attn)
    AttentionMaskInterface.register(ServedAttention.NAME, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.set_attn_implementation(ServedAttention.NAME)
    return attn


def calibrate_target(
    folder: Path, context: int, max_n: int, batches: list[int], repeats: int, compare_torch: bool = False
) -> dict:
    """T_v(n) through the linear route the server uses (``sglang_ssd.cpu.linear``); with
    ``compare_torch`` the same forwards through plain ``F.linear`` too, interleaved with them."""
    import transformers
    from transformers import AutoModelForCausalLM, DynamicCache

    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    cfg = model.config
    n_routed = cpu_linear.route_module(model)
    log(f"target linears ({n_routed}, head included): {cpu_linear.describe()}")
    log(f"target {folder}: {cfg.num_hidden_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, "
        f"float32, transformers {transformers.__version__} (loaded in {time.perf_counter() - t0:.1f} s)")  # fmt: skip
    g = torch.Generator().manual_seed(0)
    out: dict = {
        "path": str(folder),
        "num_layers": cfg.num_hidden_layers,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "dtype": "float32",
        "runner": f"transformers {transformers.__version__}",
        "linear_route": cpu_linear.describe(),
        "verify_ms_by_batch": {},
    }
    for b in batches:
        attn = served_attention(model, b, context + max_n)
        if b == batches[0]:
            out["attention"] = ("sglang_ssd C attention over a paged pool (as served)" if attn
                                else "transformers SDPA")  # fmt: skip
            log(f"target attention: {out['attention']}")
        ctx = torch.randint(0, cfg.vocab_size, (b, context), generator=g)
        cache = DynamicCache(config=cfg)
        t0 = time.perf_counter()
        with torch.inference_mode():
            model(input_ids=ctx, past_key_values=cache, use_cache=True, logits_to_keep=1)
        log(f"  batch {b}: prefill of {context} tokens in {(time.perf_counter() - t0) * 1e3:.0f} ms")
        new = torch.randint(0, cfg.vocab_size, (b, max_n), generator=g)

        def verify(n: int, route: str = cpu_linear.route(), cache=cache, new=new, b=b, attn=attn) -> None:
            pos = torch.arange(context, context + n).expand(b, n)
            if attn is not None:  # the torch route serves SDPA attention
                attn.on = route != "torch"
            with torch.inference_mode(), cpu_linear.use_route(route):
                model(input_ids=new[:, :n], past_key_values=cache, use_cache=True, position_ids=pos)
            cache.crop(-n)  # the next timing starts from the same context

        fns = {str(n): (lambda n=n: verify(n)) for n in range(1, max_n + 1)}
        if compare_torch:
            fns |= {f"torch{n}": (lambda n=n: verify(n, "torch")) for n in range(1, max_n + 1)}
        med, mn = interleaved(fns, repeats)
        if compare_torch:
            old = [med[f"torch{n}"] for n in range(1, max_n + 1)]
            out.setdefault("verify_ms_torch_route_by_batch", {})[str(b)] = old
            log(f"  batch {b}: torch route T_v(n) ms " + " ".join(f"{n}:{t:.1f}" for n, t in enumerate(old, 1)))
        row = [med[str(n)] for n in range(1, max_n + 1)]
        out["verify_ms_by_batch"][str(b)] = row
        out.setdefault("verify_min_ms_by_batch", {})[str(b)] = [mn[str(n)] for n in range(1, max_n + 1)]
        log(f"  batch {b}: T_v(n) ms      " + " ".join(f"{n}:{t:.1f}" for n, t in enumerate(row, 1)))
        log(f"  batch {b}: T_v(n)/T_v(1)  " + " ".join(f"{n}:{t / row[0]:.2f}" for n, t in enumerate(row, 1)))
        mins = out["verify_min_ms_by_batch"][str(b)]
        log(f"  batch {b}: min T_v(n) ms  " + " ".join(f"{n}:{t:.1f}" for n, t in enumerate(mins, 1)))
    out["verify_ms"] = out["verify_ms_by_batch"]["1"]
    out["verify_min_ms"] = out["verify_min_ms_by_batch"]["1"]
    return out


# ---- draft ----------------------------------------------------------------------------------------


def load_draft(draft: Path, target: Path, layers: int, slots: int) -> tuple[DraftModel, dict]:
    if (draft / "config.json").is_file():
        model = DraftModel(draft, device="cpu", kv_slots=slots)
        return model, {"path": str(draft), "source": "draft folder"}
    cfg = dataclasses.replace(ModelConfig.from_folder(target), num_layers=layers)
    weights = load_weights(target, cfg, torch.float32, torch.device("cpu"))
    model = DraftModel(None, device="cpu", kv_slots=slots, parts=(cfg, weights))
    note = (f"{draft} is missing: stand-in = the first {layers} layers of {target} (same embedding and head); "
            "its costs are those of a draft of that shape, its predictions are not used")  # fmt: skip
    log(f"draft: {note}")
    return model, {"path": str(target), "source": f"target's first {layers} layers", "note": note}


def calibrate_draft(model: DraftModel, context: int, max_n: int, k: int, decode_batches: list[int],
                    trees: list[tuple[int, int]], repeats: int, temperature: float,
                    compare_torch: bool = False) -> dict:  # fmt: skip
    """Draft runner costs on the linear route the draft server uses; with ``compare_torch`` the tree
    rounds also on plain ``F.linear``, alternating with them round by round (``tree_torch_route``)."""
    cfg = model.cfg
    log(
        f"draft runner: {cfg.num_layers} layers, hidden {cfg.hidden_size}, vocab {cfg.vocab_size}, {model.dtype}"
    )
    g = torch.Generator().manual_seed(1)
    empty = torch.empty(0, dtype=torch.long)

    def new_context(extra: int) -> tuple[tuple[int, int], torch.Tensor]:
        ext = model.pool.alloc(context + extra)
        toks = torch.randint(0, cfg.vocab_size, (context + extra,), generator=g)
        pos = torch.arange(context)
        model.forward([Span(ext[0], toks[:context], pos, pos, context, out_rows=empty)])
        return ext, toks

    # Chain forwards (glue-like) and batched 1-token decode steps share a set of prefilled contexts.
    seqs = [new_context(max(max_n, 1) + 1) for _ in range(max(decode_batches))]

    def chain(n: int) -> None:
        ext, toks = seqs[0]
        pos = torch.arange(context, context + n)
        model.forward([Span(ext[0], toks[context : context + n], pos, pos, context + n)])

    def decode(b: int) -> None:
        p = torch.tensor([context])
        model.forward([Span(e[0], t[context : context + 1], p, p, context + 1) for e, t in seqs[:b]])

    fns = {f"c{n}": (lambda n=n: chain(n)) for n in range(1, max_n + 1)}
    fns |= {f"d{b}": (lambda b=b: decode(b)) for b in decode_batches}
    med, mn = interleaved(fns, repeats)
    chain_ms = [med[f"c{n}"] for n in range(1, max_n + 1)]
    decode_ms = {str(b): med[f"d{b}"] for b in decode_batches}
    mins = {"chain_ms": [mn[f"c{n}"] for n in range(1, max_n + 1)],
            "decode_ms": {str(b): mn[f"d{b}"] for b in decode_batches}}  # fmt: skip
    log("  chain forward ms (n new tokens) " + " ".join(f"{n}:{t:.2f}" for n, t in enumerate(chain_ms, 1)))
    log("  decode step ms (b requests × 1) " + " ".join(f"{b}:{t:.2f}" for b, t in decode_ms.items()))
    log("  min chain ms " + " ".join(f"{n}:{t:.2f}" for n, t in enumerate(mins["chain_ms"], 1))
        + " | min decode ms " + " ".join(f"{b}:{t:.2f}" for b, t in mins["decode_ms"].items()))  # fmt: skip
    for e, _ in seqs:
        model.pool.release(*e)

    params = RowParams(temperature, support=1 if temperature <= 0 else None)
    tree_out, tree_torch = {}, {}
    routes = [cpu_linear.route()] + (["torch"] if compare_torch and cpu_linear.route() != "torch" else [])
    for b, budget in trees:
        base, extra = divmod(budget, k + 1)
        plan = [base + (1 if i < extra else 0) for i in range(k + 1)]  # uniform: the cost depends on ΣF only
        reqs = []
        for i in range(b):
            toks = torch.randint(0, cfg.vocab_size, (context + 1 + k,), generator=g).tolist()
            ext = model.pool.alloc(context + 2 * (k + 1) + k * budget + 64)
            r = RequestState(f"r{i}", "", i, params, i, toks[: context + 1], ext)
            pos = torch.arange(context)
            model.forward([Span(ext[0], torch.tensor(toks[:context]), pos, pos, context, out_rows=empty)])
            r.kv_len, r.spec = context, toks[context + 1 :]
            reqs.append(r)
        times = {route: ([], [], []) for route in routes}
        for rep, route in itertools.product(range(repeats + 1), routes):  # the first round warms up
            with cpu_linear.use_route(route):
                glue_ms, step_ms, round_ms = tree_round(model, reqs, plan, k)
            if rep:
                for series, value in zip(times[route], (glue_ms, step_ms, round_ms)):
                    series.append(value)
        for r in reqs:
            model.pool.release(*r.extent)
        key = f"{b}x{budget}"
        if len(routes) > 1:
            tg, ts, tr = times["torch"]
            tree_torch[key] = {"glue_ms": median_ms(tg), "step_ms": median_ms(ts), "round_ms": median_ms(tr)}
        glue_t, step_t, round_t = times[routes[0]]
        tree_out[key] = {
            "batch": b,
            "budget": budget,
            "k": k,
            "tokens_per_step": b * budget,
            "glue_ms": median_ms(glue_t),
            "step_ms": median_ms(step_t),
            "round_ms": median_ms(round_t),
            "min": {
                "glue_ms": round(min(glue_t), 3),
                "step_ms": round(min(step_t), 3),
                "round_ms": round(min(round_t), 3),
            },
        }
        t = tree_out[key]
        log(f"  tree {key} (K={k}, {b * budget} branch tokens/step): glue {t['glue_ms']:.2f} ms, "
            f"step {t['step_ms']:.2f} ms, whole round {t['round_ms']:.2f} ms")  # fmt: skip
        if key in tree_torch:
            log(f"  tree {key} on the torch route: step {tree_torch[key]['step_ms']:.2f} ms, "
                f"whole round {tree_torch[key]['round_ms']:.2f} ms")  # fmt: skip
    return {
        "num_layers": cfg.num_layers,
        "hidden_size": cfg.hidden_size,
        "vocab_size": cfg.vocab_size,
        "dtype": str(model.dtype).replace("torch.", ""),
        "runner": f"sglang_ssd.draft.model.DraftModel ({type(model.attn).__name__}, "
                  f"{sum(t.dtype is torch.bfloat16 for t in linear_weights(model.w))} of "
                  f"{len(linear_weights(model.w))} linear weights stored bf16)",
        "linear_route": cpu_linear.describe(),
        **({"tree_torch_route": tree_torch} if tree_torch else {}),
        "temperature": temperature,
        "chain_ms": chain_ms,
        "decode_ms": decode_ms,
        "tree": tree_out,
        "min": mins,
    }


def tree_round(model: DraftModel, reqs: list, plan: list[int], k: int) -> tuple[float, float, float]:
    """One pre-speculation round as the draft server runs it: (glue ms, median branch-step ms, round ms)."""
    t0 = time.perf_counter()
    logits = model.forward([glue_span(r) for r in reqs])
    t1 = time.perf_counter()
    for r, lg in zip(reqs, logits):
        r.tree = select_forks(r, lg, plan, model, k)
        r.stage = Stage.TREE
    steps = []
    for _ in range(k):
        s0 = time.perf_counter()
        step_logits = model.forward([tree_span(r) for r in reqs])
        for r, lg in zip(reqs, step_logits):
            advance_tree(r, lg, model, 1.0)
        steps.append((time.perf_counter() - s0) * 1e3)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, statistics.median(steps), (t2 - t0) * 1e3


def parse_ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def calibrate_l0(path: Path, context: int, m: int, repeats: int) -> dict:
    """L0 (n-gram) cost: ms per proposed token, greedy chains of ``m`` after a ``context``-token history
    (a prompt-set text, so the context lookup scans a realistic history)."""
    from sglang_ssd.draft.ngram import NgramDraft
    from sglang_ssd.prompts import load_prompts

    model = NgramDraft.load(path)
    text = " ".join(p.prompt for p in load_prompts(limit=40))
    rng = torch.Generator().manual_seed(0)
    vocab = model.vocab_size or 49152
    ids = [ord(ch) % vocab for ch in text][:context]  # only the lookup's scan length matters here
    ids += torch.randint(0, vocab, (max(0, context - len(ids)),), generator=rng).tolist()
    times = []
    for r in range(repeats * 10):
        ctx = ids[: context - (r % 7)]
        t0 = time.perf_counter()
        model.propose(ctx, m)
        times.append((time.perf_counter() - t0) * 1000 / m)
    return {"path": str(path), "context": context, "tokens": m, "ms_per_token": statistics.median(times),
            "min_ms_per_token": min(times)}  # fmt: skip


CURVE_PREFIX = "    verify curve: T_v(n)/T_v(1) for n = 1..8 = "
DRAFT_PREFIX = "draft: "
WEIGHTS = ROOT / "sglang_ssd" / "tools" / "weights"  # the shipped draft and its evaluations


def curve_line(target: dict) -> str:
    """The fixed-form line bench/README.md carries (batch 1, the route the server uses)."""
    row = target["verify_ms_by_batch"]["1"][:8]
    line = CURVE_PREFIX + " ".join(f"{t / row[0]:.2f}" for t in row)
    line += f" (bare forward, {target['linear_route']}; attention: {target.get('attention', 'transformers SDPA')})"
    old = target.get("verify_ms_torch_route_by_batch", {}).get("1")
    if old:
        line += ("; torch route " + " ".join(f"{t / old[0]:.2f}" for t in old[:8])
                 + f"; T_v(1) {row[0]:.1f} ms vs {old[0]:.1f} ms on the torch route")  # fmt: skip
    return line


def draft_line(result: dict, draft: Path, weights: Path = WEIGHTS) -> str | None:
    """The `draft:` fixed-form line: the shipped draft's greedy α (its own held-out evaluations, written
    by ``python -m sglang_ssd.tools.draft_eval``), its one-token forward over the target's plain
    forward as this run measured both, and its head's size. None without a draft measurement."""
    d = result.get("draft")
    if not d or not d.get("decode_ms"):
        return None
    alpha = {name: json.loads((weights / f"draft_eval_{name}.json").read_text())["greedy"]["alpha_per_token"]
             for name in ("sharegpt_held_out", "prompt_set")}  # fmt: skip
    config = Path(draft) / "config.json"
    head = json.loads(config.read_text()).get("draft_vocab_size") if config.is_file() else None
    step, target = d["decode_ms"]["1"], result["target"]["verify_ms"][0]
    return (f"{DRAFT_PREFIX}greedy α = {alpha['sharegpt_held_out']:.3f} (ShareGPT held-out), "
            f"{alpha['prompt_set']:.3f} (prompt set); step = {step / target:.2f} of a target step; "
            f"head = {head or d['vocab_size']} tokens (one-token forwards, batch 1, bench/calibrate.py: "
            f"draft {step:.2f} ms, target {target:.2f} ms)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=str(ROOT / "models" / "target"))
    ap.add_argument("--draft", default=str(ROOT / "models" / "draft"))
    ap.add_argument(
        "--draft-layers", type=int, default=4, help="stand-in draft depth when --draft is missing"
    )
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--max-n", type=int, default=9, help="T_v(n) for n = 1..max-n (K ≤ max-n − 1)")
    ap.add_argument("--k", type=int, default=7, help="K of the timed tree rounds")
    ap.add_argument("--target-batches", default="", help="extra target batch sizes, e.g. 2,4")
    ap.add_argument("--decode-batches", default="1,2,4,8")
    ap.add_argument("--trees", default="1x12,1x24,1x48,4x24", help="BxF: requests × ΣF_k branches")
    ap.add_argument("--temperature", type=float, default=0.0, help="draft sampling in the timed trees")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--quick", action="store_true", help="few repeats, batch 1 only, two trees (< 2 min)")
    ap.add_argument("--skip-draft", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "calibration.json"))
    ap.add_argument("--l0", default=str(ROOT / "models" / "ngram.json"), help="n-gram L0 to time (if present)")
    ap.add_argument("--l0-only", action="store_true", help="time L0 only and add it to an existing --out JSON")
    ap.add_argument("--no-readme", action="store_true", help="do not update bench/README.md's fixed-form lines")
    ap.add_argument("--lines-only", action="store_true",
                    help="write the verify curve and draft lines from an existing --out JSON; measure nothing")
    ap.add_argument("--compare-torch", action="store_true",
                    help="also time the target through plain F.linear (today's route), interleaved")  # fmt: skip
    args = ap.parse_args(argv)
    if args.context < 1:
        raise ValueError(f"context must be ≥ 1, got {args.context}")
    if args.max_n < 1:
        raise ValueError(f"max_n must be ≥ 1, got {args.max_n}")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    keep_freed_memory()  # the servers' malloc policy (sglang_ssd/cpu/allocator.py)
    repeats = 7 if args.quick else args.repeats
    if args.lines_only:  # the README lines of an earlier run, nothing measured
        write_lines(json.loads(Path(args.out).read_text()), Path(args.draft), readme=not args.no_readme)
        return
    if args.l0_only:
        out = Path(args.out)
        result = json.loads(out.read_text())
        result["l0"] = calibrate_l0(Path(args.l0), args.context, 3, repeats)
        out.write_text(json.dumps(result, indent=1) + "\n")
        log(f"L0: {result['l0']['ms_per_token']:.3f} ms per proposed token; wrote {out}")
        return
    target_batches = [1] + [b for b in parse_ints(args.target_batches) if b != 1]
    decode_batches = parse_ints(args.decode_batches)
    trees = [tuple(int(x) for x in t.split("x")) for t in args.trees.split(",") if t.strip()]
    if args.quick:
        target_batches, decode_batches, trees = [1], [1, 4], [(1, 12), (1, 24)]
    started = time.perf_counter()
    info = machine_info()
    log(f"machine: {info['cpu']}, {info['logical_cpus']} logical CPUs, torch {info['torch']}, "
        f"{info['torch_threads']} thread, load average {info['loadavg_start'][0]:.2f}")  # fmt: skip
    log(f"mode: {'quick' if args.quick else 'full'}, {repeats} repeats (median), context {args.context}")
    result: dict = {
        "version": 1,
        "machine": info,
        "context": args.context,
        "repeats": repeats,
        "quick": args.quick,
        "target": calibrate_target(
            Path(args.target), args.context, args.max_n, target_batches, repeats, args.compare_torch
        ),
    }
    if args.skip_draft:
        result["draft"] = None
        log("draft: skipped (--skip-draft)")
    else:
        k = args.k
        slots = (max(decode_batches) + 1) * (args.context + args.max_n + 8)
        slots += sum(b * (args.context + 2 * (k + 1) + k * f + 64) for b, f in trees) + 1024
        model, source = load_draft(Path(args.draft), Path(args.target), args.draft_layers, slots)
        result["draft"] = source | calibrate_draft(
            model, args.context, args.max_n, k, decode_batches, trees, repeats, args.temperature, args.compare_torch
        )
    if Path(args.l0).is_file():
        result["l0"] = calibrate_l0(Path(args.l0), args.context, 3, repeats)
        log(f"L0 (n-gram): {result['l0']['ms_per_token']:.3f} ms per proposed token")
    info["loadavg_end"] = list(os.getloadavg())
    result["elapsed_s"] = round(time.perf_counter() - started, 1)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    log(f"wrote {out} in {result['elapsed_s']} s (load average at the end {info['loadavg_end'][0]:.2f})")
    write_lines(result, Path(args.draft), readme=not args.no_readme)


def write_lines(result: dict, draft: Path, readme: bool) -> None:
    """Log the fixed-form lines of a calibration and, unless told not to, write them into bench/README.md."""
    from bench.readme_blocks import write_line

    line = curve_line(result["target"])
    log(line.strip())
    if readme:
        write_line(CURVE_PREFIX.strip(), line.strip())
    dline = draft_line(result, draft)
    if dline:
        log(dline)
        if readme:
            write_line(DRAFT_PREFIX, dline)


if __name__ == "__main__":
    main()
