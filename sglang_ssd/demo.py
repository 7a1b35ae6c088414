"""`make demo`: the embedded pair served by SGLang on this CPU, AR vs SSD.

Starts the AR server (target only) and the SSD server (target on core 0, draft server on core 1),
sends a few prompts of each kind to both, prints the answers, tokens/s and the SSD cache hit rate.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from sglang_ssd.cpu import linear as cpu_linear
from sglang_ssd.prompts import load_prompts
from sglang_ssd.tools.server_process import CPU_SERVER_ARGS, SGLangServer

ROOT = Path(__file__).resolve().parents[1]


def _chat(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _run(server: SGLangServer, prompts: list[list[int]], max_new: int) -> tuple[list[dict], float, int]:
    outs, tokens, t0 = [], 0, time.perf_counter()
    for i, ids in enumerate(prompts, 1):
        out = server.generate(ids, {"temperature": 0, "max_new_tokens": max_new})
        tokens += out["meta_info"]["completion_tokens"]
        outs.append(out)
        print(f"  [{i}/{len(prompts)}] {out['meta_info']['completion_tokens']} tokens", flush=True)
    return outs, time.perf_counter() - t0, tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(ROOT / "models" / "target"))
    ap.add_argument("--draft", default=str(ROOT / "models" / "draft"))
    ap.add_argument("--per-kind", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--ssd-k", default="4")
    args = ap.parse_args(argv)
    for name, path in (("--target", args.target), ("--draft", args.draft)):
        if not (Path(path) / "config.json").is_file():
            print(f"error: {name} {path}: not a model folder (run `make models`)", file=sys.stderr)
            return 2
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.target)
    chosen = [p for kind in ("chat", "math", "code", "feedback") for p in load_prompts(kind, limit=args.per_kind)]
    prompts = [_chat(tok, p.prompt) for p in chosen]
    two_cores = len(os.sched_getaffinity(0)) >= 2
    base = ["--model-path", args.target, *CPU_SERVER_ARGS]
    ssd_args = [*base, "--speculative-algorithm", "SSD", "--speculative-draft-model-path", args.draft,
                "--ssd-k", args.ssd_k, "--ssd-backup", "neural"]
    if two_cores:
        ssd_args += ["--ssd-draft-cores", "1"]
    results = {}
    for name, argv_ in (("AR", base), ("SSD", ssd_args)):
        print(f"starting the {name} server (about a minute on 2 cores) ...", flush=True)
        with SGLangServer(argv_, cpu_cores={0} if two_cores else None) as server:
            print(f"{name} server ready in {server.start_seconds:.0f} s", flush=True)
            outs, seconds, tokens = _run(server, prompts, args.max_new_tokens)
            state = server.get("/server_info")["internal_states"][0]
        results[name] = (outs, seconds, tokens, state)
    for p, ar, ssd in zip(chosen, results["AR"][0], results["SSD"][0]):
        print(f"\n[{p.kind}] {p.prompt}\n  -> {ssd['text'].strip()[:400]}")
        print(f"  (identical to AR: {ar['output_ids'] == ssd['output_ids']})")
    print()
    for name, (_, seconds, tokens, state) in results.items():
        extra = ""
        if name == "SSD":
            extra = (f", hit rate {state.get('ssd_hit_rate', 0):.2f}, alpha {state.get('ssd_alpha', 0):.2f}, "
                     f"accept length {state.get('avg_spec_accept_length', 0):.2f}")
        print(f"{name:4s}: {tokens / seconds:6.1f} tokens/s ({tokens} tokens in {seconds:.1f} s){extra}")
    ratio = (results["SSD"][2] / results["SSD"][1]) / (results["AR"][2] / results["AR"][1])
    print(f"SSD/AR = {ratio:.2f}")
    # Both servers ran their linears on this route (their logs say so): SGLANG_SSD_CPU_LINEAR=torch for A/B.
    print(f"CPU linear route: {cpu_linear.setting()} ({cpu_linear.ENV})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
