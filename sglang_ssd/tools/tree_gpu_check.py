"""GPU check of the draft server's branch tree (only where a CUDA device is available).

1. agreement: the FlashInfer paged tree attention (custom masks) and the Triton kernel against the torch
   reference path, on the same spans — prefill, glue chains and every branch step of a real
   pre-speculation — reported as the largest logit difference relative to the logit scale, and the
   fraction of equal argmaxes (a backend that cannot be imported is reported as such);
2. timing: one tree step (B·ΣF tokens) and one glue forward for a Llama-3.2-1B-shaped draft with
   random weights (weights do not change the time), K = 7, uniform F = 3 (ΣF = 24), b ∈ {1, 4, 16},
   with each attention backend; the glue forward (K+1 tokens a request) is the plain-decode reference
   at a comparable token count.

    python -m sglang_ssd.tools.tree_gpu_check --out out/draft_gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path

import torch

from sglang_ssd.draft.engine import DraftEngine, EngineConfig
from sglang_ssd.draft.model import DraftModel
from sglang_ssd.draft.model_config import ModelConfig
from sglang_ssd.wire.messages import DraftParams

from .random_model import random_weights

LLAMA_1B = {
    "model_type": "llama", "vocab_size": 128256, "hidden_size": 2048, "intermediate_size": 8192,
    "num_hidden_layers": 16, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64,
    "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": True, "max_position_embeddings": 131072,
    "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}  # fmt: skip
SMALL = {**LLAMA_1B, "vocab_size": 8192, "hidden_size": 512, "intermediate_size": 1024, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 2}  # fmt: skip


def _pair(cfg_dict: dict, device: str, dtype: torch.dtype, kv_slots: int, other: str = "flashinfer"):
    """Two runners sharing one set of weights: the torch reference and ``other`` attention."""
    cfg = ModelConfig.from_dict(cfg_dict)
    w = random_weights(cfg, dtype, torch.device(device))
    ref = DraftModel(None, device, dtype, kv_slots, attention="torch", parts=(cfg, w))
    fi = DraftModel(None, device, dtype, kv_slots, attention=other, parts=(cfg, w))
    return ref, fi


def agreement(
    device: str = "cuda:0", dtype: torch.dtype = torch.bfloat16, cfg: dict = SMALL, other: str = "flashinfer"
) -> dict:
    """Run a pre-speculation with the torch path while mirroring every forward on ``other``."""
    ref, fi = _pair(cfg, device, dtype, kv_slots=1 << 15, other=other)
    rel, same = [], []
    forward = ref.forward

    def mirrored(spans):
        a = forward(spans)
        b = fi.forward(spans)  # same spans, same slots: fi's pool mirrors ref's
        for x, y in zip(a, b):
            if x.numel():
                rel.append(float((x - y).abs().max() / x.abs().max().clamp_min(1e-6)))
                same.append(float((x.argmax(-1) == y.argmax(-1)).float().mean()))
        return a

    ref.forward = mirrored
    engine = DraftEngine(ref, EngineConfig(k=7, fanout="uniform", budget=24, backup="neural"))
    g = torch.Generator().manual_seed(0)
    for i, n in enumerate((37, 300, 129)):
        prompt = torch.randint(0, ref.vocab_size, (n,), generator=g).tolist()
        engine.open(f"r{i}", prompt, 1, DraftParams(temperature=0.0))
    while engine.has_work():
        engine.work_step()
    return {
        "forwards": len(rel),
        "max_rel_logit_diff": max(rel),
        "mean_argmax_agreement": statistics.fmean(same),
        "ok": max(rel) < 0.05 and statistics.fmean(same) > 0.97,
    }


def _cuda_ms(fn, repeats: int) -> float:
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    out = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def _until_branched(engine: DraftEngine, reqs: list, max_steps: int = 64) -> None:
    """Work until every request has its tree and one branch step, so the timed step attends to earlier
    branch tokens. Large batches take several steps: prefill is chunked at ``max_step_tokens``."""
    for _ in range(max_steps):
        if all(r.tree is not None and r.tree.steps_done >= 1 for r in reqs):
            return
        engine.work_step()
    raise RuntimeError(f"requests not branched after {max_steps} work steps")


def available_backends() -> list[str]:
    """The GPU attention backends importable here (FlashInfer needs its wheel, Triton ships with torch)."""
    out = []
    for name, module in (("flashinfer", "flashinfer"), ("triton", "triton")):
        try:
            __import__(module)
            out.append(name)
        except Exception:  # noqa: BLE001 - any import failure means "not here"
            pass
    return out


def timing(device: str = "cuda:0", batches=(1, 4, 16), context: int = 512, repeats: int = 10,
           cfg_dict: dict = LLAMA_1B, backends: list[str] | None = None, dtype=torch.bfloat16) -> list[dict]:  # fmt: skip
    from sglang_ssd.draft.tree import glue_span, tree_span

    cfg = ModelConfig.from_dict(cfg_dict)
    w = random_weights(cfg, dtype, torch.device(device))
    rows = []
    for name in ("torch", *(available_backends() if backends is None else backends)):
        model = DraftModel(None, device, dtype, 1 << 16, attention=name, parts=(cfg, w))
        engine = DraftEngine(model, EngineConfig(k=7, fanout="uniform", budget=24, backup="fast"))
        g = torch.Generator().manual_seed(1)
        for b in batches:
            for rid in list(engine.requests):
                engine.close([rid])
            for i in range(b):
                prompt = torch.randint(0, model.vocab_size, (context,), generator=g).tolist()
                engine.open(f"r{i}", prompt, 1, DraftParams(temperature=0.0))
            for r in engine.requests.values():
                r.spec = (r.spec + [1] * 7)[:7]  # a full K-token speculation under verification
            reqs = list(engine.requests.values())
            _until_branched(engine, reqs)
            glue_ms = _cuda_ms(lambda m=model, reqs=reqs: m.forward([glue_span(r) for r in reqs]), repeats)
            tree_ms = _cuda_ms(lambda m=model, reqs=reqs: m.forward([tree_span(r) for r in reqs]), repeats)
            # The same tokens as plain causal rows (no tree mask): what decoding that many costs.
            plain = [replace(tree_span(r), mask=None) for r in reqs]
            plain_ms = _cuda_ms(lambda m=model, spans=plain: m.forward(spans), repeats)
            rows.append({"attention": name, "batch": b, "tokens": sum(r.tree.num_branches for r in reqs),
                         "context": context, "tree_step_ms": tree_ms, "plain_same_tokens_ms": plain_ms,
                         "glue_ms": glue_ms})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="out/draft_gpu_check.json")
    ap.add_argument("--device", default="cuda:0")
    args = ap.parse_args(argv)
    report = {"device": torch.cuda.get_device_name(args.device), "dtype": "bfloat16",
              "shape": "Llama-3.2-1B (random weights)", "k": 7, "fanout": "uniform 3 (sum 24)"}  # fmt: skip
    backends = available_backends()
    report["backends"] = backends or "neither flashinfer nor triton importable: torch timings only"
    report["agreement"] = {name: agreement(args.device, other=name) for name in backends}
    report["timing"] = timing(args.device)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0 if all(a["ok"] for a in report["agreement"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
