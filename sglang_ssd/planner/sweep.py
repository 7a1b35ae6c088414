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

A batch of b requests decodes in waves (N prompts, at most b at a time): speculative rounds emit a
random number of tokens, so a wave lasts until its slowest request has its L tokens. The decode
time is therefore scaled by :func:`straggler_factor`, E[max of b round counts] / E[round count], from
the spread of tokens per round (the record's realized-k histogram ``k_hist`` for the own
prediction, the capped geometric at α for the pooled one). AR emits one token per request per step:
no stragglers.

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

from ..algo.fanout import acceptance_pmf, geometric_fanout, hit_probability, uniform_fanout
from ..algo.policy import expected_tokens
from .costs import CostModel
from .rates import ar_rate, sd_rate, ssd_rate

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
    K, budget = int(rec["k"]), int(rec["budget"])
    if rec.get("fanout", "geometric") == "uniform":
        return uniform_fanout(K, budget)
    return geometric_fanout(alpha, r, K, budget)


def alpha_of(rec: dict) -> float:
    """The per-token α the planner's E(α, K) should take for a record: the α at which the capped
    geometric gives the measured tokens per round (``accept_length``), when there is one. The
    record's ``alpha`` (the maximum-likelihood per-token rate) overstates E here: real accepted
    lengths are burstier than a geometric (many k = 0 rounds, a fat tail)."""
    n = rec.get("accept_length")
    K = rec.get("k")
    if n is None or not str(K).isdigit() or int(K) < 1:
        return float(rec["alpha"])
    K, n = int(K), float(n)
    if n <= 1.0:
        return 0.0
    if n >= K + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, K) < n else (lo, mid)
    return (lo + hi) / 2


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


