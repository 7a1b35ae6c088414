"""Planner: predicted tokens/s of AR, SD and SSD from measured forward costs, and the settings to use.

    python -m sglang_ssd.planner --calibration bench/results/calibration.json [--sweep bench/results/sweep.jsonl[,RUN2...]]
                              [--serving-overhead] [--alpha A] [--r R] [--batch B] [--temperature T]

Model (times in ms, rates in output tokens/s over the b requests of a batch; paper Theorem 7 /
Corollary 9 / Theorem 17 with the latencies priced in ms, see ``sglang_ssd/planner/rates.py``):

- AR (K = 0): b / T_v(1)
- SD per round: b·E(α, K) / (T_v(K+1) + K·T_draft + overhead)
- SSD per round: b·(p_hit·E_hit + (1 − p_hit)·E_miss) / (max(T_v(K+1), T_tree) + (1 − p_hit^b)·T_backup + overhead)

with E(α, K) = (1 − α^{K+1})/(1 − α); T_v(n) the target's forward over n new tokens (batch b);
T_draft one draft step of b tokens; T_tree = glue(b·(K+1) tokens) + K·tree_step(b·ΣF tokens);
p_hit = Σ_k P(k)(1 − c·F_k^{−r}) for the fan-out plan F (``algo.fanout.hit_probability``);
E_hit = E(α, K); the backup is neural (E_miss = E(α, K), T_backup = K draft steps over the missed
requests) or fast (E_miss = ``e_miss_fast``, T_backup = 0), whichever the model rates faster — the
choice the live ``BackupPolicy`` makes. At b = 1, (1 − p_hit^b) = (1 − p_hit). ``overhead`` is the
per-round lookup + communication (default 0: not measured by the calibration; pass the wire bench's).

K = 0 (plain decoding) is recommended whenever no K > 0 is predicted faster than AR.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, field

from ..algo.policy import BackupOption, crossover_batch, expected_tokens
from .costs import CostModel
from .depth import compare_depths, format_depths
from .predict import (
    Prediction,
    choose_k,
    predict_ar,
    predict_sd,
    predict_ssd,
    predict_ssd_best_budget,
)
from .rates import check_unit
from .sweep import checkable, compare_sweep, estimate_alpha_r, load_sweep, mean_of_runs, saguaro_table

# The one-configuration predictions live in planner/predict.py; they stay importable from here.
__all__ = ["Plan", "Prediction", "choose_k", "format_plan", "main", "plan", "predict_sd", "predict_ssd"]


@dataclass
class Plan:
    """Predictions for K = 0..k_max and the recommendation. ``recommended`` is the fastest of all
    (AR when nothing beats it: K = 0); ``best_ssd`` / ``best_sd`` are the fastest of each mode."""

    alpha: float
    r: float
    c: float
    batch: int
    temperature: float
    overhead_ms: float
    ar: Prediction
    sd: list[Prediction]
    ssd: list[Prediction]
    recommended: Prediction
    best_sd: Prediction | None
    best_ssd: Prediction | None
    b_star: int | None
    saguaro_c: float
    saguaro_note: str
    notes: list[str] = field(default_factory=list)

    @property
    def k(self) -> int:
        """Recommended K (0 = plain decoding)."""
        return self.recommended.k

    def to_dict(self) -> dict:
        return asdict(self)


def plan(calibration: dict, alpha: float, r: float, batch: int = 1, *, c: float = 1.0, temperature: float = 0.0,
         overhead_ms: float = 0.0, e_miss_fast: float = 1.0, k_max: int = 8, max_budget: int = 64,
         fanout_mode: str = "geometric", stat: str = "median", saguaro: dict[float, float] | None = None,
         tree_share: float | None = None) -> Plan:  # fmt: skip
    """Predict AR / SD / SSD for K = 0..k_max (SSD at its best budget 1..max_budget per K) and recommend.

    ``calibration``: the dict of ``bench/calibrate.py``. ``alpha``: per-token acceptance; ``r``, ``c``:
    the miss power law 1 − p_hit(F) = c·F^{−r}. ``saguaro``: predicted tok/s per Saguaro C measured at
    this temperature (from a sweep), if any — C is not otherwise modelled. ``tree_share``: the most of
    a verify step an SSD tree may take (``predict_ssd_best_budget``).
    """
    _check_inputs(alpha, r, c, batch, k_max, max_budget, fanout_mode, temperature, overhead_ms)
    costs = CostModel(calibration, stat)
    ks = range(1, k_max + 1) if costs.has_draft else range(0)
    ar = predict_ar(costs, batch)
    sd = [predict_sd(costs, alpha, K, batch=batch, overhead_ms=overhead_ms) for K in ks]
    ssd = [predict_ssd_best_budget(costs, alpha, r, K, max_budget, tree_share, batch=batch, c=c,
                                   overhead_ms=overhead_ms, e_miss_fast=e_miss_fast, fanout_mode=fanout_mode)
           for K in ks]  # fmt: skip
    best_sd = max(sd, key=_rate, default=None)
    best_ssd = max(ssd, key=_rate, default=None)
    recommended = max([ar, *sd, *ssd], key=_rate)  # ties keep AR (first)
    b_star = _backup_threshold(costs, alpha, best_ssd, e_miss_fast)
    sag_c, sag_note = _saguaro_choice(temperature, saguaro)
    return Plan(alpha, r, c, batch, temperature, overhead_ms, ar, sd, ssd, recommended, best_sd, best_ssd,
                b_star, sag_c, sag_note, _notes(costs, batch, k_max))  # fmt: skip


def _rate(p: Prediction) -> float:
    return p.tok_s


def _check_inputs(alpha: float, r: float, c: float, batch: int, k_max: int, max_budget: int,
                  fanout_mode: str, temperature: float, overhead_ms: float) -> None:  # fmt: skip
    check_unit("alpha", alpha)
    check_unit("c", c)
    if not (isinstance(r, int | float) and math.isfinite(r) and r >= 0):
        raise ValueError(f"r must be a finite number ≥ 0, got {r}")
    if not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be an integer ≥ 1, got {batch}")
    if not isinstance(k_max, int) or k_max < 0:
        raise ValueError(f"k_max must be an integer ≥ 0, got {k_max}")
    if not isinstance(max_budget, int) or max_budget < 1:
        raise ValueError(f"max_budget must be an integer ≥ 1, got {max_budget}")
    if fanout_mode not in ("geometric", "uniform"):
        raise ValueError(f"fanout_mode must be 'geometric' or 'uniform', got {fanout_mode!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be ≥ 0, got {temperature}")
    if not (math.isfinite(overhead_ms) and overhead_ms >= 0):
        raise ValueError(f"overhead_ms must be ≥ 0, got {overhead_ms}")


def _notes(costs: CostModel, batch: int, k_max: int) -> list[str]:
    """What the predictions rest on beyond the calibration's measurements."""
    notes = []
    if batch not in costs.measured_batches():
        notes.append(f"target batch {batch} not measured: T_v scaled from batch ≤ {batch} by token count")
    if k_max + 1 > costs.max_verify_n:
        notes.append(f"T_v(n) for n > {costs.max_verify_n} is extrapolated (average slope)")
    if not costs.has_draft:
        notes.append("no draft timings: only AR is predicted")
    elif costs.draft_source != "draft folder":
        notes.append(f"draft costs are those of a stand-in ({costs.draft_source})")
    return notes


