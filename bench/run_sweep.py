"""`make bench`: throughput–latency sweep AR / SD (co-located) / SD / SSD through the real server.

Every configuration's server is started once (target pinned to core 0; draft server on core 1, or on
core 0 for "SD co-located"), then the runs are interleaved: for each (temperature, concurrency) every
configuration runs `python -m sglang.bench_serving` on the project's prompt set before the next
point, and the whole pass is repeated ``--repeats`` times (default 2), so drift and noise show up as
the spread between repeats. ``--restart`` starts every server afresh for each repeat: two servers of
one configuration can differ by 10-20 % on this host (a slower target forward for the server's whole
life), which repeats on the same servers never show. A point runs ``--num-prompts`` requests (default 32) at concurrency < 4
and twice as many from 4 up. Each run's bench_serving record is joined with the server's SSD counters
(deltas over the run) and written to JSONL; the repeats are merged (means, with their min–max
spread) into a markdown table, a plot in SGLang's convention (output throughput against median TPOT,
one line per configuration, points labelled with their concurrency, error bars from the repeats) and
the headline ratios, each compared with the run's noise band.

    python bench/run_sweep.py [--concurrency 1,2,4,8] [--temperatures 0,0.7] [--num-prompts 32]
                              [--repeats 2] [--output-len 64] [--configs ar,sd_coloc,sd,ssd] [--ablations]
                              [--dataset prompts|sharegpt] [--out DIR]

`make bench` runs it twice: on the project's prompt set (bench/results) and on the held-out ShareGPT
conversations, bench_serving's standard workload (bench/results/sharegpt).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_ssd.cpu import clib  # noqa: E402
from sglang_ssd.prompts import export_bench_dataset  # noqa: E402
from sglang_ssd.target import metrics as ssd_metrics  # noqa: E402
from sglang_ssd.tools.server_process import CPU_SERVER_ARGS, SGLangServer  # noqa: E402
from sglang_ssd.wire.settings import DraftSettings  # noqa: E402

COUNTERS = ("ssd_hits", "ssd_lookups", "ssd_fast_backups", "ssd_drafted", "ssd_accepted", "ssd_rejected",
            "ssd_emitted", "ssd_rounds", "ssd_verify_s", "ssd_link_s", "ssd_open_s", "ssd_math_s", "ssd_total_s",
            "ssd_hit_rounds", "ssd_hit_link_s", "ssd_hit_verify_s")


ABLATIONS = ("ssd_uniform", "ssd_neural", "ssd_backup_auto", "ssd_c0.5", "ssd_qsparse", "ssd_c0.2")


def k_variants_named(names: list[str]) -> list[str]:
    """The fixed-K variants that configuration names ask for: ``ssd_k3`` (also ``ssd_k3^b``, ``ssd_k3@torch``)
    is K = 3."""
    out = []
    for name in names:
        kk = name.split("@")[0].split("^")[0].removeprefix("ssd_k")
        if name.startswith("ssd_k") and kk.isdigit() and kk not in out:
            out.append(kk)
    return out


def configs(draft: str, k: str, budget: str, k_variants: list[str],
            ngram: str = str(ROOT / "models" / "ngram.json"),
            budget_variants: list[str] = ()) -> dict[str, tuple[list[str], dict]]:
    """name -> (extra server args, record metadata: k, budget, backup, fanout, saguaro_c, colocated, t_min).
    The ablation configurations are always defined, so ``--configs`` can name any of them."""
    def ssd(kk: str = k, bb: str = budget) -> list[str]:
        return ["--speculative-algorithm", "SSD", "--speculative-draft-model-path", draft, "--ssd-k", kk,
                "--ssd-budget", bb]

    meta = {"k": int(k) if k.isdigit() else k, "budget": int(budget), "fanout": "geometric", "saguaro_c": 1.0,
            "backup": DraftSettings().backup}  # the launch default unless a configuration names one
    out = {
        "ar": ([], {"k": 0}),
        # A second, identical AR server: the AR/AR ratio at each point is the run's noise band.
        "ar_repeat": ([], {"k": 0}),
        # AR without SGLang's overlap scheduler, which a speculative server runs without on CPU: what a
        # parked SSD server (auto-K decoding plainly) can at best match.
        "ar_sync": (["--disable-overlap-schedule"], {"k": 0}),
        "sd_coloc": ([*ssd(), "--ssd-mode", "sync", "--ssd-draft-cores", "0", "--ssd-backup", "neural"],
                     {**meta, "backup": "neural", "colocated": True}),
        "sd": ([*ssd(), "--ssd-mode", "sync", "--ssd-draft-cores", "1", "--ssd-backup", "neural"],
               {**meta, "backup": "neural"}),
        "ssd": ([*ssd(), "--ssd-fanout", "geometric", "--ssd-draft-cores", "1"], meta),
    }
    chain = ["--ssd-draft-chain", f"{ngram},{draft}"]
    out["sd3"] = ([*ssd(), *chain, "--ssd-mode", "sync", "--ssd-draft-cores", "1", "--ssd-backup", "neural"],
                  {**meta, "backup": "neural", "levels": 3})
    out["ssd3"] = ([*ssd(), *chain, "--ssd-fanout", "geometric", "--ssd-draft-cores", "1"], {**meta, "levels": 3})
    # what a user typing `--ssd-k auto` gets: ΣF from the calibration, K per round, the draft depth steered
    out["ssd_kauto"] = (["--speculative-algorithm", "SSD", "--speculative-draft-model-path", draft, "--ssd-k", "auto",
                         "--ssd-draft-cores", "1"], {**meta, "k": "auto", "budget": 0})
    # No --ssd-k / --ssd-budget: what a user who names no SSD setting gets (target/defaults.py).
    out["ssd_default"] = (["--speculative-algorithm", "SSD", "--speculative-draft-model-path", draft,
                           "--ssd-draft-cores", "1"], {**meta, "k": "default", "budget": 0})
    for kk in k_variants:  # fixed-K SSD points next to `--ssd-k auto`
        out[f"ssd_k{kk}"] = ([*ssd(kk), "--ssd-draft-cores", "1"], {**meta, "k": int(kk)})
    for bb in budget_variants:  # the speculation budget ΣF, geometric and uniform fan-out
        for tag, fan in (("b", "geometric"), ("u", "uniform")):
            out[f"ssd_{tag}{bb}"] = ([*ssd(bb=bb), "--ssd-fanout", fan, "--ssd-draft-cores", "1"],
                                     {**meta, "budget": int(bb), "fanout": fan})
    # the ablations (--ablations runs them all)
    out |= {
        "ssd_uniform": ([*ssd(), "--ssd-fanout", "uniform", "--ssd-draft-cores", "1"],
                        {**meta, "fanout": "uniform"}),
        "ssd_neural": ([*ssd(), "--ssd-backup", "neural", "--ssd-draft-cores", "1"], {**meta, "backup": "neural"}),
        "ssd_backup_auto": ([*ssd(), "--ssd-backup", "auto", "--ssd-draft-cores", "1"], {**meta, "backup": "auto"}),
        "ssd_c0.5": ([*ssd(), "--ssd-saguaro-c", "0.5", "--ssd-draft-cores", "1"],
                     {**meta, "saguaro_c": 0.5, "t_min": 0.01}),
        "ssd_qsparse": ([*ssd(), "--ssd-q-support", "64", "--ssd-draft-cores", "1"],
                        {**meta, "q_support": 64, "t_min": 0.01}),
        "ssd_c0.2": ([*ssd(), "--ssd-saguaro-c", "0.2", "--ssd-draft-cores", "1"],
                     {**meta, "saguaro_c": 0.2, "t_min": 0.01}),
    }
    return out


def dataset_name(dataset: Path) -> str:
    """bench_serving's loader for a dataset file: ShareGPT's JSON array, or the project's JSONL."""
    return "sharegpt" if dataset.suffix == ".json" else "custom"


