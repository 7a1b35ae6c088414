"""Rebuild one stored answer batch by teacher forcing and compare it with the generated (cached) one.

    python bench/datagen_rebuild.py TAG BATCH   (from the repository root; needs models/draft_data)

Prints one JSON line: the rebuild's CPU and wall seconds against the generation's recorded wall
seconds, and how far the rebuilt top-32 is from the recorded one (top-1 agreement, top-8 overlap,
total variation between the softmaxes over each top-32).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch


def top_tv(ids_a, vals_a, ids_b, vals_b) -> float:
    """Total variation between the softmaxes over two top-k lists (shift-invariant: logits or logprobs)."""
    pa = dict(zip(ids_a.tolist(), torch.softmax(vals_a.float(), 0).tolist()))
    pb = dict(zip(ids_b.tolist(), torch.softmax(vals_b.float(), 0).tolist()))
    return 0.5 * sum(abs(pa.get(t, 0.0) - pb.get(t, 0.0)) for t in pa.keys() | pb.keys())


def main(tag: str, bi: int) -> dict:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_ssd.tools.draft_data import ANSWERS, AnswerStore

    torch.set_num_threads(1)
    cached = torch.load(f"models/draft_data/{tag}_batch_{bi:04d}.pt")
    store = AnswerStore(Path(ANSWERS) / f"{tag}.npz")
    tok = AutoTokenizer.from_pretrained("models/target")
    model = AutoModelForCausalLM.from_pretrained("models/target", dtype=torch.float32).eval()
    prompts = [r["prompt"].tolist() for r in cached]
    cpu0, wall0 = time.process_time(), time.time()
    rebuilt = store.rebuild(bi, prompts, model, cached[0]["top_ids"].shape[1], tok.pad_token_id)
    cpu, wall = time.process_time() - cpu0, time.time() - wall0
    n = sum(len(r["answer"]) for r in cached)
    pairs = list(zip(rebuilt, cached))
    top1 = sum(int((a["top_ids"][:, 0] == b["top_ids"][:, 0]).sum()) for a, b in pairs) / n
    overlap = sum(len(set(x.tolist()) & set(y.tolist())) for a, b in pairs
                  for x, y in zip(a["top_ids"][:, :8], b["top_ids"][:, :8])) / (8 * n)  # fmt: skip
    tvs = sorted(top_tv(*row) for a, b in pairs
                 for row in zip(a["top_ids"], a["top_logits"], b["top_ids"], b["top_logits"]))  # fmt: skip
    return {"tag": tag, "batch": bi, "sequences": len(cached), "answer_tokens": n,
            "prompt_tokens": sum(map(len, prompts)), "rebuild_cpu_s": round(cpu, 1), "rebuild_wall_s": round(wall, 1),
            "generation_wall_s": round(sum(r["gen_wall_s"] for r in cached), 1), "top1_equal": round(top1, 4),
            "top8_overlap": round(overlap, 4), "tv_top32_median": round(tvs[len(tvs) // 2], 5),
            "tv_top32_max": round(tvs[-1], 4)}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], int(sys.argv[2]))))
