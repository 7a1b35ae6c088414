"""A serving sweep's JSONL records against the planner's predictions.

A record is one measured configuration (one line of JSON). Fields read: ``config`` (a name containing
"ssd", "sd" or starting with "ar"; ``k`` = 0 also means AR), ``k``, ``budget`` (ΣF_k per request),
``concurrency`` (= batch b), ``temperature``, ``alpha`` (per-token acceptance), ``hit_rate`` (SSD cache
hits / lookups), ``accept_length`` (tokens per round, bonus included), ``output_throughput``
(measured output tokens/s, all requests). Optional: ``backup`` ("neural" | "fast" | "auto"),
``fanout`` ("geometric" | "uniform"), ``saguaro_c``, ``neural_backup_share`` (the share of misses the
live auto policy covered with the neural backup; the own prediction then prices that mix), ``colocated`` (SSD's draft on the target's core:
no overlap, round = T_v + T_tree), ``mean_ttft_ms`` with ``output_len`` (or ``total_output_tokens`` and
``completed``) — when present the prediction adds the measured time to first token to each request,
as the measured throughput includes it.

A batch of b requests decodes in waves: the decode time is scaled by the straggler factor of
:mod:`.rounds` (AR emits one token per request per step: no stragglers).

Two predictions per record:
- **own**: the timing model fed with the record's own measured acceptance — tokens per round =
  ``accept_length`` (else E(α, K)), p_hit = ``hit_rate``. Tests the cost side of the model.
- **pooled**: the full model — α and r pooled over the sweep at the record's temperature, p_hit from
  the fan-out plan. Tests the whole planner.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from ..algo.fanout import hit_probability
from ..algo.policy import expected_tokens
from .costs import CostModel
from .predict import backup_options, fanout_plan, predict_sd
from .rates import ar_rate, fastest_backup, ssd_rate
from .rounds import alpha_of, straggler_factor, tokens_per_round_moments

TOLERANCE_PCT = 15.0


def load_sweep(path: str | Path) -> list[dict]:
    records = []
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"sweep: line {i} of {path} is not JSON ({e})") from e
            if not isinstance(rec, dict):
                raise ValueError(f"sweep: line {i} of {path} is not an object")
            records.append(rec)
    return records


_NOT_AVERAGED = {"k", "budget", "concurrency", "temperature", "output_len", "levels"}


def mean_of_runs(runs: list[list[dict]]) -> list[dict]:
    """One record per (config, temperature, concurrency) present in every run: measured numbers
    averaged over the runs (over the runs that have them, for fields a run may lack), realized-k
    histograms summed; ``runs`` = how many. Repeating a sweep and averaging is how a point's
    machine noise is brought below the planner's tolerance."""
    def key(r: dict) -> tuple:
        return r.get("config"), float(r.get("temperature", 0.0)), int(r.get("concurrency", 1))

    by_run = [{key(r): r for r in run} for run in runs]
    out = []
    for k in by_run[0]:
        if not all(k in b for b in by_run[1:]):
            continue
        rs = [b[k] for b in by_run]
        merged = dict(rs[0])
        fields = {f for r in rs for f, v in r.items() if isinstance(v, int | float) and not isinstance(v, bool)}
        for f in fields - _NOT_AVERAGED:
            vals = [r[f] for r in rs if isinstance(r.get(f), int | float)]
            merged[f] = sum(vals) / len(vals)
        hists = [r.get("k_hist") for r in rs]
        if all(hists):
            merged["k_hist"] = {n: sum(h.get(n, 0) for h in hists) for n in sorted(set().union(*hists), key=int)}
        merged["runs"] = len(rs)
        out.append(merged)
    return out


def checkable(records: list[dict]) -> list[dict]:
    """The records the planner's sweep check models: fixed-K, two-level (auto-K has no single K;
    three-level rows have their own model, ``planner/depth.py``)."""
    return [r for r in records if str(r.get("k")) != "auto" and r.get("levels", 2) == 2]


def record_mode(rec: dict) -> str | None:
    cfg = str(rec.get("config", "")).lower()
    if "ssd" in cfg:
        return "ssd"
    if cfg.startswith("ar") or rec.get("k") == 0:
        return "ar"
    if "sd" in cfg:
        return "sd"
    return None


def _same_t(rec: dict, temperature: float) -> bool:
    return abs(float(rec.get("temperature", 0.0)) - temperature) < 1e-6


def _fanout(rec: dict, alpha: float, r: float) -> list[int]:
    return fanout_plan(alpha, r, int(rec["k"]), int(rec["budget"]), rec.get("fanout", "geometric"))