def _backup_threshold(costs: CostModel, alpha: float, best_ssd: Prediction | None, e_miss_fast: float) -> int | None:
    """b* at the best SSD setting, as the live ``BackupPolicy`` computes it (``algo.policy``, in units
    of T_v): the threshold the draft server will act on."""
    if best_ssd is None:
        return None
    t_v = best_ssd.verify_ms
    e = expected_tokens(alpha, best_ssd.k)
    neural = BackupOption(e, costs.neural_backup_ms(best_ssd.k, 1.0) / t_v)
    return crossover_batch(best_ssd.p_hit, e, best_ssd.draft_ms / t_v, neural, BackupOption(e_miss_fast, 0.0))


def _saguaro_choice(temperature: float, saguaro: dict[float, float] | None) -> tuple[float, str]:
    """(C, why): the Saguaro C a sweep measured fastest at this temperature, else 1 (off)."""
    if temperature <= 0:
        return 1.0, "greedy: Saguaro sampling changes nothing at T = 0, C = 1"
    if saguaro:
        return max(saguaro, key=saguaro.get), "measured at T > 0 (sweep): " + ", ".join(
            f"C={k:g}: {v:.1f} tok/s" for k, v in sorted(saguaro.items())
        )
    return 1.0, ("not modelled: C trades acceptance α for hit rate in a way α and r alone do not predict; "
                 "C = 1 (off) until a sweep over C at this temperature is given")  # fmt: skip