def prepare_dataset(which: str, out: Path) -> Path:
    """The prompt file of ``which`` under ``out``: the project's prompt set (bench_serving "custom"
    JSONL) or the held-out ShareGPT conversations (bench_serving's own ShareGPT format)."""
    if which == "sharegpt":
        from sglang_ssd.sharegpt import write_bench_file

        path = out / "sharegpt_held_out.json"
        write_bench_file(path)
        return path
    path = out / "prompts_custom.jsonl"
    export_bench_dataset(path)
    return path


def run_bench(server: SGLangServer, dataset: Path, tokenizer: str, concurrency: int, temperature: float,
              num_prompts: int, output_len: int, extra: list[str] | None = None) -> dict:
    """One bench_serving run; its result record (with ``--output-details`` in ``extra``: the outputs too)."""
    with tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False) as f:
        out = Path(f.name)
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "sglang", "--host", "127.0.0.1",
           "--port", str(server.port), "--dataset-name", dataset_name(dataset), "--dataset-path", str(dataset),
           "--tokenizer", tokenizer, "--apply-chat-template", "--num-prompts", str(num_prompts),
           "--sharegpt-output-len", str(output_len), "--max-concurrency", str(concurrency),
           "--temperature", str(temperature), "--seed", "0", "--output-file", str(out), "--disable-tqdm",
           # The caller warms the server up before it reads the counters (`warm_up`), so that the
           # server-side per-round figures cover the measured requests only.
           "--warmup-requests", "0", *(extra or [])]
    # SGLANG_USE_CPU_ENGINE: bench_serving imports sglang.srt, which needs the CPU stand-ins here too.
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "SGLANG_USE_CPU_ENGINE": "1"})
    if done.returncode:
        raise RuntimeError(f"bench_serving failed ({done.returncode}):\n{done.stderr[-3000:]}")
    lines = [ln for ln in out.read_text().splitlines() if ln.strip()]
    out.unlink()
    return json.loads(lines[-1])


def warm_up(server: SGLangServer, temperature: float) -> None:
    """One short request before the counted window (what bench_serving's own warm-up did, but that
    one fell inside the window and mixed a batch-1 request into every point's per-round figures)."""
    server.generate([1, 2, 3, 4], {"max_new_tokens": 8, "temperature": temperature})


def ssd_state(server: SGLangServer) -> dict:
    return server.get("/server_info")["internal_states"][0]


