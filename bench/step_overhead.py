"""Where a served token's time goes: the target's forward against everything else in a step, AR and SSD.

    python bench/step_overhead.py [--concurrency 1,8] [--num-prompts 16] [--output-len 64] [--out DIR]

For each server (AR; SSD with the launch defaults, its draft server on core 1; every SGLang process of
both on core 0, as `make bench` places them) and each concurrency, `python -m sglang.bench_serving`
runs the project's prompt set twice: once as it is, for the figures of the line below, and once while
py-spy samples the scheduler process (200 Hz, idle samples kept, non-blocking), for the phase table.
Each sample is put in one phase by the frames on its stack: the model forward (SGLang's
`forward_batch_generation`, which holds SSD's verify forward too), SSD's own round work outside it
(proposals, verification, the draft link), sampling, processing the batch result (output ids, stop
checks, sending to the detokenizer), receiving requests, scheduling, idle (waiting for work) and the
rest. The table gives each phase's share of the samples. py-spy's line numbers inside C calls can be off
(target/module_timers.py), but a sample's stack still says which phase it is in, which is all this
uses.

The plain forward `f` is also measured bare (`bench/calibrate.py`'s T_v(1): the same kernels on one
request, no server) before and after the servers run, so the line below holds two independent
figures. SSD's per-round figure: the round's wall time (TPOT × tokens per round) over its verify
forward (the worker's own timer). Prints and writes into bench/README.md:

    step overhead: AR TPOT t ms over a plain forward f ms = r (c = 1); SSD round w ms over its verify v ms = s
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.run_sweep import prepare_dataset, run_bench, ssd_state, summarize, warm_up  # noqa: E402
from sglang_ssd.tools.server_process import CPU_SERVER_ARGS, SGLangServer  # noqa: E402

# phase -> frame function names that put a sample in it (the first phase matched, in this order, wins)
# ("name@file" also needs the frame's file to contain `file`: the SSD worker's own entry point is called
# forward_batch_generation too, and holds the whole round)
PHASES = {
    "forward": ("forward_batch_generation@tp_worker", "forward@model_runner"),
    "ssd_round": ("_propose", "_verify", "_accept_layout", "_report"),
    "sampling": ("launch_batch_sample_if_needed", "sample"),
    "result": ("process_batch_result", "process_batch_result_decode", "stream_output"),
    "receive": ("recv_requests", "process_input_requests"),
    "schedule": ("get_next_batch_to_run", "prepare_for_decode", "get_new_batch_prefill"),
    "idle": ("on_idle", "sleep", "poll", "wait", "select"),
}


def py_spy() -> str:
    return str(Path(sys.executable).parent / "py-spy")


def scheduler_pid(server: SGLangServer) -> int:
    """The scheduler among the server's processes (SGLang titles it ``sglang::scheduler`` once it runs)."""
    import psutil

    for child in psutil.Process(server.proc.pid).children(recursive=True):
        try:
            if "sglang::scheduler" in " ".join(child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    raise RuntimeError("no scheduler process found under the server")


def _matches(frame: str, mark: str) -> bool:
    name, _, where = frame.partition(" (")  # py-spy writes "Class.method (file.py:line)"
    want, _, in_file = mark.partition("@")
    return name.rsplit(".", 1)[-1] == want and in_file in where


def phase_of(stack: str) -> str | None:
    """The phase of one sample of the scheduler's main thread; None for its other threads (a tqdm
    monitor, the watchdog), which wait all the time and are not the step."""
    if "run_scheduler_process" not in stack:
        return None
    frames = stack.split(";")
    for phase, marks in PHASES.items():
        if any(_matches(frame, mark) for frame in frames for mark in marks):
            return phase
    return "other"


def profiled_bench(server: SGLangServer, dataset: Path, tokenizer: str, c: int, n: int, output_len: int):
    """(bench_serving record, samples per phase) for one run with py-spy on the scheduler."""
    with tempfile.NamedTemporaryFile(suffix=".txt", delete=False) as f:
        raw = Path(f.name)
    spy = subprocess.Popen([py_spy(), "record", "--pid",
                            str(scheduler_pid(server)), "--rate", "200", "--idle", "--nonblocking", "--format",
                            "raw", "-o", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(1.0)  # attached before the first request
    try:
        bench = run_bench(server, dataset, tokenizer, c, 0.0, n, output_len)
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(timeout=60)
    phases: Counter = Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        phase = phase_of(stack) if stack and count.isdigit() else None
        if phase is not None:
            phases[phase] += int(count)
    raw.unlink(missing_ok=True)
    return bench, phases


def bare_forward_ms(target: str, draft: str) -> float:
    """T_v(1) from bench/calibrate.py --quick (median over its repeats)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = Path(f.name)
    subprocess.run([sys.executable, str(ROOT / "bench" / "calibrate.py"), "--quick", "--no-readme", "--skip-draft",
                    "--target", target, "--draft", draft, "--out", str(out)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    ms = json.loads(out.read_text())["target"]["verify_ms"][0]
    out.unlink()
    return ms


def split(phases: Counter) -> dict:
    """Each phase's share (%) of the scheduler's samples over the whole run: decode steps, prefills and the
    gaps between one request and the next (at c = 1 the scheduler waits while the client turns around)."""
    total = sum(phases.values()) or 1
    return {p: round(100.0 * phases.get(p, 0) / total, 1) for p in [*PHASES, "other"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=str(ROOT / "models" / "target"))
    ap.add_argument("--draft", default=str(ROOT / "models" / "draft"))
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--num-prompts", type=int, default=16, help="requests per point (4 × c at least)")
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "step_overhead"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dataset = prepare_dataset("prompts", out)
    concurrency = [int(c) for c in args.concurrency.split(",")]
    f_before = bare_forward_ms(args.target, args.draft)
    configs = {"ar": [], "ssd": ["--speculative-algorithm", "SSD", "--speculative-draft-model-path", args.draft,
                                 "--ssd-draft-cores", "1"]}  # fmt: skip
    records = []
    for name, extra in configs.items():
        with SGLangServer(["--model-path", args.target, *CPU_SERVER_ARGS, *extra], cpu_cores={0},
                          log_path=f"/tmp/step_overhead_{name}.log") as server:  # fmt: skip
            for c in concurrency:
                n = max(args.num_prompts, 4 * c)
                # The figures of the line come from a run without the profiler (py-spy slows the Python
                # parts of a step: the SSD round read 1.24x its verify under it, 1.12-1.18x without);
                # the phase table from a second run with it.
                warm_up(server, 0.0)
                before = ssd_state(server)
                bench = run_bench(server, dataset, args.target, c, 0.0, n, args.output_len)
                rec = summarize(name, bench, before, ssd_state(server), {"concurrency": c, "temperature": 0.0})
                profiled, phases = profiled_bench(server, dataset, args.target, c, n, args.output_len)
                rec["profiled_tpot_ms"] = profiled.get("median_tpot_ms")
                rec["phase_percent"] = split(phases)
                rec["phase_samples"] = dict(phases)
                rec["samples"] = sum(phases.values())
                records.append(rec)
                print(f"{name} c={c}: TPOT {rec['median_tpot_ms']:.1f} ms, % of scheduler samples {rec['phase_percent']}",
                      flush=True)  # fmt: skip
    f_after = bare_forward_ms(args.target, args.draft)
    f = (f_before + f_after) / 2
    lines = report(records, f, f_before, f_after)
    (out / "step_overhead.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (out / "step_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    from bench.readme_blocks import write_line

    write_line("step overhead: ", lines[0])
    return 0


def report(records: list[dict], f: float, f_before: float, f_after: float) -> list[str]:
    at = {(r["config"], r["concurrency"]): r for r in records}
    ar, ssd = at.get(("ar", 1)), at.get(("ssd", 1))
    head = "step overhead:"
    if ar:
        head += (f" AR TPOT {ar['median_tpot_ms']:.1f} ms over a plain forward {f:.1f} ms = "
                 f"{ar['median_tpot_ms'] / f:.2f} (c = 1)")  # fmt: skip
    if ssd and ssd.get("verify_ms") and ssd.get("accept_length"):
        wall = ssd["median_tpot_ms"] * ssd["accept_length"]
        head += f"; SSD round {wall:.1f} ms over its verify {ssd['verify_ms']:.1f} ms = {wall / ssd['verify_ms']:.2f}"
    lines = [head, f"plain forward (bench/calibrate.py T_v(1), bare): {f_before:.1f} ms before, {f_after:.1f} ms after",
             "", "Scheduler time by phase, % of py-spy's samples of its main thread over a second run of each "
             "point with the profiler attached (200 Hz; samples py-spy could not read are missing, and they fall "
             "mostly inside C calls, so the forward's share is a lower bound). TPOT: without / with the profiler.",
             "",
             "| server | c | TPOT ms | " + " | ".join(f"{p} %" for p in [*PHASES, "other"]) + " | samples |",
             "|---|---|---|" + "---|" * (len(PHASES) + 2)]  # fmt: skip
    for r in records:
        cells = " | ".join(f"{r['phase_percent'][p]:.1f}" for p in [*PHASES, "other"])
        tpot = f"{r['median_tpot_ms']:.1f} / {r.get('profiled_tpot_ms') or float('nan'):.1f}"
        lines.append(f"| {r['config']} | {r['concurrency']} | {tpot} | {cells} | {r['samples']} |")
    return lines


if __name__ == "__main__":
    sys.exit(main())