# ---- CLI ------------------------------------------------------------------------------------------


def format_plan(p: Plan) -> str:
    lines = [
        f"inputs: α = {p.alpha:.3f}, r = {p.r:.3f}, c = {p.c:g}, batch = {p.batch}, T = {p.temperature:g}, "
        f"overhead = {p.overhead_ms:g} ms/round",
        "",
        "| K | AR tok/s | SD tok/s | SD round ms | SSD tok/s | SSD round ms | budget ΣF | fan-out F_0..F_K | p_hit | backup |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| 0 | {p.ar.tok_s:.2f} | – | – | – | – | – | – | – | – |",
    ]
    for sd, ssd in zip(p.sd, p.ssd):
        lines.append(
            f"| {sd.k} | | {sd.tok_s:.2f} | {sd.round_ms:.1f} | {ssd.tok_s:.2f} | {ssd.round_ms:.1f} | "
            f"{ssd.budget} | {list(ssd.fanout)} | {ssd.p_hit:.3f} | {ssd.backup} |"
        )
    rec = p.recommended
    lines.append("")
    if rec.mode == "ar":
        lines.append(
            f"recommended: K = 0 (plain decoding), {rec.tok_s:.2f} tok/s — no K > 0 is predicted faster"
        )
    else:
        lines.append(
            f"recommended: {rec.mode.upper()} K = {rec.k}, {rec.tok_s:.2f} tok/s ({rec.tok_s / p.ar.tok_s:.2f}× AR)"
        )
    if p.best_sd:
        lines.append(
            f"best SD: K = {p.best_sd.k}, {p.best_sd.tok_s:.2f} tok/s ({p.best_sd.tok_s / p.ar.tok_s:.2f}× AR)"
        )
    if p.best_ssd:
        s = p.best_ssd
        lines.append(
            f"best SSD: K = {s.k}, budget ΣF = {s.budget}, fan-out {list(s.fanout)}, p_hit = {s.p_hit:.3f}, "
            f"{s.backup} backup, {s.tok_s:.2f} tok/s ({s.tok_s / p.ar.tok_s:.2f}× AR)"
        )
        lines.append(
            f"backup threshold b* (neural below, fast from): {p.b_star if p.b_star else 'none ≤ 4096'}"
        )
    lines.append(f"Saguaro C = {p.saguaro_c:g}: {p.saguaro_note}")
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    with open(args.calibration) as f:
        cal = json.load(f)
    runs = [load_sweep(path) for path in args.sweep.split(",") if path] if args.sweep else []
    records = runs[0] if len(runs) == 1 else mean_of_runs(runs) if runs else []
    alpha, r, source = _alpha_r(ap, args, records)
    saguaro = saguaro_table(records, cal, args.temperature, args.stat, args.overhead_ms) if records else None
    p = plan(cal, alpha, r, args.batch, c=args.c, temperature=args.temperature, overhead_ms=args.overhead_ms,
             e_miss_fast=args.e_miss_fast, k_max=args.k_max, max_budget=args.max_budget,
             fanout_mode=args.fanout, stat=args.stat, saguaro=saguaro)  # fmt: skip
    p.notes = source + p.notes
    print(format_plan(p))
    if args.alpha0 is not None:
        _print_depths(ap, args, cal, alpha, p.best_ssd)
    if records:
        _print_sweep(args, cal, runs, records)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(p.to_dict(), f, indent=1)
    return 0


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m sglang_ssd.planner", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--calibration", required=True, help="JSON of bench/calibrate.py")
    ap.add_argument("--sweep", default=None,
                    help="JSONL of a serving sweep (α, r estimated from it); several, comma-separated: "
                         "repeated runs, averaged per point")
    ap.add_argument("--serving-overhead", action="store_true",
                    help="in the sweep comparison, add the per-step serving overhead fitted from the AR rows")
    ap.add_argument("--alpha", type=float, default=None)
    ap.add_argument("--r", type=float, default=None)
    ap.add_argument("--c", type=float, default=1.0, help="miss law 1 − p_hit = c·F^−r (paper: c = 1)")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--overhead-ms", type=float, default=0.0, help="per-round lookup + communication")
    ap.add_argument("--e-miss-fast", type=float, default=1.0, help="tokens per round after a fast backup")
    ap.add_argument("--k-max", type=int, default=8)
    ap.add_argument("--max-budget", type=int, default=64)
    ap.add_argument("--fanout", default="geometric", choices=["geometric", "uniform"])
    ap.add_argument("--stat", default="median", choices=["median", "min"], help="which calibration timings")
    ap.add_argument("--json", default=None, help="also write the plan here")
    ap.add_argument("--alpha0", type=float, default=None,
                    help="depth 2: L1's measured acceptance of an L0 token (draft server stat l0_accepted / l0_proposed)")
    ap.add_argument("--l0-tokens", type=int, default=3, help="depth 2: L0 proposals per L1 forward (m)")
    ap.add_argument("--l0-ms", type=float, default=None, help="depth 2: L0 cost per proposed token (default: calibration)")
    return ap


