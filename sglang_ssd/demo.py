"""`make demo`: the embedded pair served by SGLang on this CPU, AR vs SSD.

Starts the AR server (target only) and the SSD server (target on core 0, draft server on core 1)
side by side, warms both up (the first request packs the weights for the CPU kernel), then sends a few
prompts of each kind to them in turn (AR, SSD, AR, SSD, ...: a load drift on the shared machine hits
both alike), and prints the answers, tokens/s, SSD/AR and the SSD cache hit rate.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from sglang_ssd.cpu import clib
from sglang_ssd.prompts import load_prompts
from sglang_ssd.target import metrics
from sglang_ssd.tools.server_process import CPU_SERVER_ARGS, SGLangServer

ROOT = Path(__file__).resolve().parents[1]


def _chat(tokenizer, text: str) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                        tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _timed(server: SGLangServer, ids: list[int], max_new: int) -> tuple[dict, float]:
    t0 = time.perf_counter()
    out = server.generate(ids, {"temperature": 0, "max_new_tokens": max_new})
    return out, time.perf_counter() - t0


def _ssd_line(before: dict, after: dict) -> str:
    """Hit rate, α and tokens per round over the timed requests (the counters minus the warm-up)."""
    w = metrics.window(before, after)
    if not w:
        return "no SSD round in the timed requests"
    return f"hit rate {w['hit_rate']:.2f}, alpha {w['alpha']:.2f}, {w['tokens_per_round']:.2f} tokens per round"


def _settings_line(server: SGLangServer) -> str:
    """What the launcher picked and why: its one ``sglang_ssd: SSD ...`` line in the server's log."""
    for line in server.log_path.read_text(errors="replace").splitlines():
        if line.startswith("sglang_ssd: SSD "):
            return line.removeprefix("sglang_ssd: ")
    return "the launcher's settings line is not in the server log"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(ROOT / "models" / "target"))
    ap.add_argument("--draft", default=str(ROOT / "models" / "draft"))
    ap.add_argument("--per-kind", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    # Unset, the SSD server launches as a user's would with no --ssd-* flag: the launcher picks K and ΣF.
    ap.add_argument("--ssd-k", default=None, help="e.g. 4 or auto (default: the launch default)")
    ap.add_argument("--ssd-budget", default=None, help="ΣF per tree (default: the launch default)")
    ap.add_argument("--ssd-backup", default=None, help="fast|neural|auto (default: the launch default)")
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
    flags = [(f, v) for f, v in (("--ssd-k", args.ssd_k), ("--ssd-budget", args.ssd_budget),
                                 ("--ssd-backup", args.ssd_backup)) if v is not None]  # fmt: skip
    ssd_args = [*base, "--speculative-algorithm", "SSD", "--speculative-draft-model-path", args.draft,
                *(x for pair in flags for x in pair)]
    if two_cores:
        ssd_args += ["--ssd-draft-cores", "1"]
    with SGLangServer(base, cpu_cores={0} if two_cores else None) as ar, \
            SGLangServer(ssd_args, cpu_cores={0} if two_cores else None) as ssd:
        servers = {"AR": ar, "SSD": ssd}
        settings = _settings_line(ssd)
        print(f"SSD server: {settings}", flush=True)
        for name, server in servers.items():
            print(f"{name} server ready in {server.start_seconds:.0f} s; warming up ...", flush=True)
            _timed(server, prompts[0], 8)
        # /server_info's SSD counters are cumulative: the warm-up is taken off below.
        before = ssd.get("/server_info")["internal_states"][0]
        outs = {name: [] for name in servers}
        seconds = dict.fromkeys(servers, 0.0)
        tokens = dict.fromkeys(servers, 0)
        for i, ids in enumerate(prompts, 1):
            for name, server in servers.items():
                out, dt = _timed(server, ids, args.max_new_tokens)
                outs[name].append(out)
                seconds[name] += dt
                tokens[name] += out["meta_info"]["completion_tokens"]
            print(f"  [{i}/{len(prompts)}] " + ", ".join(
                f"{name} {outs[name][-1]['meta_info']['completion_tokens']} tokens" for name in servers), flush=True)
        state = ssd.get("/server_info")["internal_states"][0]
    for p, a, b in zip(chosen, outs["AR"], outs["SSD"]):
        print(f"\n[{p.kind}] {p.prompt}\n  -> {b['text'].strip()[:400]}")
        print(f"  (identical to AR: {a['output_ids'] == b['output_ids']})")
    print()
    for name in servers:
        extra = ""
        if name == "SSD":
            extra = ", " + _ssd_line(before, state)
        print(f"{name:4s}: {tokens[name] / seconds[name]:6.1f} tokens/s ({tokens[name]} tokens in "
              f"{seconds[name]:.1f} s){extra}")
    ratio = (tokens["SSD"] / seconds["SSD"]) / (tokens["AR"] / seconds["AR"])
    given = " ".join(f"{f} {v}" for f, v in flags) or "no --ssd-* flag"
    print(f"SSD/AR = {ratio:.2f} ({given}: {settings}; one short run: `make bench` measures with repeats "
          "and a noise band)")
    # Both servers ran their linears on this route (their logs say so): SGLANG_SSD_CPU_LINEAR=torch for A/B.
    print(f"CPU linear route: {clib.setting()} ({clib.ENV})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
