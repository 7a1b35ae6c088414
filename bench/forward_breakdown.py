"""Where a verify step's extra time goes: the target's forward by part, plain step against K + 1 verify.

Plain script, not a test:  python bench/forward_breakdown.py [--repeats 8] [--requests 2] [--out DIR]

Starts two servers with the per-part timers on (``SGLANG_SSD_MODULE_TIMERS=1``,
``sglang_ssd/target/module_timers.py``), target on core 0 and draft server on core 1 as in the sweep:
``ssd_k0`` (SSD with K = 0: every step a plain decode step of one token) and ``sd`` (K = 4 chains, the
draft server idle while the target verifies, so every step is a full 5-token verify). Runs greedy
64-token requests on the project's prompts, the two servers interleaved repeat by repeat, and prints,
per part of the model, µs per call and ms per step on each side, and how much of the verify's extra
time per step each part accounts for; with the worker's own forward-phase timing of the two steps.
Writes ``breakdown.json`` (the counters' deltas) and ``breakdown.md`` to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from sglang_ssd.target import module_timers  # noqa: E402
from sglang_ssd.tools.server_process import CPU_SERVER_ARGS, SGLangServer  # noqa: E402

SIDES = {"plain": ("ssd_k0", 1), "verify": ("sd", 5)}  # side -> (sweep configuration, chain width)
# the parts in the table, in forward order (module_timers' names); the linears are what the kernel runs
PARTS = ["model", "layers", *module_timers.LAYER_PARTS, "logits"]
LINEARS = ("qkv", "o", "gate_up", "down")
LEAVES = ("norm_in", "qkv", "rope", "attention", "o", "norm_post", "gate_up", "act", "down", "logits")


def side_figures(before: dict, after: dict, width: int) -> dict:
    """Per part: (ms per step, µs per call) at ``width`` over the window; plus the worker's forward ms."""
    def at(state: dict, key: str):
        values = state.get(key) or []
        return values[width] if width < len(values) else 0

    steps = at(after, "ssd_width_rounds") - at(before, "ssd_width_rounds")
    if steps <= 0:
        raise ValueError(f"no steps of width {width} in the window")
    forward_s = at(after, "ssd_width_verify_s") - at(before, "ssd_width_verify_s")
    out = {"steps": steps, "forward_ms": 1000 * forward_s / steps, "parts": {}}
    for part in PARTS:
        key = f"{part}@{width}"
        s = after["ssd_module_s"].get(key, 0.0) - before.get("ssd_module_s", {}).get(key, 0.0)
        n = after["ssd_module_calls"].get(key, 0) - before.get("ssd_module_calls", {}).get(key, 0)
        if n:
            out["parts"][part] = (1000 * s / steps, 1e6 * s / n)
    return out


def render(plain: dict, verify: dict) -> str:
    """The table and the summary lines, from two `side_figures`."""
    extra = verify["forward_ms"] - plain["forward_ms"]
    rows = ["| part | µs/call plain | µs/call verify | ms/step plain | ms/step verify | extra ms/step | share of the extra |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for part in PARTS:
        if part not in plain["parts"] or part not in verify["parts"]:
            continue
        (mp, up), (mv, uv) = plain["parts"][part], verify["parts"][part]
        share = f"{(mv - mp) / extra:.0%}" if extra > 0 else "–"
        rows.append(f"| {part} | {up:.1f} | {uv:.1f} | {mp:.2f} | {mv:.2f} | {mv - mp:+.2f} | {share} |")

    def extra_of(parts) -> float:
        return sum(verify["parts"].get(p, (0, 0))[0] - plain["parts"].get(p, (0, 0))[0] for p in parts)

    linears, attention, logits = extra_of(LINEARS), extra_of(["attention"]), extra_of(["logits"])
    rest = extra - extra_of(LEAVES)
    lines = [
        f"verify forward {verify['forward_ms']:.1f} ms = {verify['forward_ms'] / plain['forward_ms']:.2f}x the plain "
        f"step ({plain['forward_ms']:.1f} ms), worker phase timings ({verify['steps']} and {plain['steps']} steps)",
        f"the verify's extra {extra:.2f} ms a step: layer linears {linears:+.2f}, attention {attention:+.2f}, logits "
        f"(head included) {logits:+.2f}, other timed parts {extra_of(LEAVES) - linears - attention - logits:+.2f}, "
        f"outside the timed parts {rest:+.2f}",
    ]  # fmt: skip
    return "\n".join(rows) + "\n\n" + "\n".join(lines) + "\n"


def main() -> int:
    import run_sweep

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(ROOT / "models" / "target"))
    ap.add_argument("--draft", default=str(ROOT / "models" / "draft"))
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--requests", type=int, default=2, help="requests per server per repeat")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "forward_breakdown"))
    args = ap.parse_args()
    if args.repeats < 1 or args.requests < 1:
        ap.error("--repeats and --requests must be at least 1")
    cfgs = run_sweep.configs(args.draft, "4", "12", ["0"])
    prompts = [json.loads(ln)["prompt"] for ln in (ROOT / "sglang_ssd" / "data" / "prompts.jsonl").read_text().splitlines()]
    servers: dict[str, SGLangServer] = {}
    try:
        for side, (cfg, _) in SIDES.items():
            print(f"starting {cfg} ({side} steps) ...", flush=True)
            servers[side] = SGLangServer(["--model-path", args.target, *CPU_SERVER_ARGS, *cfgs[cfg][0]], cpu_cores={0},
                                         log_path=f"/tmp/forward_breakdown_{cfg}.log",
                                         env={module_timers.ENV: "1"}).start()  # fmt: skip
        before = {}
        for side, server in servers.items():
            run_sweep.warm_up(server, 0.0)
            before[side] = run_sweep.ssd_state(server)
        t0, done = time.perf_counter(), 0
        for rep in range(args.repeats):
            for server in servers.values():
                for i in range(args.requests):
                    text = prompts[(rep * args.requests + i) % len(prompts)]
                    server.post("/generate", {"text": text, "sampling_params": {
                        "max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}})  # fmt: skip
            done += 1
            print(f"  repeat {done}/{args.repeats} ({time.perf_counter() - t0:.0f} s)", flush=True)
        after = {side: run_sweep.ssd_state(server) for side, server in servers.items()}
    finally:
        for server in servers.values():
            server.stop()
    figures = {side: side_figures(before[side], after[side], width) for side, (_, width) in SIDES.items()}
    text = render(figures["plain"], figures["verify"])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    keys = ("ssd_width_rounds", "ssd_width_verify_s", "ssd_module_s", "ssd_module_calls")
    (out / "breakdown.json").write_text(json.dumps({side: {"before": {k: before[side].get(k) for k in keys},
                                                           "after": {k: after[side].get(k) for k in keys}}
                                                    for side in SIDES}, indent=1))  # fmt: skip
    (out / "breakdown.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
