"""The full-size soak: the real target under 64 concurrent streaming requests for several minutes.

Two parts, one run, servers resident together (target on core 0, draft servers on core 1):

1. **Latency at load**: AR, SD, SSD (K = 4) and SSD with ``--ssd-k auto``, interleaved, each through
   ``python -m sglang.bench_serving`` at concurrency 16 and 64 on the same prompts (a mix of the
   project's prompt set and held-out ShareGPT first turns), greedy, fixed output length. TTFT and TPOT
   percentiles per configuration, and every speculative configuration's outputs against AR's.
2. **The soak**: SSD ``--ssd-k auto`` for ``--minutes``, requests arriving as a Poisson process at the
   rate its own c = 64 run served (so the 64 slots stay full), at most 64 in flight. Checks: every
   request completes; the outputs of the requests AR also ran are AR's; the scheduler's and the draft
   server's resident memory after the first minute grows by less than 5 % (the draft server's outside its
   KV pool, whose pages become resident as they are first handed out, up to the pool's fixed size; the
   pool's touched part is reported beside it); afterwards the draft server
   holds no request and no KV slot, and its speculation cache stayed within its cap.

Results go to ``bench/results/soak/`` (JSON and markdown) and the block between the soak markers in
``bench/README.md``, with the fixed-form line
``soak: N requests in M min at concurrency 64, F failed, RSS growth scheduler x %, draft server y %``.

    python bench/soak.py                        # about 25 minutes
    python bench/soak.py --minutes 1 --latency-prompts 32   # a shorter check
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.readme_blocks import write_block  # noqa: E402
from bench.run_sweep import configs, run_bench, ssd_state, warm_up  # noqa: E402
from sglang_ssd.prompts import BENCH_PLACEHOLDER, load_prompts  # noqa: E402
from sglang_ssd.sharegpt import load_sharegpt  # noqa: E402
from sglang_ssd.tools.server_process import CPU_SERVER_ARGS, SGLangServer  # noqa: E402

CONFIGS = ("ar", "sd", "ssd", "ssd_kauto")
SOAK_CONFIG = "ssd_kauto"
MAX_RSS_GROWTH = 0.05
PERCENTILES = ("median", "p90", "p99")


def write_dataset(path: Path, rows: int) -> int:
    """bench_serving ``custom`` JSONL: the project's prompts and the held-out ShareGPT first turns,
    interleaved, repeated up to ``rows`` lines. Every run reads the same file with the same seed, so
    a run of n prompts sends the first n of one fixed shuffled order (outputs are comparable by
    position). Returns the number of distinct prompts."""
    own = [p.prompt for p in load_prompts()]
    shared = [p.prompt for p in load_sharegpt("held_out")]
    mixed = [p for pair in zip(own, shared) for p in pair] + own[len(shared):] + shared[len(own):]
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for i in range(rows):
            turns = [{"role": "user", "content": mixed[i % len(mixed)]},
                     {"role": "assistant", "content": BENCH_PLACEHOLDER}]  # fmt: skip
            f.write(json.dumps({"conversations": turns}, ensure_ascii=False) + "\n")
    return len(mixed)


POOL = "draft KV pool"  # the pool's touched bytes, sampled from the draft server's stats


class RSSMonitor:
    """Resident memory of the scheduler and the draft server (descendants of the launcher), sampled
    every ``every_s`` seconds in a thread; the draft server's is counted outside its KV pool's touched
    part, which is sampled as an entry of its own (``POOL``)."""

    def __init__(self, server: SGLangServer, every_s: float = 2.0) -> None:
        import psutil

        self.server = server
        self.procs: dict[str, psutil.Process] = {}
        for p in psutil.Process(server.proc.pid).children(recursive=True):
            cmd = " ".join(p.cmdline())
            if "scheduler" in p.name() or "scheduler" in cmd:
                self.procs["scheduler"] = p
            elif "sglang_ssd.draft_server" in cmd:
                self.procs["draft server"] = p
        self.samples: list[tuple[float, dict[str, int]]] = []
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            sample = {n: p.memory_info().rss for n, p in self.procs.items()}
            if "draft server" in sample:
                sample[POOL] = self._pool_bytes()
                sample["draft server"] -= sample[POOL]
            self.samples.append((time.monotonic(), sample))
            self._stop.wait(self.every_s)

    def _pool_bytes(self) -> int:
        """The draft KV pool's touched bytes (one draft server on the CPU); a failed read repeats the
        last value, so one slow answer under load neither stops the sampling nor fakes a jump."""
        try:
            return int(ssd_state(self.server)["ssd_draft_server"]["kv_pool_touched_bytes"])
        except Exception:  # noqa: BLE001 - any failure to read the stat is handled the same way
            return self.samples[-1][1].get(POOL, 0) if self.samples else 0

    @property
    def names(self) -> list[str]:
        return list(self.samples[0][1]) if self.samples else list(self.procs)

    def __enter__(self) -> RSSMonitor:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def series(self, points: int = 120) -> dict[str, list[tuple[float, float]]]:
        """Per process: (seconds since the first sample, RSS in MB), thinned to about ``points``."""
        t0, step = self.samples[0][0], max(1, len(self.samples) // points)
        kept = self.samples[::step] + ([self.samples[-1]] if (len(self.samples) - 1) % step else [])
        return {n: [(round(t - t0, 1), round(s[n] / 2**20, 1)) for t, s in kept] for n in self.names}

    def slopes_after(self, warmup_s: float) -> dict[str, dict[str, float]]:
        """Per process, MB per minute (least squares) over the whole soak after warm-up and over its
        last third: a leak keeps its slope to the end, a pool that fills up and stays levels off."""
        t0 = self.samples[0][0]
        warm = [(t - t0, s) for t, s in self.samples if t - t0 >= warmup_s]

        def slope(points: list[tuple[float, dict[str, int]]], name: str) -> float:
            if len(points) < 3:
                return float("nan")
            xs, ys = [t / 60 for t, _ in points], [s[name] / 2**20 for _, s in points]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            var = sum((x - mx) ** 2 for x in xs)
            return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else float("nan")

        tail = warm[len(warm) * 2 // 3:]
        return {n: {"after_warmup": round(slope(warm, n), 2), "last_third": round(slope(tail, n), 2)}
                for n in self.names}

    def growth_after(self, warmup_s: float) -> dict[str, float]:
        """Per process: last sample / first sample after ``warmup_s`` seconds, minus 1."""
        warm, last = self.after(warmup_s), self.samples[-1][1]
        return {n: last[n] / warm[n] - 1 for n in self.procs}

    def after(self, warmup_s: float) -> dict[str, int]:
        """The first sample after ``warmup_s`` seconds."""
        t0 = self.samples[0][0]
        return next(s for t, s in self.samples if t - t0 >= warmup_s)


def latency_record(name: str, conc: int, bench: dict) -> dict:
    rec = {"config": name, "concurrency": conc, "completed": bench["completed"],
           "output_throughput": bench["output_throughput"], "request_throughput": bench["request_throughput"]}
    for metric in ("ttft", "tpot", "e2e_latency"):
        for p in PERCENTILES:
            rec[f"{p}_{metric}_ms"] = bench.get(f"{p}_{metric}_ms")
    return rec


def same_outputs(a: list[str], b: list[str]) -> tuple[int, int]:
    """(equal, compared) over the positions both runs have."""
    n = min(len(a), len(b))
    return sum(x == y for x, y in zip(a[:n], b[:n])), n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default=str(ROOT / "models" / "target"))
    ap.add_argument("--draft", default=str(ROOT / "models" / "draft"))
    ap.add_argument("--minutes", type=float, default=5.0, help="length of the soak")
    ap.add_argument("--concurrency", type=int, default=64, help="most requests in flight during the soak")
    ap.add_argument("--latency-concurrency", default="16,64")
    ap.add_argument("--latency-prompts", type=int, default=64, help="requests per latency point")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--warmup-minutes", type=float, default=1.0, help="RSS growth is measured after this")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"latency configurations (the soak runs {SOAK_CONFIG})")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "soak"))
    ap.add_argument("--no-readme", action="store_true")
    args = ap.parse_args(argv)
    if args.minutes <= args.warmup_minutes:
        ap.error(f"--minutes ({args.minutes}) must exceed --warmup-minutes ({args.warmup_minutes})")
    out = Path(args.out)
    dataset = out / "prompts.jsonl"
    distinct = write_dataset(dataset, rows=20000)
    cfgs = configs(args.draft, "4", "12", [])
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in cfgs]
    if unknown or "ar" not in names or SOAK_CONFIG not in names:
        ap.error(f"--configs must name known configurations including ar and {SOAK_CONFIG}, got {args.configs!r}")
    concs = [int(c) for c in args.latency_concurrency.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    servers: dict[str, SGLangServer] = {}
    result: dict = {"distinct_prompts": distinct, "output_len": args.output_len, "latency": [], "soak": {}}
    texts: dict[tuple[str, int], list[str]] = {}
    try:
        for name in names:
            print(f"starting {name} ...", flush=True)
            servers[name] = SGLangServer(["--model-path", args.target, *CPU_SERVER_ARGS, *cfgs[name][0]],
                                         cpu_cores={0}, log_path=f"/tmp/soak_{name}.log").start()
        details = ["--output-details"]
        for conc in concs:  # configurations interleaved at each concurrency
            for name in names:
                warm_up(servers[name], 0.0)
                bench = run_bench(servers[name], dataset, args.target, conc, 0.0, args.latency_prompts,
                                  args.output_len, details)
                texts[name, conc] = bench["generated_texts"]
                rec = latency_record(name, conc, bench)
                if name != "ar":
                    rec["equal_to_ar"], rec["compared"] = same_outputs(bench["generated_texts"], texts["ar", conc])
                result["latency"].append(rec)
                print(f"  {name} c={conc}: {rec['output_throughput']:.1f} tok/s, TTFT p50 {rec['median_ttft_ms']:.0f} "
                      f"ms, TPOT p50 {rec['median_tpot_ms']:.0f} ms", flush=True)  # fmt: skip
        result["soak"] = soak(servers[SOAK_CONFIG], dataset, args, texts, result["latency"])
    finally:
        for s in servers.values():
            s.stop()
    out.mkdir(parents=True, exist_ok=True)
    (out / "soak.json").write_text(json.dumps(result, indent=1) + "\n")
    text = markdown(result)
    (out / "soak.md").write_text(text + "\n")
    print(text)
    if not args.no_readme:
        write_block("soak", text)
    return 0 if result["soak"]["passed"] else 1


def soak(server: SGLangServer, dataset: Path, args, texts: dict, latency: list[dict]) -> dict:
    """The soak itself, for ``args.minutes``: Poisson arrivals at the rate this configuration served in
    its highest-concurrency latency run, so that the slots stay full without an ever growing queue."""
    top = max((r for r in latency if r["config"] == SOAK_CONFIG), key=lambda r: r["concurrency"])
    rate = top["request_throughput"]
    n = max(args.concurrency, int(rate * args.minutes * 60))
    warm_up(server, 0.0)
    before = ssd_state(server)
    t0 = time.perf_counter()
    with RSSMonitor(server) as rss:
        bench = run_bench(server, dataset, args.target, args.concurrency, 0.0, n, args.output_len,
                          ["--output-details", "--request-rate", f"{rate:.3f}"])
    minutes = (time.perf_counter() - t0) / 60
    state = ssd_state(server)
    deadline = time.monotonic() + 30
    while state["ssd_draft_server"].get("requests_open", 0) and time.monotonic() < deadline:
        time.sleep(1)  # closes travel with the worker's next messages
        state = ssd_state(server)
    draft = state["ssd_draft_server"]
    failed = sum(1 for e in bench.get("errors", []) if e)
    growth = rss.growth_after(args.warmup_minutes * 60)
    ref = max((c for (name, c) in texts if name == "ar"), default=None)
    equal, compared = same_outputs(bench["generated_texts"], texts["ar", ref]) if ref else (0, 0)
    rec = {
        "config": SOAK_CONFIG, "requests": n, "completed": bench["completed"], "failed": failed,
        "minutes": round(minutes, 2), "request_rate": round(rate, 3), "concurrency": args.concurrency,
        "rss_growth": {k: round(v, 4) for k, v in growth.items()},
        "draft_kv_pool_touched_mb": [round(rss.after(args.warmup_minutes * 60).get(POOL, 0) / 2**20, 1),
                                     round(rss.samples[-1][1].get(POOL, 0) / 2**20, 1)],
        "draft_kv_pool_mb": round(draft.get("kv_pool_bytes", 0) / 2**20, 1),
        "rss_samples": len(rss.samples), "rss_mb_per_min": rss.slopes_after(args.warmup_minutes * 60),
        "rss_series_mb": rss.series(), "equal_to_ar": equal, "compared_to_ar": compared,
        "draft_requests_open": draft.get("requests_open"), "draft_kv_slots_used": draft.get("kv_slots_used"),
        "spec_cache_bytes": draft.get("spec_cache_bytes"), "spec_cache_cap_bytes": draft.get("spec_cache_cap_bytes"),
        "cache_hits": state.get("ssd_hits", 0) - before.get("ssd_hits", 0),
        "auto_k_chosen": [a - b for a, b in zip(state.get("ssd_auto_k_chosen", []), before.get("ssd_auto_k_chosen", []))],
        **{k: v for k, v in latency_record(SOAK_CONFIG, args.concurrency, bench).items()
           if k.endswith("_ms") or k.endswith("throughput")},
    }  # fmt: skip
    cache_ok = rec["spec_cache_bytes"] is None or rec["spec_cache_bytes"] <= (rec["spec_cache_cap_bytes"] or 0)
    rec["passed"] = bool(
        rec["completed"] == n and failed == 0 and equal == compared
        and all(g < MAX_RSS_GROWTH for g in growth.values())
        and rec["draft_requests_open"] == 0 and rec["draft_kv_slots_used"] == 0 and cache_ok
    )  # fmt: skip
    return rec


def markdown(result: dict) -> str:
    s = result["soak"]
    g = s["rss_growth"]
    lines = [
        f"soak: {s['completed']} requests in {s['minutes']:.1f} min at concurrency {s['concurrency']}, {s['failed']} "
        f"failed, RSS growth scheduler {100 * g.get('scheduler', float('nan')):.1f} %, draft server "
        f"{100 * g.get('draft server', float('nan')):.1f} %",
        "",
        "The draft server's growth is outside its KV pool: the pool's touched part went "
        f"{s.get('draft_kv_pool_touched_mb', ['?', '?'])[0]} -> {s.get('draft_kv_pool_touched_mb', ['?', '?'])[1]} MB "
        f"after warm-up, of {s.get('draft_kv_pool_mb', '?')} MB reserved.",
        "",
        "RSS slope after warm-up, MB/min (whole / last third): " + ", ".join(
            f"{k} {v['after_warmup']:+.1f} / {v['last_third']:+.1f}" for k, v in s.get("rss_mb_per_min", {}).items())
        + " (the series is in the JSON: `rss_series_mb`).",
        "",
        f"`python bench/soak.py` ({s['config']}, Poisson arrivals at {s['request_rate']} requests/s, at most "
        f"{s['concurrency']} in flight, {result['output_len']} greedy tokens each, prompts: the project's set and "
        f"held-out ShareGPT first turns, {result['distinct_prompts']} distinct). Checks "
        f"{'passed' if s['passed'] else 'FAILED'}: outputs equal to AR's on {s['equal_to_ar']} of "
        f"{s['compared_to_ar']} requests AR also ran; afterwards the draft server held {s['draft_requests_open']} "
        f"requests and {s['draft_kv_slots_used']} KV slots; speculation cache "
        f"{s['spec_cache_bytes']} of {s['spec_cache_cap_bytes']} bytes; auto-K rounds by K {s['auto_k_chosen']}. "
        f"Soak latency: TTFT p50/p90/p99 {s['median_ttft_ms']:.0f}/{s['p90_ttft_ms']:.0f}/{s['p99_ttft_ms']:.0f} ms, "
        f"TPOT {s['median_tpot_ms']:.0f}/{s['p90_tpot_ms']:.0f}/{s['p99_tpot_ms']:.0f} ms.",
        "",
        "Latency at load, configurations interleaved (ms; p50/p90/p99):",
        "",
        "| config | conc | tok/s | TTFT p50 | TTFT p90 | TTFT p99 | TPOT p50 | TPOT p90 | TPOT p99 | = AR |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["latency"]:
        eq = f"{r['equal_to_ar']}/{r['compared']}" if "compared" in r else "–"
        lines.append(f"| {r['config']} | {r['concurrency']} | {r['output_throughput']:.1f} | "
                     + " | ".join(f"{r[f'{p}_{m}_ms']:.0f}" for m in ("ttft", "tpot") for p in PERCENTILES)
                     + f" | {eq} |")  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
