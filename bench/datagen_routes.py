"""Which route generates the draft's training data fastest on this machine: the batched transformers
loop of `sglang_ssd.tools.draft_data`, or an AR SGLang server answering a batch (with the top-32
logprobs the distillation needs). Both answer the same ShareGPT training prompts greedily, one thread
each, timed in one run; prints answer tokens per second of each route and their ratio.

    python bench/datagen_routes.py [--prompts 32] [--max-new 64] [--batch 32]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_ssd.prompts import chat_ids  # noqa: E402
from sglang_ssd.sharegpt import load_sharegpt  # noqa: E402
from sglang_ssd.tools.draft_data import generate_batch  # noqa: E402
from sglang_ssd.tools.server_process import CPU_SERVER_ARGS, SGLangServer  # noqa: E402


def hf_route(target: Path, ids: list[list[int]], max_new: int, batch: int, eos: int, pad: int) -> tuple[int, float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))  # as draft_data does: less padding
    t0, tokens = time.perf_counter(), 0
    for a in range(0, len(order), batch):
        recs = generate_batch(model, [ids[i] for i in order[a : a + batch]], max_new, 0.0, 32, eos, pad)
        tokens += sum(len(r["answer"]) for r in recs)
    return tokens, time.perf_counter() - t0


def sglang_route(target: Path, ids: list[list[int]], max_new: int, batch: int) -> tuple[int, float]:
    argv = ["--model-path", str(target), *CPU_SERVER_ARGS, "--max-running-requests", str(batch)]
    with SGLangServer(argv, log_path="/tmp/sglang_ssd_datagen_bench.log") as server:
        server.generate(ids[0], {"temperature": 0, "max_new_tokens": 4})  # warm-up
        t0 = time.perf_counter()
        outs = server.generate(ids, {"temperature": 0, "max_new_tokens": max_new}, return_logprob=True,
                               top_logprobs_num=32)  # fmt: skip
        wall = time.perf_counter() - t0
    return sum(len(o["output_ids"]) for o in outs), wall


def main(argv: list[str] | None = None) -> int:
    from transformers import AutoTokenizer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, default=ROOT / "models" / "target")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(str(args.target))
    ids = [chat_ids(tok, p.prompt)[-512:] for p in load_sharegpt("train", limit=args.prompts)]
    hf_tokens, hf_s = hf_route(args.target, ids, args.max_new, args.batch, tok.eos_token_id, tok.pad_token_id)
    sg_tokens, sg_s = sglang_route(args.target, ids, args.max_new, args.batch)
    report = {"prompts": len(ids), "max_new": args.max_new, "batch": args.batch,
              "hf_loop": {"tokens": hf_tokens, "s": round(hf_s, 1), "tok_s": round(hf_tokens / hf_s, 1)},
              "sglang_server": {"tokens": sg_tokens, "s": round(sg_s, 1), "tok_s": round(sg_tokens / sg_s, 1)}}  # fmt: skip
    report["sglang_over_hf"] = round(report["sglang_server"]["tok_s"] / report["hf_loop"]["tok_s"], 2)
    print(json.dumps(report, indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