def summarize(name: str, bench: dict, before: dict, after: dict, extra: dict) -> dict:
    d = {c: after.get(c, 0) - before.get(c, 0) for c in COUNTERS}
    rec = {
        "config": name, **extra,
        "output_throughput": bench.get("output_throughput"),
        "per_request_tps": 1000.0 / bench["median_tpot_ms"] if bench.get("median_tpot_ms") else None,
        "median_ttft_ms": bench.get("median_ttft_ms"), "median_tpot_ms": bench.get("median_tpot_ms"),
        "mean_ttft_ms": bench.get("mean_ttft_ms"), "completed": bench.get("completed"),
        "total_output_tokens": bench.get("total_output_tokens"),
        "accept_length": bench.get("accept_length"),
        "duration_s": bench.get("duration"),
    }
    win = ssd_metrics.window(before, after)
    if win:
        for key in ("alpha", "accepted_fraction", "hit_rate"):  # α: target/metrics.py's rule
            rec[key] = win[key]
        rec["backup_rate"] = 1.0 - win["hit_rate"] if win["lookups"] else 0.0
        if rec["accept_length"] is None:
            rec["accept_length"] = win["tokens_per_round"]
        if "ssd_auto_k_chosen" in after:  # how often auto-K chose each K at this point, and its costs
            rec["auto_k_chosen"] = [a - b for a, b in zip(after["ssd_auto_k_chosen"],
                                                           before.get("ssd_auto_k_chosen", [0] * 99))]
            rec["auto_k_step_ms"] = after.get("ssd_auto_k_step_ms")
            rec["auto_k_gap_ms"] = after.get("ssd_auto_k_gap_ms")
            rec["auto_k_ratios"] = after.get("ssd_auto_k_ratios")
            rec["auto_k_chosen_by_bucket"] = {
                b: [x - y for x, y in zip(n, before.get("ssd_auto_k_chosen_by_bucket", {}).get(b, [0] * len(n)))]
                for b, n in after.get("ssd_auto_k_chosen_by_bucket", {}).items()}
            rec["auto_k_switches"] = after.get("ssd_auto_k_switches", 0) - before.get("ssd_auto_k_switches", 0)
            rec["auto_k_reopen_ms"] = after.get("ssd_auto_k_reopen_ms")
            rec["auto_k_yield_share"] = after.get("ssd_auto_k_yield_share")
        rec.update(per_k_counts(before.get("ssd_draft_server", {}), after.get("ssd_draft_server", {})))
        if rec.get("draft_busy_ms") is not None:  # the draft server's forwards per target round
            rec["draft_ms_per_round"] = rec["draft_busy_ms"] / d["ssd_rounds"]
        rec["steps"] = d["ssd_rounds"]  # worker decode steps in the measured window
        rec["worker_busy_s"] = d["ssd_total_s"]
        rec["verify_ms"] = 1000 * d["ssd_verify_s"] / d["ssd_rounds"]
        rec["link_ms"] = 1000 * d["ssd_link_s"] / d["ssd_rounds"]
        for part in ("open", "math", "total"):  # the rest of the worker's step, per round
            rec[f"{part}_ms"] = 1000 * d[f"ssd_{part}_s"] / d["ssd_rounds"]
        rec.update(by_width(before, after))
        if d["ssd_hit_rounds"]:  # all-hit rounds: SSD's own overhead without backup drafting
            rec["hit_rounds"] = d["ssd_hit_rounds"]
            rec["hit_link_ms"] = 1000 * d["ssd_hit_link_s"] / d["ssd_hit_rounds"]
            rec["hit_verify_ms"] = 1000 * d["ssd_hit_verify_s"] / d["ssd_hit_rounds"]
    return rec


def by_width(before: dict, after: dict) -> dict:
    """Rounds and mean forward ms per chain width d over the window (JSON keys: str(d)), in wall time
    and, where the server counts it, in the scheduler thread's CPU time; the fixed-K verify step is the
    width-(K + 1) entry."""
    def window(key: str) -> list:
        now, then = after.get(key) or [], before.get(key) or []
        return [v - (then[d] if d < len(then) else 0) for d, v in enumerate(now)]

    rounds, secs, cpu = window("ssd_width_rounds"), window("ssd_width_verify_s"), window("ssd_width_verify_cpu_s")
    widths = [d for d, n in enumerate(rounds) if n > 0]
    if not widths:
        return {}
    out = {"rounds_by_width": {str(d): rounds[d] for d in widths},
           "verify_ms_by_width": {str(d): 1000 * secs[d] / rounds[d] for d in widths}}
    if len(cpu) == len(rounds):
        out["verify_cpu_ms_by_width"] = {str(d): 1000 * cpu[d] / rounds[d] for d in widths}
    return out


def per_k_counts(before: dict, after: dict) -> dict:
    """The draft servers' realized-k histogram over this point, with hits and mean fan-out per k
    (what a fan-out plan is judged against)."""
    ks = sorted(int(key[len("outcome_k"):]) for key in after if key.startswith("outcome_k"))
    hist, hit, fan = {}, {}, {}
    for k in ks:
        n = after.get(f"outcome_k{k}", 0) - before.get(f"outcome_k{k}", 0)
        if n <= 0:
            continue
        hist[str(k)] = n
        hit[str(k)] = round((after.get(f"hit_k{k}", 0) - before.get(f"hit_k{k}", 0)) / n, 3)
        fan[str(k)] = round((after.get(f"fanout_k{k}", 0) - before.get(f"fanout_k{k}", 0)) / n, 2)
    out = {"k_hist": hist, "hit_rate_by_k": hit, "fanout_by_k": fan} if hist else {}
    steps = after.get("tree_step_count", 0) - before.get("tree_step_count", 0)
    if steps > 0:  # the draft server's batched forwards (glue and branch steps) in this window
        busy = (after.get("tree_step_us_total", 0) - before.get("tree_step_us_total", 0)) / 1000
        out.update(draft_steps=steps, draft_step_ms=busy / steps, draft_busy_ms=busy)
    neural, fast = (after.get(f"backup_{x}", 0) - before.get(f"backup_{x}", 0) for x in ("neural", "fast"))
    if neural + fast:  # which backup the draft server's policy actually used on misses
        out["neural_backup_share"] = round(neural / (neural + fast), 3)
    return out


