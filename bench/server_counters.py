"""One configuration, one server, one `bench_serving` run: the server's `/server_info` counters
differenced around the run (the worker's round phases, hit rate, unspeculated rounds, the draft
server's outcomes and hits by k). A diagnostic for one point, beside `run_sweep.py`'s grids.

    python bench/server_counters.py ssd_k2 --num-prompts 16
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.run_sweep import configs, k_variants_named, prepare_dataset, run_bench, ssd_state, warm_up  # noqa: E402
from sglang_ssd.tools.server_process import CPU_SERVER_ARGS, SGLangServer  # noqa: E402


def differences(before: dict, after: dict, prefix: str = "") -> list[str]:
    """``name: value (delta d)`` for every numeric counter that moved, nested dicts flattened."""
    out = []
    for key, value in after.items():
        if isinstance(value, dict):
            out += differences(before.get(key) or {}, value, f"{prefix}{key}.")
        elif isinstance(value, list) and all(isinstance(v, (int, float)) for v in value):
            was = before.get(key) or [0] * len(value)
            if value != was:  # e.g. auto-K's rounds by K (the delta: this run's share)
                out.append(f"{prefix}{key}: {value} (delta {[round(v - w, 4) for v, w in zip(value, was)]})")
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            delta = value - (before.get(key) or 0)
            if delta:
                out.append(f"{prefix}{key}: {value:.4g} (delta {delta:.4g})")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", help="a run_sweep.py configuration, e.g. ssd_kauto, ssd_k4, ssd_default")
    ap.add_argument("--target", default="models/target")
    ap.add_argument("--draft", default="models/draft")
    ap.add_argument("--num-prompts", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--out", default="/tmp/server_counters")
    ap.add_argument("--server-args", default="",
                    help="extra server flags after the configuration's own (a later flag wins), "
                         "e.g. '--ssd-backup neural'")
    args = ap.parse_args()
    known = configs(args.draft, "4", "24", k_variants_named([args.config]))
    if args.config not in known:
        print(f"error: unknown configuration {args.config!r} (known: {', '.join(known)})", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dataset = prepare_dataset("prompts", out)
    server = SGLangServer(["--model-path", args.target, *CPU_SERVER_ARGS, *known[args.config][0], *args.server_args.split()],
                          cpu_cores={0}, log_path=str(out / f"{args.config}.log")).start()
    try:
        warm_up(server, args.temperature)
        before = ssd_state(server)
        result = run_bench(server, dataset, args.target, args.concurrency, args.temperature,
                           args.num_prompts, args.output_len)
        after = ssd_state(server)
    finally:
        server.stop()
    print(f"{args.config}: {result['output_throughput']:.1f} tok/s, median TPOT {result['median_tpot_ms']:.1f} ms")
    print("\n".join(differences(before, after)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