def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals] (0 for n = 1), by numerical integration."""
    if n <= 1:
        return 0.0
    step, total = 0.01, 0.0
    for i in range(-800, 801):
        x = i * step
        pdf = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        cdf = 0.5 * (1 + math.erf(x / math.sqrt(2)))
        total += x * n * pdf * cdf ** (n - 1) * step
    return total


def tokens_per_round_moments(rec: dict, alpha: float | None = None) -> tuple[float, float]:
    """(mean, variance) of the tokens one request emits per round: from the record's ``k_hist``
    (realized accepted counts) unless ``alpha`` is given, else the capped geometric at α."""
    K = int(rec["k"])
    if alpha is None and rec.get("k_hist"):
        probs = {int(k) + 1: float(n) for k, n in rec["k_hist"].items()}
    else:
        pmf = acceptance_pmf(alpha_of(rec) if alpha is None else alpha, K)
        probs = {k + 1: pk for k, pk in enumerate(pmf)}
    z = sum(probs.values())
    mean = sum(x * p for x, p in probs.items()) / z
    return mean, sum((x - mean) ** 2 * p for x, p in probs.items()) / z


def straggler_factor(batch: int, tokens: int, mean: float, var: float) -> float:
    """E[max over the batch of rounds to emit ``tokens``] / E[rounds], with the round count of one
    request taken as normal (renewal theory: mean L/μ, variance L·σ²/μ³)."""
    if batch <= 1 or tokens <= 0 or var <= 0:
        return 1.0
    mu_r = tokens / mean
    return 1.0 + math.sqrt(tokens * var / mean**3) * expected_max_normal(batch) / mu_r


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


def predict_record(
    rec: dict,
    costs: CostModel,
    *,
    overhead_ms: float = 0.0,
    c: float = 1.0,
    e_miss_fast: float = 1.0,
    pooled: tuple[float, float] | None = None,
    with_ttft: bool = True,
    step_overhead_ms: float = 0.0,
) -> float:
    """Predicted output tokens/s of one record (``pooled`` = (α, r) for the full model, else own stats;
    ``with_ttft`` False = decode rate only, ignoring the record's measured time to first token;
    ``step_overhead_ms``: the server's own cost per target step — scheduling, sampling, bookkeeping —
    that a bare forward calibration does not see)."""
    mode, b = record_mode(rec), int(rec.get("concurrency", 1))
    straggle, n = 1.0, _output_len(rec)  # AR: every request emits one token per step, no stragglers
    if mode != "ar" and n:  # a wave waits for its slowest request (module docstring)
        mean, var = tokens_per_round_moments(rec, pooled[0] if pooled else None)
        straggle = straggler_factor(b, int(n) - 1, mean, var)

    def done(rate: float) -> float:
        rate /= straggle
        return _with_ttft(rec, rate) if with_ttft else rate

    if mode == "ar":
        return done(ar_rate(costs.verify_ms(1, b) + step_overhead_ms, b))
    overhead_ms = overhead_ms + step_overhead_ms
    K = int(rec["k"])
    alpha = pooled[0] if pooled else alpha_of(rec)
    e = expected_tokens(alpha, K)
    tokens = e if pooled or "accept_length" not in rec else float(rec["accept_length"])
    t_v = costs.verify_ms(K + 1, b)
    if mode == "sd":
        return done(sd_rate(tokens, t_v, costs.draft_step_ms(b), K, overhead_ms, b))
    budget = int(rec["budget"])
    if pooled:
        p = hit_probability(_fanout(rec, alpha, pooled[1]), alpha, pooled[1], c)
    else:
        p = float(rec["hit_rate"])
    t_tree = costs.tree_ms(K, budget, b)
    if rec.get("colocated"):
        t_tree += t_v  # one core: the pre-speculation cannot overlap the verification
    backups = {"neural": (e, costs.neural_backup_ms(K, b * (1 - p))), "fast": (e_miss_fast, 0.0)}
    kind = rec.get("backup", "auto")
    share = rec.get("neural_backup_share")
    if kind == "auto" and share is not None and not pooled:  # own: the mix the live policy used
        backups["auto"] = (e, share * backups["neural"][1])
    elif kind == "auto":  # the kind the model rates faster (what the live BackupPolicy would pick)
        kind = max(
            backups, key=lambda n: ssd_rate(p, e, backups[n][0], t_v, t_tree, backups[n][1], overhead_ms, b)
        )
    if kind not in backups:
        raise ValueError(f"sweep: record backup {kind!r} is not neural, fast or auto")
    e_miss, t_b = backups[kind]
    if not pooled and "accept_length" in rec:  # measured tokens per round already mix hit and miss rounds
        e, e_miss = tokens, tokens
    return done(ssd_rate(p, e, e_miss, t_v, t_tree, t_b, overhead_ms, b))


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


def compare_sweep(records: list[dict], calibration: dict, stat: str = "median", overhead_ms: float = 0.0,
                  c: float = 1.0, e_miss_fast: float = 1.0, serving_overhead: bool = False) -> str:  # fmt: skip
    """Table of measured vs predicted tokens/s per record, errors in %, and a summary.
    ``serving_overhead``: add each point's AR-measured step overhead (:func:`step_overheads`) to every
    target step; AR rows are then fitted, not predicted, and are left out of the error counts."""
    costs = CostModel(calibration, stat)
    step_ovh = step_overheads(records, costs) if serving_overhead else {}
    pooled_by_t: dict[float, tuple[float | None, float | None]] = {}
    lines = [
        "| config | T | conc | K | ΣF | α | hit | acc.len | measured tok/s | pred (own) | err % | pred (pooled) | err % |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    own_err, pooled_err, skipped = [], [], []
    for rec in records:
        mode, name = record_mode(rec), rec.get("config", "?")
        meas = rec.get("output_throughput")
        if mode is None or not meas:
            skipped.append(f"{name} (unknown config or no output_throughput)")
            continue
        t = float(rec.get("temperature", 0.0))
        if t not in pooled_by_t:
            a, r, _ = estimate_alpha_r(records, t, c)
            pooled_by_t[t] = (a, r if r is not None else 1.0)
        try:
            so = step_ovh.get((t, int(rec.get("concurrency", 1))), 0.0)
            own = predict_record(rec, costs, overhead_ms=overhead_ms, c=c, e_miss_fast=e_miss_fast,
                                 step_overhead_ms=so)  # fmt: skip
            a, r = pooled_by_t[t]
            pool = None
            if mode == "ar" or a is not None:
                pool = predict_record(rec, costs, overhead_ms=overhead_ms, c=c, e_miss_fast=e_miss_fast,
                                      pooled=None if mode == "ar" else (a, r), step_overhead_ms=so)  # fmt: skip
        except (KeyError, ValueError) as e:
            skipped.append(f"{name} ({e})")
            continue
        e_own = 100.0 * (own - meas) / meas
        e_pool = 100.0 * (pool - meas) / meas if pool else math.nan
        fitted = mode == "ar" and serving_overhead
        if not fitted:
            own_err.append((abs(e_own), name, rec.get("concurrency", 1)))
            if pool:
                pooled_err.append(abs(e_pool))
        if fitted:
            name = f"{name} (fit)"

        def f(key: str, fmt: str = "{:.3f}", rec=rec) -> str:
            return fmt.format(rec[key]) if rec.get(key) is not None else "–"

        lines.append(
            f"| {name} | {t:g} | {rec.get('concurrency', 1)} | {f('k', '{}')} | {f('budget', '{}')} | {f('alpha')} | "
            f"{f('hit_rate')} | {f('accept_length', '{:.2f}')} | {meas:.2f} | {own:.2f} | {e_own:+.1f} | "
            f"{'–' if pool is None else f'{pool:.2f}'} | {'–' if pool is None else f'{e_pool:+.1f}'} |"
        )
    within = sum(1 for e, _, _ in own_err if e <= TOLERANCE_PCT)
    lines.append("")
    if serving_overhead:
        lines.append("serving overhead per target step, fitted from the AR rows (T, concurrency → ms): "
                     + ", ".join(f"({t:g}, {b}) → {v:.1f}" for (t, b), v in sorted(step_ovh.items())))  # fmt: skip
    else:
        lines.append("bare-forward costs only: no serving overhead per step")
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
    lines += [f"skipped: {s}" for s in skipped]
    return "\n".join(lines)