def table(records: list[dict]) -> str:
    head = ("| config | T | conc | tok/s (agg; repeats' range) | tok/s/req | TTFT ms | TPOT ms | accept len | α | hit | backup |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    def cell(r: dict, key: str, fmt: str = "{:.2f}") -> str:
        v = r.get(key)
        return fmt.format(v) if isinstance(v, int | float) else "–"

    for r in records:
        def f(key, fmt="{:.2f}", r=r):
            return cell(r, key, fmt)
        tps = f('output_throughput', '{:.1f}')
        if len(r.get("samples", [])) > 1:
            tps += f" ({min(t for t, _ in r['samples']):.1f}–{max(t for t, _ in r['samples']):.1f})"
        rows.append(f"| {r['config']} | {r['temperature']} | {r['concurrency']} | {tps} | "
                    f"{f('per_request_tps', '{:.1f}')} | {f('median_ttft_ms', '{:.0f}')} | {f('median_tpot_ms', '{:.0f}')} | "
                    f"{f('accept_length')} | {f('alpha')} | {f('hit_rate')} | {f('backup_rate')} |")
    return "\n".join([head, *rows])


def headline(records: list[dict], default: str = "ssd_default") -> list[str]:
    """Ratios at concurrency 1, T = 0, from this run; SSD/SD also against its bound (Cor. 9)."""
    by = {r["config"]: r for r in records if r["concurrency"] == 1 and r["temperature"] == 0}
    lines = []
    if {"ssd", "sd", "ar"} <= by.keys():
        ssd, sd, ar = by["ssd"], by["sd"], by["ar"]
        t_sd = sd["link_ms"] / sd["verify_ms"] if sd.get("verify_ms") else 0.0
        bound = (1 + t_sd) * ssd["accept_length"] / sd["accept_length"]
        ratio = ssd["output_throughput"] / sd["output_throughput"]
        lines.append(f"SSD/SD = {ratio:.2f} (bound {bound:.2f}, {100 * ratio / bound:.0f} %)")
        lines.append(f"SSD/AR = {ssd['output_throughput'] / ar['output_throughput']:.2f}")
        lines.append(f"SD/AR = {sd['output_throughput'] / ar['output_throughput']:.2f}")
        if "sd_coloc" in by:
            lines.append(f"SD-colocated/AR = {by['sd_coloc']['output_throughput'] / ar['output_throughput']:.2f}")
        lines.append(f"SSD overhead per round = {ssd['link_ms']:.1f} ms = {100 * ssd['link_ms'] / ssd['verify_ms']:.1f} % of T_v"
                     " (all rounds: a miss waits for the backup's drafting)")
        if ssd.get("hit_rounds"):
            lines.append(f"SSD overhead per all-hit round = {ssd['hit_link_ms']:.1f} ms = "
                         f"{100 * ssd['hit_link_ms'] / ssd['hit_verify_ms']:.1f} % of T_v "
                         f"(lookup + round trip + bookkeeping, {ssd['hit_rounds']} rounds)")
    for t in sorted({r["temperature"] for r in records}):
        at = {r["config"]: r for r in records if r["concurrency"] == 1 and r["temperature"] == t}
        for deep, flat in (("sd3", "sd"), ("ssd3", "ssd")):
            if deep in at and flat in at:
                lines.append(f"3-level {deep.upper()}/{flat.upper()} (T={t:g}, c=1) = "
                             f"{at[deep]['output_throughput'] / at[flat]['output_throughput']:.2f}")
    lines += draft_lines(records)
    lines += defaults_lines(records, default)
    lines += auto_k_lines(records)
    lines += route_lines(records)
    return lines


def draft_lines(records: list[dict]) -> list[str]:
    """Each `NAME~old` configuration (the old draft) next to NAME (the current one) and AR at every
    point: served α, hit rate, tokens per round, throughput over AR."""
    out = []
    at = {(r["config"], r["temperature"], r["concurrency"]): r for r in records}
    for (name, t, c), old in sorted(at.items()):
        base, _, tag = name.partition("~")
        new, ar = at.get((base, t, c)), at.get(("ar", t, c))
        if tag != "old" or not new:
            continue
        line = f"draft {base} T={t:g} c={c}:"
        for label, r in (("new", new), ("old", old)):
            line += (f" {label} α {r.get('alpha', 0):.2f}, hit {r.get('hit_rate', 0):.2f}, "
                     f"{r.get('accept_length') or 0:.2f} tokens/round, {r['output_throughput']:.1f} tok/s")
            line += f" ({r['output_throughput'] / ar['output_throughput']:.2f}x AR);" if ar else ";"
        out.append(line.rstrip(";"))
    return out


def route_lines(records: list[dict]) -> list[str]:
    """Each `NAME@torch` configuration against NAME (default route) and each `NAME^b` (--code-b's
    checkout) against NAME (this one) at every point; and, at c = 1,
    T = 0, the worker's verify phase of `ssd` (K + 1 tokens) against that of `ssd_k0` (K = 0: the same
    worker running SGLang's plain decode forward) on the same route."""
    out = []
    at = {(r["config"], r["temperature"], r["concurrency"]): r for r in records}
    for (name, t, c), r in sorted(at.items()):
        base, _, route = name.partition("@")
        new = at.get((base, t, c))
        if route and new:
            out.append(f"route {base} T={t:g} c={c}: default/{route} = "
                       f"{new['output_throughput'] / r['output_throughput']:.2f}")
        base, _, tag = name.partition("^")
        this = at.get((base, t, c))
        if tag == "b" and this:
            out.append(f"code {base} T={t:g} c={c}: this checkout / --code-b = "
                       f"{this['output_throughput'] / r['output_throughput']:.2f}")
    for (name, t, c), r in sorted(at.items()):
        if r.get("draft_ms_per_round") is not None and r.get("verify_ms"):
            out.append(f"draft server {name} T={t:g} c={c}: {r['draft_ms_per_round']:.1f} ms of forwards per round "
                       f"({r['draft_steps'] / r['steps']:.1f} steps of {r['draft_step_ms']:.1f} ms) against a "
                       f"{r['verify_ms']:.1f} ms verify step")
    for name in ("ssd", "sd"):  # SD's draft waits out the verify: its step runs without a busy neighbour
        for suffix in ("", "@torch"):
            spec, plain = at.get((f"{name}{suffix}", 0.0, 1)), at.get((f"ssd_k0{suffix}", 0.0, 1))
            if spec and plain and spec.get("verify_ms") and plain.get("verify_ms"):
                out.append(verify_step_line(spec, plain, suffix))
    return out


def verify_step_line(ssd: dict, plain: dict, suffix: str) -> str:
    """The fixed-K verify step against the plain step: a speculative configuration's full-width rounds
    (every chain K + 1 tokens) against ssd_k0's plain steps; the mean over all of its rounds, which mixes
    in the misses' shorter chains, only where a run predates the per-width counters (and says so).
    Where the server counts thread CPU time, the same two steps in it follow: wall time includes the
    waits for a core, which SSD's busy draft server makes longer on a small machine. Last, the full
    rounds against the same server's own plain rounds (its misses), where it had any: the two kinds of
    step interleave in one process, so the host's drift between servers and repeats cancels."""
    width = str(ssd["k"] + 1)
    full, rounds = ssd.get("verify_ms_by_width", {}).get(width), ssd.get("rounds_by_width", {})
    step = plain.get("verify_ms_by_width", {}).get("1", plain["verify_ms"])
    if full is None:
        verify, which = ssd["verify_ms"], "mean over all rounds, shorter chains included"
    else:
        verify, which = full, f"full {width}-token chains, {rounds[width]} of {sum(rounds.values())} rounds"
    name = "" if ssd["config"].startswith("ssd") else f" {ssd['config'].split('@')[0]}"  # SSD's keeps its fixed form
    line = (f"verify step{name}{suffix or ' (default route)'}: K = {ssd['k']} verify {verify:.1f} ms = "
            f"{verify / step:.2f}x the plain step ({step:.1f} ms), worker phase timings, c = 1, T = 0 ({which})")
    cpu, cpu_step = ssd.get("verify_cpu_ms_by_width", {}).get(width), plain.get("verify_cpu_ms_by_width", {}).get("1")
    if cpu and cpu_step:
        line += f"; thread CPU time {cpu:.1f} ms = {cpu / cpu_step:.2f}x ({cpu_step:.1f} ms)"
    own = ssd.get("verify_ms_by_width", {}).get("1")
    if full is not None and own:  # the same server's plain rounds: same process, same minutes, same neighbour
        line += f"; {full / own:.2f}x its own {rounds['1']} plain rounds ({own:.1f} ms)"
    return line


def by_point(records: list[dict]) -> dict[tuple, dict[str, dict]]:
    """(temperature, concurrency) -> {configuration: record}, in point order."""
    out: dict[tuple, dict[str, dict]] = {}
    for r in sorted(records, key=lambda r: (r["temperature"], r["concurrency"])):
        out.setdefault((r["temperature"], r["concurrency"]), {})[r["config"]] = r
    return out


def fixed_k_configs(at: dict) -> list[dict]:
    """The fixed-K SSD records of one point (``ssd`` and ``ssd_kN``, this checkout's own: an A/B's
    ``NAME^b`` or ``NAME~old`` is another configuration, not a candidate for the best fixed K)."""
    return [r for n, r in at.items() if n == "ssd" or re.fullmatch(r"ssd_k\d+", n)]


def defaults_lines(records: list[dict], default: str = "ssd_default") -> list[str]:
    """The launch with no SSD flag (configuration ``default``: ``ssd_default``, or the configuration
    that launched the same settings) against AR and the best fixed K, in the fixed form ``defaults:
    SSD/AR = x at c = 1 (best fixed K = k: y; default/best = z; worst default/best over c ≤ C = w)`` at
    T = 0, then each point."""
    rows, worst = [], None
    for (t, c), at in by_point(records).items():
        dflt, ar, fixed = at.get(default), at.get("ar"), fixed_k_configs(at)
        if not dflt or not ar or not fixed:
            continue
        best = max(fixed, key=lambda r: r["output_throughput"])
        vs_best = dflt["output_throughput"] / best["output_throughput"]
        rows.append((t, c, dflt["output_throughput"] / ar["output_throughput"], best, vs_best, ar))
        if worst is None or vs_best < worst[0]:
            worst = (vs_best, t, c)
    one = next((row for row in rows if row[0] == 0 and row[1] == 1), None)
    if one is None:
        return []
    _, _, x, best, z, ar = one
    c_max = max(c for _, c, *_ in rows)
    out = [f"defaults: SSD/AR = {x:.2f} at c = 1 (best fixed K = {best['k']}: "
           f"{best['output_throughput'] / ar['output_throughput']:.2f}; default/best = {z:.2f}; "
           f"worst default/best over c ≤ {c_max} = {worst[0]:.2f} at T = {worst[1]:g}, c = {worst[2]})"]
    out += [f"default ({default}) T={t:g} c={c}: {x_:.2f}x AR, {z_:.2f}x best fixed K = {b['k']}"
            for t, c, x_, b, z_, _ in rows]
    return out


def auto_k_lines(records: list[dict]) -> list[str]:
    """`--ssd-k auto` against the best fixed-K SSD configuration and AR at every point of the run.
    With an `ar_repeat` server in the run, the noise band is the largest |AR repeat / AR − 1| over
    the run's points, and each point says whether auto-K is within it of AR and of the best fixed K."""
    out = []
    at_point = by_point(records)
    repeats = [abs(at["ar_repeat"]["output_throughput"] / at["ar"]["output_throughput"] - 1)
               for at in at_point.values() if "ar" in at and "ar_repeat" in at]
    noise = max(repeats) if repeats else None
    fails = []
    for (t, c), at in at_point.items():
        auto, ar = at.get("ssd_kauto"), at.get("ar")
        fixed = fixed_k_configs(at)
        if not auto or not ar:
            continue
        line = f"auto-K T={t:g} c={c}: {auto['output_throughput']:.1f} tok/s = "
        vs_ar = auto["output_throughput"] / ar["output_throughput"]
        if fixed:
            best = max(fixed, key=lambda r: r["output_throughput"])
            vs_best = auto["output_throughput"] / best["output_throughput"]
            line += f"{vs_best:.2f}x best fixed K={best['k']} ({best['output_throughput']:.1f}), "
            if noise is not None and vs_best < 1 - noise:
                fails.append(f"T={t:g} c={c} vs best fixed K")
        line += f"{vs_ar:.2f}x AR"
        if "ar_repeat" in at:
            line += f" (AR repeat {at['ar_repeat']['output_throughput'] / ar['output_throughput']:.2f}x AR)"
        if noise is not None and vs_ar < 1 - noise:
            fails.append(f"T={t:g} c={c} vs AR")
        out.append(line)
    if noise is not None and out:
        out.append(f"noise band (max |AR repeat/AR - 1| over the run) = {100 * noise:.1f} %; auto-K below it: "
                   + (", ".join(fails) if fails else "nowhere"))
    return out


def plot(records: list[dict], path: Path) -> None:
    """SGLang's convention: output throughput against median TPOT, one line per configuration joined
    in concurrency order, each point labelled with its concurrency; error bars span the repeats."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    temps = sorted({r["temperature"] for r in records})
    if not temps:
        return
    fig, axes = plt.subplots(1, len(temps), figsize=(5.5 * len(temps), 4.5), squeeze=False)
    for ax, temp in zip(axes[0], temps):
        for name in dict.fromkeys(r["config"] for r in records):
            pts = sorted((r for r in records if r["config"] == name and r["temperature"] == temp
                          and r.get("median_tpot_ms")), key=lambda r: r["concurrency"])
            if not pts:
                continue
            xs, ys = [r["median_tpot_ms"] for r in pts], [r["output_throughput"] for r in pts]
            tpots = [[b for _, b in r.get("samples", []) if b is not None] or [x] for r, x in zip(pts, xs)]
            tps = [[a for a, _ in r.get("samples", [])] or [y] for r, y in zip(pts, ys)]
            xerr = [[max(0.0, x - min(b)) for x, b in zip(xs, tpots)], [max(0.0, max(b) - x) for x, b in zip(xs, tpots)]]
            yerr = [[max(0.0, y - min(a)) for y, a in zip(ys, tps)], [max(0.0, max(a) - y) for y, a in zip(ys, tps)]]
            line = ax.errorbar(xs, ys, xerr=xerr, yerr=yerr, marker="o", capsize=3, label=name)
            for r, x, y in zip(pts, xs, ys):
                ax.annotate(f"{r['concurrency']:g}", (x, y), textcoords="offset points", xytext=(4, 4),
                            fontsize=7, color=line[0].get_color())
        ax.set_xlabel("median TPOT, ms (latency →)")
        ax.set_ylabel("output throughput, tokens/s")
        ax.set_title(f"T = {temp} (labels: concurrency)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(ROOT / "models" / "target"))
    ap.add_argument("--draft", default=str(ROOT / "models" / "draft"))
    ap.add_argument("--concurrency", default="1,2,4,8")
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--num-prompts", type=int, default=32,
                    help="requests per point at concurrency < 4 (twice as many from 4 up)")
    ap.add_argument("--repeats", type=int, default=2, help="passes over every point, interleaved")
    ap.add_argument("--restart", action="store_true",
                    help="fresh servers for every repeat, so the spread between servers shows in the repeats")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--configs", default="ar,ar_repeat,sd_coloc,sd,ssd,ssd_kauto,sd3,ssd3")
    ap.add_argument("--ablations", action="store_true")
    ap.add_argument("--k", default="4")
    ap.add_argument("--k-variants", default="", help="extra fixed-K SSD configurations, e.g. 1,2 "
                    "(an `ssd_kN` in --configs adds N by itself)")
    ap.add_argument("--calibration", default=None,
                    help="bench/calibrate.py JSON: also compare every record with the planner's prediction")
    ap.add_argument("--budget", default="12")
    ap.add_argument("--budget-variants", default="",
                    help="extra speculation budgets, e.g. 24,36: configurations ssd_bB (geometric) and ssd_uB "
                         "(uniform fan-out), to be named in --configs")
    ap.add_argument("--old-draft", default=None,
                    help="a second draft folder: configuration NAME~old (e.g. ssd~old) runs NAME with it")
    ap.add_argument("--code-b", default=None,
                    help="another checkout of this project (e.g. `git worktree add /tmp/b COMMIT`): configuration "
                         "NAME^b runs NAME from it (first on the servers' PYTHONPATH), an A/B of two commits")
    ap.add_argument("--dataset", choices=("prompts", "sharegpt"), default="prompts",
                    help="prompts: the project's 200-prompt set; sharegpt: the held-out ShareGPT conversations "
                         "(bench_serving --dataset-name sharegpt)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--default-config", default="ssd_default",
                    help="the configuration the `defaults:` line reads as the launch with no SSD flag (e.g. "
                         "ssd_kauto for a run made before auto-K became that launch)")
    ap.add_argument("--render-only", action="store_true",
                    help="rebuild the table, plot, headline and planner check from --out's sweep.jsonl")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.num_prompts < 1:
        ap.error("--repeats and --num-prompts must be at least 1")
    out = Path(args.out)
    if args.render_only:
        records = [json.loads(ln) for ln in (out / "sweep.jsonl").read_text().splitlines() if ln.strip()]
        render(records, out, args.calibration, args.default_config)
        return 0
    out.mkdir(parents=True, exist_ok=True)
    dataset = prepare_dataset(args.dataset, out)
    names = [n for n in args.configs.split(",") if n]
    k_variants = [x for x in args.k_variants.split(",") if x]
    k_variants += [x for x in k_variants_named(names) if x not in k_variants]
    budget_variants = [x for x in args.budget_variants.split(",") if x]
    all_cfgs = configs(args.draft, args.k, args.budget, k_variants, budget_variants=budget_variants)
    names += [f"ssd_k{k}" for k in k_variants if f"ssd_k{k}" not in names]
    if args.ablations:
        names += [n for n in ABLATIONS if n not in names]
    # `NAME@ROUTE` runs configuration NAME with the CPU linear route ROUTE (e.g. `ar@torch`: today's
    # F.linear path) on the target and its draft server, next to NAME on the default route.
    for n in names:
        base, _, route = n.partition("@")
        if route and base in all_cfgs and route in clib.ROUTES:
            extra, meta = all_cfgs[base]
            all_cfgs[n] = (extra, {**meta, "linear_route": route})
    # `NAME~old` runs configuration NAME with --old-draft instead of --draft (a draft A/B in one run).
    if args.old_draft:
        old_cfgs = configs(args.old_draft, args.k, args.budget, k_variants,
                           budget_variants=budget_variants)
        for n in names:
            base, _, tag = n.partition("~")
            if tag == "old" and base in old_cfgs:
                extra, meta = old_cfgs[base]
                all_cfgs[n] = (extra, {**meta, "draft": "old"})
    # `NAME^b` runs configuration NAME from --code-b's checkout (its kernels, hooks and draft server).
    if args.code_b:
        for n in names:
            base, _, tag = n.partition("^")
            if tag == "b" and base in all_cfgs:
                extra, meta = all_cfgs[base]
                all_cfgs[n] = (extra, {**meta, "code": "b"})
    unknown = [n for n in names if n not in all_cfgs]
    if unknown:
        print(f"error: --configs: unknown configuration {unknown[0]!r} (known: {', '.join(all_cfgs)})",
              file=sys.stderr)
        return 2
    servers: dict[str, SGLangServer] = {}
    records: list[dict] = []
    # A plain `kill` must still stop the servers (each runs in its own session): turn it into an exit.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    jsonl = out / "sweep.jsonl"
    try:
        points = [(float(t), int(c)) for t in args.temperatures.split(",") for c in args.concurrency.split(",")]
        total, done, t0 = len(points) * len(names) * args.repeats, 0, time.perf_counter()
        with jsonl.open("w") as f:
            for rep, (temp, conc) in ((r, p) for r in range(args.repeats) for p in points):
                if not servers or (args.restart and (temp, conc) == points[0]):
                    stop_servers(servers)
                    servers.update(start_servers(names, all_cfgs, args.target, args.code_b))
                for name in names:
                    meta = {k: v for k, v in all_cfgs[name][1].items() if k != "t_min"}
                    if temp < all_cfgs[name][1].get("t_min", 0.0):
                        continue
                    server = servers[name]
                    warm_up(server, temp)
                    before = ssd_state(server)
                    try:
                        bench = run_bench(server, dataset, args.target, conc, temp,
                                          requests_at(conc, args.num_prompts), args.output_len)
                    except RuntimeError as e:  # keep the rest of the sweep; the gap shows in the table
                        print(f"  {name} T={temp} c={conc}: FAILED: {e}", flush=True)
                        done += 1
                        continue
                    rec = summarize(name, bench, before, ssd_state(server),
                                    {"temperature": temp, "concurrency": conc, "output_len": args.output_len,
                                     "dataset": args.dataset, "repeat": rep, **meta})
                    records.append(rec)
                    f.write(json.dumps(rec) + "\n")
                    f.flush()
                    done += 1
                    eta = (time.perf_counter() - t0) / done * (total - done)
                    print(f"  [{done}/{total}] repeat {rep + 1} {name} T={temp} c={conc}: "
                          f"{rec['output_throughput']:.1f} tok/s "
                          f"(ETA {eta / 60:.0f} min)", flush=True)
    finally:
        stop_servers(servers)
    render(records, out, args.calibration, args.default_config)
    return 0


def start_servers(names: list[str], all_cfgs: dict, target: str, code_b: str | None) -> dict[str, SGLangServer]:
    """Every configuration's server, target pinned to core 0 (its draft server's cores are its flags)."""
    servers = {}
    try:
        for i, name in enumerate(names, 1):
            extra_args, meta = all_cfgs[name]
            print(f"[{i}/{len(names)}] starting {name} ...", flush=True)
            env = {clib.ENV: meta["linear_route"]} if meta.get("linear_route") else {}
            if meta.get("code") == "b":
                env["PYTHONPATH"] = str(Path(code_b).resolve())
            servers[name] = SGLangServer(["--model-path", target, *CPU_SERVER_ARGS, *extra_args],
                                         cpu_cores={0}, log_path=f"/tmp/sweep_{name}.log", env=env).start()
    except BaseException:
        stop_servers(servers)
        raise
    return servers


def stop_servers(servers: dict[str, SGLangServer]) -> None:
    for s in servers.values():
        s.stop()
    servers.clear()


def requests_at(concurrency: int, num_prompts: int) -> int:
    """Requests per point: 32 below concurrency 4, 64 from 4 up (with the defaults), so that at the
    sweep's concurrencies (≤ 8) every slot serves several requests."""
    return num_prompts if concurrency < 4 else 2 * num_prompts


