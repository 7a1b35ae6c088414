"""Evaluate a draft against the target: acceptance, cost, size.

    python -m sglang_ssd.tools.draft_eval --target models/target --draft models/draft \\
        [--prompts held-out|sharegpt-held-out|prompt-set|train] [--max-new 96] [--json out.json]

Measures, on one prompt set (the 40 hand-written held-out prompts by default; the held-out ShareGPT
slice; the project's 200-prompt set; or, labelled, training prompts):
- Greedy acceptance: along the target's greedy continuation, the rate at which the draft's argmax equals
  the target's next token (per-token α). With greedy verification a chain round accepts exactly the run
  of agreements from its start (the draft's proposals follow the target's own prefix until the first
  disagreement), so chain SD with K drafted tokens is replayed exactly from these agreements: reported as
  mean tokens per round E_K (accepted + bonus) and α_chain,K = accepted / proposed.
- T = 0.7: along target samples at T = 0.7, the expected acceptance Σ_v min(p, q) with p, q the target's
  and draft's softmax(logits / 0.7) (p truncated to its top 256 entries; the bound on what that drops is
  reported).
- Cost: wall and CPU ms of one single-token forward with KV cache at batch 1, one thread, context of the
  same length for both models, the two models timed alternately; medians.
- Parameter counts (all, and those read per token: the embedding lookup reads one row) and file sizes.
Target continuations are written by an AR SGLang server (`--route server`, the default; `--route hf`:
transformers) and cached under models/draft_data/ (they do not depend on the draft).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from sglang_ssd.prompts import chat_ids
from sglang_ssd.tools.draft_data import generate_batch
from sglang_ssd.tools.draft_model import load_draft
from sglang_ssd.tools.draft_prompts import held_out_prompts, training_prompts

P_TOP = 256


def chain_replay(agree: list[bool], k: int) -> tuple[int, int, int]:
    """Greedy chain SD with `k` drafted tokens per round over one continuation whose per-position
    draft/target agreement is `agree`; returns (rounds, accepted, emitted tokens)."""
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    i = rounds = accepted = 0
    n = len(agree)
    while i < n:
        run = 0
        while run < k and i + run < n and agree[i + run]:
            run += 1
        rounds += 1
        accepted += run
        i += run + 1
    return rounds, accepted, n


@torch.inference_mode()
def target_references(target, tokenizer, prompts: list[str], max_new: int, temperature: float,
                      cache_dir: Path, route: str = "server", target_dir: Path | None = None) -> list[dict]:
    """Target continuations of `prompts` (greedy if temperature is 0, else seeded samples), cached; for
    sampled ones also the target's top-256 probabilities at T along the sample (teacher-forced here).
    ``route``: "server", an AR SGLang server answers (draft_data.py's fastest route), or "hf", the
    transformers loop (the route of the references cached before the server route existed)."""
    key_parts = [prompts, max_new, temperature] + ([route] if route != "hf" else [])  # hf keys predate routes
    key = hashlib.sha256(json.dumps(key_parts).encode()).hexdigest()[:16]
    path = cache_dir / f"eval_ref_{key}.pt"
    if path.is_file():
        return torch.load(path)
    ids = [chat_ids(tokenizer, p)[-512:] for p in prompts]  # the same cut as the training data
    refs = _server_refs(target_dir, ids, max_new, temperature) if route == "server" else _hf_refs(
        target, tokenizer, ids, max_new, temperature)
    if temperature > 0:
        for r in tqdm(refs, desc="target teacher-forced"):
            x = torch.cat([r["prompt"], r["answer"]])[None]
            logits = target(input_ids=x).logits[0, len(r["prompt"]) - 1: -1].float()
            p = torch.softmax(logits / temperature, dim=-1)
            v, ix = p.topk(P_TOP, dim=-1)
            r["p_ids"], r["p_vals"] = ix, v
    refs = [{"prompt": r["prompt"], "answer": r["answer"], **{k: r[k] for k in ("p_ids", "p_vals") if k in r}}
            for r in refs]  # fmt: skip
    cache_dir.mkdir(parents=True, exist_ok=True)
    torch.save(refs, path)
    return refs


def _hf_refs(target, tokenizer, ids: list[list[int]], max_new: int, temperature: float) -> list[dict]:
    gen = torch.Generator().manual_seed(1234)
    refs = []
    for i in tqdm(range(0, len(ids), 20), desc=f"target refs T={temperature}"):
        refs += generate_batch(target, ids[i: i + 20], max_new, temperature, 1, tokenizer.eos_token_id,
                               tokenizer.pad_token_id, gen)
    return refs


def _server_refs(target_dir: Path, ids: list[list[int]], max_new: int, temperature: float, batch: int = 32) -> list[dict]:
    from sglang_ssd.tools.draft_data import _start_server, server_batch

    server = _start_server(target_dir, batch, 512 + max_new)
    try:
        refs = []
        for i in tqdm(range(0, len(ids), batch), desc=f"target refs T={temperature} (server)"):
            refs += server_batch(server, ids[i: i + batch], max_new, temperature, 1, seed=1234 + i)
        return refs
    finally:
        server.stop()


@torch.inference_mode()
def draft_logits(draft, r: dict) -> torch.Tensor:
    """Draft's full-vocabulary logits [N, V] at the positions that predict r['answer']."""
    x = torch.cat([r["prompt"], r["answer"]])[None]
    return draft(input_ids=x).logits[0, len(r["prompt"]) - 1: -1].float()


def greedy_stats(draft, refs: list[dict], ks=(2, 4, 5, 6, 7), fanouts=(1, 2, 3, 4)) -> dict:
    """Per-token α, chain replays E_K, and the top-F coverage of the bonus after a rejection: at the
    positions where the draft's argmax is wrong, how often the target's token is among the draft's
    next F candidates (ranks 2..F+1). That is what a fan-out of F per position must cover for the
    speculation cache to hit after a rejection."""
    agrees, ranks = [], []
    for r in refs:
        logits = draft_logits(draft, r)
        agrees.append((logits.argmax(-1) == r["answer"]).tolist())
        target_logit = logits.gather(-1, r["answer"][:, None])
        ranks += (logits > target_logit).sum(-1).tolist()  # 0 = the draft's argmax
    flat = [a for ag in agrees for a in ag]
    out = {"alpha_per_token": sum(flat) / len(flat), "positions": len(flat)}
    for k in ks:
        rounds = acc = 0
        for ag in agrees:
            r, a, _ = chain_replay(ag, k)
            rounds, acc = rounds + r, acc + a
        out[f"E_K{k}"] = (acc + rounds) / rounds
        out[f"alpha_chain_K{k}"] = acc / (k * rounds)
    missed = [rank for rank in ranks if rank > 0]
    for f in fanouts:
        out[f"bonus_coverage_F{f}"] = sum(rank <= f for rank in missed) / max(len(missed), 1)
    return out


def sampled_stats(draft, refs: list[dict], temperature: float) -> dict:
    total = dropped = 0.0
    worst = 0.0
    n = 0
    for r in refs:
        q = torch.softmax(draft_logits(draft, r) / temperature, dim=-1)
        qv = q.gather(-1, r["p_ids"])
        total += torch.minimum(r["p_vals"], qv).sum().item()
        miss = 1 - r["p_vals"].sum(-1)
        dropped += miss.sum().item()
        worst = max(worst, miss.max().item())
        n += len(r["answer"])
    return {"alpha_expected": total / n, "positions": n, "p_mass_outside_top256_mean": dropped / n,
            "p_mass_outside_top256_max": worst}


@torch.inference_mode()
def forward_cost(target, draft, context: list[int], steps: int = 12, reps: int = 5) -> dict:
    """Median wall/CPU ms of one single-token KV-cached forward (batch 1), models timed alternately."""
    def session(model):
        x = torch.tensor([context])
        out = model(input_ids=x, use_cache=True, logits_to_keep=1)
        return out.past_key_values, len(context)

    samples = {"target": ([], []), "draft": ([], [])}
    for _ in range(reps):
        for name, model in (("target", target), ("draft", draft)):
            past, pos = session(model)
            tok = torch.tensor([[context[-1]]])
            for _ in range(steps):
                w, c = time.perf_counter(), time.process_time()
                out = model(input_ids=tok, past_key_values=past, use_cache=True,
                            position_ids=torch.tensor([[pos]]))
                samples[name][0].append((time.perf_counter() - w) * 1e3)
                samples[name][1].append((time.process_time() - c) * 1e3)
                past, pos = out.past_key_values, pos + 1
                tok = out.logits[:, -1:].argmax(-1)
    res = {}
    for name, (wall, cpu) in samples.items():
        res[f"{name}_ms_wall"] = statistics.median(wall)
        res[f"{name}_ms_cpu"] = statistics.median(cpu)
    res["cost_ratio_wall"] = res["draft_ms_wall"] / res["target_ms_wall"]
    res["cost_ratio_cpu"] = res["draft_ms_cpu"] / res["target_ms_cpu"]
    res["context_tokens"] = len(context)
    return res


def param_counts(model) -> dict:
    total = sum(p.numel() for p in model.parameters())
    emb = model.model.embed_tokens.weight.numel()
    head = model.lm_head.weight
    tied = head is model.model.embed_tokens.weight
    # Read per token: all weights but the embedding table (one row is read); a tied head reads it whole.
    read = total - emb + (emb if tied else 0)
    return {"params_total": total, "params_read_per_token": read, "head_rows": head.shape[0]}


PROMPT_SETS = ("held-out", "sharegpt-held-out", "prompt-set", "train")


def eval_prompts(which: str) -> list[str]:
    """The prompts of one evaluation set. Held out from training: the 40 hand-written prompts, the
    256-prompt held-out ShareGPT slice (sglang_ssd/sharegpt.py) and the project's 200-prompt set;
    'train' (40 template prompts) is a labelled control."""
    if which == "held-out":
        return [p for _, p in held_out_prompts()]
    if which == "sharegpt-held-out":
        from sglang_ssd.sharegpt import load_sharegpt

        return [p.prompt for p in load_sharegpt("held_out")]
    if which == "prompt-set":
        from sglang_ssd.prompts import load_prompts

        return [p.prompt for p in load_prompts()]
    if which == "train":
        return [p for _, p in training_prompts(40, seed=0)]
    raise ValueError(f"prompts must be one of {PROMPT_SETS}, got {which!r}")


def evaluate(target_dir: Path, draft_dir: Path, which: str, max_new: int, cache_dir: Path,
             route: str = "server") -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    draft = load_draft(draft_dir)
    prompts = eval_prompts(which)
    report: dict = {"prompts": which, "n_prompts": len(prompts), "max_new": max_new,
                    "greedy_measure": "next-token argmax agreement along the target's greedy continuation; "
                                      "E_K / alpha_chain_K replay greedy chain SD exactly"}
    report["reference_route"] = route
    greedy_refs = target_references(target, tokenizer, prompts, max_new, 0.0, cache_dir, route, target_dir)
    report["greedy"] = greedy_stats(draft, greedy_refs)
    sampled_refs = target_references(target, tokenizer, prompts, max_new, 0.7, cache_dir, route, target_dir)
    report["t0.7"] = sampled_stats(draft, sampled_refs, 0.7)
    ctx = torch.cat([greedy_refs[0]["prompt"], greedy_refs[0]["answer"]]).tolist()
    ctx = (ctx * 4)[:200]
    report["cost"] = forward_cost(target, draft, ctx)
    report["draft_params"] = param_counts(draft)
    report["target_params"] = param_counts(target)
    report["draft_params"]["read_ratio"] = (report["draft_params"]["params_read_per_token"]
                                            / report["target_params"]["params_read_per_token"])
    report["files_MB"] = {"draft_folder_model": (draft_dir / "model.safetensors").stat().st_size / 1e6}
    c = report["cost"]["cost_ratio_wall"]
    report["speedup_model"] = {
        f"K{k}": {"E": report["greedy"][f"E_K{k}"],
                  "E_over_1_plus_Kc": report["greedy"][f"E_K{k}"] / (1 + k * c),
                  "E_over_1_plus_c": report["greedy"][f"E_K{k}"] / (1 + c)}
        for k in (2, 4, 5, 6, 7)}
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, default=Path("models/target"))
    ap.add_argument("--draft", type=Path, default=Path("models/draft"))
    ap.add_argument("--prompts", choices=PROMPT_SETS, default="held-out")
    ap.add_argument("--max-new", type=int, default=96)
    ap.add_argument("--cache", type=Path, default=Path("models/draft_data"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--route", choices=("server", "hf"), default="server",
                    help="who writes the target's reference continuations: an AR SGLang server or transformers")
    args = ap.parse_args(argv)
    report = evaluate(args.target, args.draft, args.prompts, args.max_new, args.cache, args.route)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