def r_from_hit_rate(rec: dict, c: float = 1.0, r_max: float = 50.0) -> float | None:
    """r at which the fan-out model's p_hit equals the record's ``hit_rate`` (bisection; the model's
    p_hit grows with r). None when out of reach (e.g. forks with F ≤ 1 contribute nothing at c = 1)."""
    alpha, target = alpha_of(rec), float(rec["hit_rate"])

    def f(r: float) -> float:
        return hit_probability(_fanout(rec, alpha, r), alpha, r, c) - target

    if f(0.0) > 0 or f(r_max) < 0:
        return None
    lo, hi = 0.0, r_max
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def estimate_alpha_r(
    records: list[dict], temperature: float, c: float = 1.0
) -> tuple[float | None, float | None, str]:
    """(α, r, how): medians over the SD/SSD records at ``temperature`` (all temperatures if none)."""
    # Fixed-K two-level records only: auto-K has no single K, three-level rows share α but not costs.
    spec = [x for x in records if record_mode(x) in ("sd", "ssd") and "alpha" in x
            and str(x.get("k")).isdigit() and x.get("levels", 2) == 2]  # fmt: skip
    at_t = [x for x in spec if _same_t(x, temperature)]
    scope = f"T = {temperature:g}"
    if not at_t and spec:
        at_t, scope = spec, "all temperatures (none at the requested one)"
    alpha = statistics.median(alpha_of(x) for x in at_t) if at_t else None
    rs = [
        r for x in at_t
        if record_mode(x) == "ssd" and 0 < float(x.get("hit_rate", 0)) < 1 and "budget" in x
        for r in [r_from_hit_rate(x, c)] if r is not None
    ]  # fmt: skip
    r = statistics.median(rs) if rs else None
    how = (f"from the sweep ({scope}): α = median over {len(at_t)} records of the α whose E(α, K) is "
           f"their accept length"
           + (f", r = median over {len(rs)} SSD records of the r that makes the fan-out model's p_hit "
              f"equal their hit_rate (c = {c:g})" if rs else ", r not estimable (no usable SSD record)"))  # fmt: skip
    return alpha, r, how


def _output_len(rec: dict) -> float | None:
    n = rec.get("output_len")
    if n is None and rec.get("total_output_tokens") and rec.get("completed"):
        n = rec["total_output_tokens"] / rec["completed"]
    return n


def _with_ttft(rec: dict, rate: float) -> float:
    """Aggregate rate once each request also waits its measured time to first token."""
    ttft = rec.get("mean_ttft_ms")
    n = _output_len(rec)
    if ttft is None or not n:
        return rate
    b = int(rec.get("concurrency", 1))
    return 1000.0 * b * n / (float(ttft) + 1000.0 * n * b / rate)


def predict_record(rec: dict, costs: CostModel, *, overhead_ms: float = 0.0, c: float = 1.0,
                   e_miss_fast: float = 1.0, pooled: tuple[float, float] | None = None, with_ttft: bool = True,
                   step_overhead_ms: float = 0.0) -> float:  # fmt: skip
    """Predicted output tokens/s of one record (``pooled`` = (α, r) for the full model, else own stats;
    ``with_ttft`` False = decode rate only, ignoring the record's measured time to first token;
    ``step_overhead_ms``: the server's own cost per target step — scheduling, sampling, bookkeeping —
    that a bare forward calibration does not see)."""
    mode, b = record_mode(rec), int(rec.get("concurrency", 1))
    straggle = _straggle(rec, mode, b, pooled)
    if mode == "ar":
        rate = ar_rate(costs.verify_ms(1, b) + step_overhead_ms, b)
    else:
        rate = _speculative_rate(rec, costs, mode, b, overhead_ms + step_overhead_ms, c, e_miss_fast, pooled)
    rate /= straggle
    return _with_ttft(rec, rate) if with_ttft else rate


def _straggle(rec: dict, mode: str | None, batch: int, pooled: tuple[float, float] | None) -> float:
    """A wave waits for its slowest request (:mod:`.rounds`); AR: every request emits one token per
    step, no stragglers."""
    n = _output_len(rec)
    if mode == "ar" or not n:
        return 1.0
    mean, var = tokens_per_round_moments(rec, pooled[0] if pooled else None)
    return straggler_factor(batch, int(n) - 1, mean, var)