def merge_repeats(records: list[dict]) -> list[dict]:
    """One record per (config, T, c), averaged over its repeats the planner's way (``mean_of_runs``:
    numbers over the repeats that have them, realized-k histograms summed, ``runs`` = how many);
    ``samples`` holds each repeat's (output throughput, median TPOT), the error bars' source. A point
    a repeat lacks (a failed run) keeps the repeats it has."""
    from sglang_ssd.planner.sweep import mean_of_runs

    groups: dict[tuple, list[dict]] = {}
    for r in records:
        groups.setdefault((r["config"], r["temperature"], r["concurrency"]), []).append(r)
    merged = []
    for runs in groups.values():
        rec = mean_of_runs([[r] for r in runs])[0]
        rec["samples"] = [(r["output_throughput"], r.get("median_tpot_ms")) for r in runs]
        if all("rounds_by_width" in r for r in runs):  # per width: round-weighted over the repeats
            widths = sorted({d for r in runs for d in r["rounds_by_width"]}, key=int)
            rounds = {d: sum(r["rounds_by_width"].get(d, 0) for r in runs) for d in widths}
            rec["rounds_by_width"] = rounds
            for key in ("verify_ms_by_width", "verify_cpu_ms_by_width"):
                rec.pop(key, None)
                if all(key in r for r in runs):
                    spent = {d: sum(r[key].get(d, 0.0) * r["rounds_by_width"].get(d, 0) for r in runs) for d in widths}
                    rec[key] = {d: spent[d] / rounds[d] for d in widths}
        if rec.get("median_tpot_ms"):  # tokens/s per request of the mean TPOT, as in each run
            rec["per_request_tps"] = 1000.0 / rec["median_tpot_ms"]
        rec.pop("repeat", None)
        merged.append(rec)
    return merged