def _alpha_r(ap: argparse.ArgumentParser, args: argparse.Namespace, records: list[dict]) -> tuple[float, float, list[str]]:
    """(α, r, where they came from): the command line's, else estimated from the sweep; r = 1 at worst."""
    alpha, r, source = args.alpha, args.r, []
    if records and (alpha is None or r is None):
        est_a, est_r, how = estimate_alpha_r(records, args.temperature, args.c)
        alpha = est_a if alpha is None else alpha
        r = est_r if r is None else r
        source.append(how)
    if alpha is None:
        ap.error("--alpha is required when no --sweep gives one")
    if r is None:
        r = 1.0
        source.append("r = 1.0 assumed (no --r and no SSD records to estimate it from)")
    return alpha, r, source


def _print_depths(ap: argparse.ArgumentParser, args: argparse.Namespace, cal: dict, alpha: float,
                  s: Prediction | None) -> None:  # fmt: skip
    """Depth 2 against depth 1 at the best SSD setting (or a default one when there is none)."""
    l0_ms = args.l0_ms if args.l0_ms is not None else cal.get("l0", {}).get("ms_per_token")
    if l0_ms is None:
        ap.error("--alpha0 needs --l0-ms or a calibration with an 'l0' section (bench/calibrate.py --l0-only)")
    k = s.k if s else 4
    d = compare_depths(CostModel(cal, args.stat), alpha=alpha, tokens_per_round=expected_tokens(alpha, k),
                       alpha0=args.alpha0, m=args.l0_tokens, l0_ms=l0_ms, K=k,
                       budget=s.budget if s else 12, p_hit=s.p_hit if s else 0.5, batch=args.batch)  # fmt: skip
    print()
    print(format_depths(d))


def _print_sweep(args: argparse.Namespace, cal: dict, runs: list[list[dict]], records: list[dict]) -> None:
    print()
    checked = checkable(records)
    if len(runs) > 1:
        print(f"sweep: the mean of {len(runs)} runs, {len(checked)} points")
    print(compare_sweep(checked, cal, args.stat, args.overhead_ms, args.c, args.e_miss_fast,
                        serving_overhead=args.serving_overhead))  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