def _speculative_rate(rec: dict, costs: CostModel, mode: str | None, b: int, overhead_ms: float, c: float,
                      e_miss_fast: float, pooled: tuple[float, float] | None) -> float:  # fmt: skip
    """SD or SSD at the record's K through the planner's model: with the record's own tokens per
    round and hit rate, or with E(α, K) and the fan-out model's p_hit at the pooled (α, r)."""
    K = int(rec["k"])
    alpha = pooled[0] if pooled else alpha_of(rec)
    e = expected_tokens(alpha, K)
    own_tokens = None if pooled or "accept_length" not in rec else float(rec["accept_length"])
    if mode == "sd":
        return predict_sd(costs, alpha, K, batch=b, overhead_ms=overhead_ms, tokens_per_round=own_tokens).tok_s
    t_v, budget = costs.verify_ms(K + 1, b), int(rec["budget"])
    p = hit_probability(_fanout(rec, alpha, pooled[1]), alpha, pooled[1], c) if pooled else float(rec["hit_rate"])
    t_tree = costs.tree_ms(K, budget, b)
    if rec.get("colocated"):
        t_tree += t_v  # one core: the pre-speculation cannot overlap the verification
    backups = backup_options(costs, K, e, p, b, e_miss_fast)
    kind = rec.get("backup", "auto")
    share = rec.get("neural_backup_share")
    if kind == "auto" and share is not None and not pooled:  # own: the mix the live policy used
        backups["auto"] = (e, share * backups["neural"][1])
    elif kind == "auto":  # the kind the model rates faster (what the live BackupPolicy would pick)
        kind = fastest_backup(backups, p, e, t_v, t_tree, overhead_ms, b)
    if kind not in backups:
        raise ValueError(f"sweep: record backup {kind!r} is not neural, fast or auto")
    e_miss, t_b = backups[kind]
    if own_tokens is not None:  # measured tokens per round already mix hit and miss rounds
        e, e_miss = own_tokens, own_tokens
    return ssd_rate(p, e, e_miss, t_v, t_tree, t_b, overhead_ms, b)


def saguaro_table(records: list[dict], calibration: dict, temperature: float, stat: str = "median",
                  overhead_ms: float = 0.0) -> dict[float, float] | None:  # fmt: skip
    """Predicted tok/s per Saguaro C from the SSD records at ``temperature`` > 0 that carry
    ``saguaro_c`` (their own α and hit rate, so C's effect on both is measured, not modelled; decode
    rate, without the records' time to first token).
    Concurrency-1 records only when there are any. None with fewer than two distinct C."""
    if temperature <= 0:
        return None
    recs = [x for x in records if record_mode(x) == "ssd" and "saguaro_c" in x and _same_t(x, temperature)]
    if any(int(x.get("concurrency", 1)) == 1 for x in recs):
        recs = [x for x in recs if int(x.get("concurrency", 1)) == 1]
    costs = CostModel(calibration, stat)
    by_c: dict[float, list[float]] = {}
    for x in recs:
        by_c.setdefault(float(x["saguaro_c"]), []).append(
            predict_record(x, costs, overhead_ms=overhead_ms, with_ttft=False)
        )
    if len(by_c) < 2:
        return None
    return {k: sum(v) / len(v) for k, v in by_c.items()}


def step_overheads(records: list[dict], costs: CostModel) -> dict[tuple[float, int], float]:
    """Per (temperature, concurrency): the AR records' measured time per output token minus the bare
    forward T_v(1, b) — what serving adds to every target step on this machine (the mean over the
    point's AR records: a sweep may run AR twice for its noise band)."""
    by: dict[tuple[float, int], list[float]] = {}
    for r in records:
        if record_mode(r) == "ar" and r.get("median_tpot_ms"):
            b = int(r.get("concurrency", 1))
            by.setdefault((float(r.get("temperature", 0.0)), b), []).append(
                max(0.0, float(r["median_tpot_ms"]) - costs.verify_ms(1, b)))
    return {key: sum(v) / len(v) for key, v in by.items()}


_TABLE_HEAD = [
    "| config | T | conc | K | ΣF | α | hit | acc.len | measured tok/s | pred (own) | err % | pred (pooled) | err % |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
]


