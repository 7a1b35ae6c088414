"""`make gpu-check`: every GPU check in one call, one JSON report (run where a CUDA device exists).

1. the draft server's branch-tree attention: FlashInfer (custom masks) vs the torch path, and tree-step
   timings for a Llama-3.2-1B-shaped random draft, K = 7, F = 3, b ∈ {1, 4, 16}
   (`sglang_ssd.tools.tree_gpu_check`);
2. chain verification: the FlashInfer `chain_speculative_sampling` route vs the torch route — the
   algorithm core's GPU tests (statistical agreement with the target law), run by pytest;
3. the Triton chain-verification kernel vs the torch rule on the same coins (accept lengths must be
   identical; where bonus tokens differ, the coin must sit on the float64 CDF boundary between them:
   `bonus_rounding_gaps`), K = 7, V = 128256, and timings for
   b ∈ {1, 4, 16} (`verify_triton_check` below).
Nothing is downloaded; where FlashInfer is not importable the report says so and the torch path is
still timed. Writes `--out` (default `$OUT/gpu_check.json`, else `out/gpu_check.json`).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the in-process Triton check imports the package from a bare checkout too
    sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(os.environ.get("OUT", "out")) / "gpu_check.json"))
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report: dict = {"started": time.strftime("%Y-%m-%d %H:%M:%S")}
    try:
        import torch

        report["torch"] = torch.__version__
        report["cuda"] = torch.cuda.is_available()
        report["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    except ImportError as e:
        report["error"] = f"torch not importable: {e}"
    try:
        import flashinfer  # noqa: F401

        report["flashinfer"] = getattr(flashinfer, "__version__", "unknown")
    except Exception as e:  # noqa: BLE001 - report any import failure
        report["flashinfer"] = f"not importable: {e}"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    draft_json = out.parent / "draft_gpu_check.json"
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "sglang_ssd.tools.tree_gpu_check", "--out", str(draft_json)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=420)
    report["draft_tree"] = {"rc": r.returncode, "seconds": round(time.perf_counter() - t0, 1),
                            "tail": (r.stdout + r.stderr)[-3000:]}
    if draft_json.is_file():
        report["draft_tree"]["result"] = json.loads(draft_json.read_text())
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-k", "flashinfer or gpu", "tests/algo"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    report["verify"] = {"rc": r.returncode, "seconds": round(time.perf_counter() - t0, 1),
                        "tail": (r.stdout + r.stderr)[-3000:]}
    t0 = time.perf_counter()
    try:
        report["verify_triton"] = verify_triton_check()
    except Exception as e:  # noqa: BLE001 - a report, not a crash
        report["verify_triton"] = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    report["verify_triton"]["seconds"] = round(time.perf_counter() - t0, 1)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k not in ("draft_tree", "verify")}, indent=2))
    print(f"draft tree check rc={report['draft_tree']['rc']}, verify check rc={report['verify']['rc']}; "
          f"report: {out}")
    print(f"triton verify: {report['verify_triton']}")
    ok = report["draft_tree"]["rc"] == 0 and report["verify"]["rc"] == 0 and report["verify_triton"].get("ok")
    return 0 if ok else 1


ROUNDING_TOL = 1e-3  # float32 prefix sums over 128k entries drift by ~1e-5; a wrong token is off by far more


def bonus_rounding_gaps(p, q, n, u, k, bonus, other) -> tuple[list[float], list[float]]:
    """Where two routes drew different bonus tokens on the same coin: is it CDF rounding?

    For each such row, rebuild the bonus law in float64 (the residual max(p - q, 0) after a rejection,
    p after full acceptance), and return how far the coin lies outside the span of CDF boundaries
    between the two tokens (0 when inside) and the probability mass strictly between them. Both are
    ~0 for a rounding difference and large for a wrong draw.
    """
    gaps, masses = [], []
    for b in (bonus != other).nonzero().flatten().tolist():
        kk = int(k[b])
        w = p[b, kk].double()
        if kk < int(n[b]):
            resid = (w - q[b, kk].double()).clamp_min(0.0)
            w = resid if resid.sum() > 0 else w
        cdf = w.cumsum(0) / w.sum()
        lo_tok, hi_tok = sorted((int(bonus[b]), int(other[b])))
        lo, hi, coin = float(cdf[lo_tok]), float(cdf[hi_tok - 1]), float(u[b, -1])
        gaps.append(max(lo - coin, 0.0, coin - hi))
        masses.append(hi - lo)
    return gaps, masses


def verify_triton_check(k: int = 7, vocab: int = 128256, batches=(1, 4, 16), repeats: int = 20) -> dict:
    """Triton vs torch chain verification on the same coins, on the GPU (compiled, not interpreted)."""
    import torch

    from sglang_ssd.algo.verify import _chain_torch, dense_proposal
    from sglang_ssd.algo.verify_triton import chain_verify_triton

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)

    def case(b):
        p = torch.softmax(torch.randn(b, k + 1, vocab, device=dev, generator=g) * 3, -1)
        q = torch.softmax(torch.randn(b, k, vocab, device=dev, generator=g) * 3, -1)
        s = torch.multinomial(q.view(-1, vocab), 1, generator=g).view(b, k)
        return p, q, s, torch.rand(b, k + 1, device=dev, generator=g)

    p, q, s, u = case(256)
    n = torch.randint(0, k + 1, (256,), device=dev, generator=g)
    kt, bt = chain_verify_triton(p, s, q, n, u)
    ref = _chain_torch(p, s, q, None, n, u)
    gaps, masses = bonus_rounding_gaps(p, q, n, u, kt, bt, ref.bonus)
    out = {"shape": f"K={k}, V={vocab}, float32", "agreement_batch": 256,
           "accept_len_equal": bool(torch.equal(kt, ref.accept_len)),
           "bonus_equal_fraction": float((bt == ref.bonus).float().mean()),
           "bonus_differences": len(gaps), "max_coin_gap": max(gaps, default=0.0),
           "max_mass_between": max(masses, default=0.0), "timing": []}  # fmt: skip
    out["ok"] = out["accept_len_equal"] and max(gaps + masses, default=0.0) < ROUNDING_TOL

    def ms(fn):
        fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
        return 1000 * (time.perf_counter() - t0) / repeats

    for b in batches:
        p, q, s, u = case(b)
        qd = dense_proposal(q, s, vocab)
        out["timing"].append({"batch": b,
                              "triton_ms": ms(lambda a=(p, s, qd, None, u): chain_verify_triton(*a)),
                              "torch_ms": ms(lambda a=(p, s, q, None, None, u): _chain_torch(*a))})  # fmt: skip
    return out


if __name__ == "__main__":
    sys.exit(main())