def spread(rec: dict) -> float:
    """Relative range of a merged record's throughput over its repeats ((max − min) / mean; 0 for one)."""
    tps = [t for t, _ in rec.get("samples", [])]
    return (max(tps) - min(tps)) / (sum(tps) / len(tps)) if len(tps) > 1 else 0.0


def noise_lines(merged: list[dict]) -> list[str]:
    """SSD, SD and auto-K against AR at every point, each ratio judged against the noise band there:
    the larger repeat spread of the two configurations, and the AR-repeat band when the run has one.
    A ratio inside the band is parity."""
    out = []
    at = {(r["config"], r["temperature"], r["concurrency"]): r for r in merged}
    ar_bands = [abs(at[("ar_repeat", t, c)]["output_throughput"] / r["output_throughput"] - 1)
                for (n, t, c), r in at.items() if n == "ar" and ("ar_repeat", t, c) in at]
    ar_band = max(ar_bands, default=0.0)
    for (name, t, c), r in sorted(at.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        ar = at.get(("ar", t, c))
        if name not in ("sd", "ssd", "ssd_kauto") or not ar:
            continue
        ratio = r["output_throughput"] / ar["output_throughput"]
        band = max(spread(r), spread(ar), ar_band)
        head = f"{name}/AR T={t:g} c={c} = {ratio:.2f} over {len(r['samples'])} repeats"
        if not ar_bands and len(r["samples"]) < 2 and len(ar["samples"]) < 2:  # nothing measured the noise
            out.append(f"{head} (no noise band measured: not judged)")
            continue
        verdict = ("parity (inside the band)" if abs(ratio - 1) <= band
                   else "faster than AR" if ratio > 1 else "slower than AR")
        out.append(f"{head} (band {100 * band:.1f} %): {verdict}")
    return out


def render(records: list[dict], out: Path, calibration: str | None, default: str = "ssd_default") -> None:
    merged = merge_repeats(records)
    md = table(merged)
    lines = headline(merged, default) + noise_lines(merged)
    (out / "sweep.md").write_text(md + "\n\n" + "\n".join(lines) + "\n")
    # one record per point: what `python -m sglang_ssd.planner --sweep` takes (it keys records by point)
    (out / "sweep_mean.jsonl").write_text("".join(json.dumps(r) + "\n" for r in merged))
    plot(merged, out / "pareto.png")
    print(md)
    print("\n".join(lines))
    for line in lines:  # the results page keeps the launch defaults' line current
        if line.startswith("defaults: "):
            from bench.readme_blocks import write_line

            write_line("defaults: ", line)
    if calibration:
        from sglang_ssd.planner.sweep import checkable, compare_sweep

        checked = checkable(merged)
        cal = json.loads(Path(calibration).read_text())
        bare = compare_sweep(checked, cal)
        served = compare_sweep(checked, cal, serving_overhead=True)
        text = ("## With the serving overhead per step fitted from the AR rows\n\n" + served +
                "\n\n## Bare forward costs only\n\n" + bare + "\n")  # fmt: skip
        (out / "planner_check.md").write_text(text)
        print(text)


if __name__ == "__main__":
    sys.exit(main())