def compare_sweep(records: list[dict], calibration: dict, stat: str = "median", overhead_ms: float = 0.0,
                  c: float = 1.0, e_miss_fast: float = 1.0, serving_overhead: bool = False) -> str:  # fmt: skip
    """Table of measured vs predicted tokens/s per record, errors in %, and a summary.
    ``serving_overhead``: add each point's AR-measured step overhead (:func:`step_overheads`) to every
    target step; AR rows are then fitted, not predicted, and are left out of the error counts."""
    costs = CostModel(calibration, stat)
    step_ovh = step_overheads(records, costs) if serving_overhead else {}
    model = {"overhead_ms": overhead_ms, "c": c, "e_miss_fast": e_miss_fast}
    pooled_by_t: dict[float, tuple[float | None, float]] = {}
    lines, own_err, pooled_err, skipped = list(_TABLE_HEAD), [], [], []
    for rec in records:
        mode, name, meas = record_mode(rec), rec.get("config", "?"), rec.get("output_throughput")
        if mode is None or not meas:
            skipped.append(f"{name} (unknown config or no output_throughput)")
            continue
        t = float(rec.get("temperature", 0.0))
        if t not in pooled_by_t:
            a, r, _ = estimate_alpha_r(records, t, c)
            pooled_by_t[t] = (a, r if r is not None else 1.0)
        try:
            own, pool = _own_and_pooled(rec, costs, mode, pooled_by_t[t], step_ovh, model)
        except (KeyError, ValueError) as e:
            skipped.append(f"{name} ({e})")
            continue
        fitted = mode == "ar" and serving_overhead
        if not fitted:
            own_err.append((abs(_err_pct(own, meas)), name, rec.get("concurrency", 1)))
            if pool:
                pooled_err.append(abs(_err_pct(pool, meas)))
        lines.append(_row(rec, f"{name} (fit)" if fitted else name, t, meas, own, pool))
    return "\n".join(lines + _summary(own_err, pooled_err, skipped, step_ovh, serving_overhead))


def _own_and_pooled(rec: dict, costs: CostModel, mode: str, pooled: tuple[float | None, float],
                    step_ovh: dict[tuple[float, int], float], model: dict) -> tuple[float, float | None]:  # fmt: skip
    """The record's two predictions (module docstring); pooled is None without a pooled α."""
    so = step_ovh.get((float(rec.get("temperature", 0.0)), int(rec.get("concurrency", 1))), 0.0)
    own = predict_record(rec, costs, step_overhead_ms=so, **model)
    a, r = pooled
    if mode != "ar" and a is None:
        return own, None
    return own, predict_record(rec, costs, pooled=None if mode == "ar" else (a, r), step_overhead_ms=so, **model)


def _err_pct(pred: float, meas: float) -> float:
    return 100.0 * (pred - meas) / meas


def _row(rec: dict, name: str, t: float, meas: float, own: float, pool: float | None) -> str:
    def f(key: str, fmt: str = "{:.3f}") -> str:
        return fmt.format(rec[key]) if rec.get(key) is not None else "–"

    e_pool = _err_pct(pool, meas) if pool else math.nan
    return (
        f"| {name} | {t:g} | {rec.get('concurrency', 1)} | {f('k', '{}')} | {f('budget', '{}')} | {f('alpha')} | "
        f"{f('hit_rate')} | {f('accept_length', '{:.2f}')} | {meas:.2f} | {own:.2f} | {_err_pct(own, meas):+.1f} | "
        f"{'–' if pool is None else f'{pool:.2f}'} | {'–' if pool is None else f'{e_pool:+.1f}'} |"
    )


def _summary(own_err: list[tuple[float, str, int]], pooled_err: list[float], skipped: list[str],
             step_ovh: dict[tuple[float, int], float], serving_overhead: bool) -> list[str]:  # fmt: skip
    """Lines under the table: the overhead used, how many predictions fall within the tolerance, the misses."""
    lines = [""]
    if serving_overhead:
        lines.append("serving overhead per target step, fitted from the AR rows (T, concurrency → ms): "
                     + ", ".join(f"({t:g}, {b}) → {v:.1f}" for (t, b), v in sorted(step_ovh.items())))  # fmt: skip
    else:
        lines.append("bare-forward costs only: no serving overhead per step")
    within = sum(1 for e, _, _ in own_err if e <= TOLERANCE_PCT)
    lines.append(f"own-stats predictions within ±{TOLERANCE_PCT:g} %: {within} of {len(own_err)}")
    per_config: dict[str, list[float]] = {}
    for e, name, _ in own_err:
        per_config.setdefault(name, []).append(e)
    if per_config:
        lines.append("own-stats |error| per configuration, mean (max): " + ", ".join(
            f"{n} {sum(v) / len(v):.1f} % ({max(v):.1f} %)" for n, v in per_config.items()))
    misses = sorted((x for x in own_err if x[0] > TOLERANCE_PCT), reverse=True)
    for e, name, conc in misses:
        lines.append(f"  MISSED: {name} at concurrency {conc}: |error| {e:.1f} %")
    if pooled_err:
        pw = sum(1 for e in pooled_err if e <= TOLERANCE_PCT)
        lines.append(f"pooled-α/r predictions within ±{TOLERANCE_PCT:g} %: {pw} of {len(pooled_err)}")
    return lines + [f"skipped: {s}" for s in skipped]
