"""`make gpu-check`: every GPU check in one call, one JSON report (run where a CUDA device exists).

1. the draft server's branch-tree attention: FlashInfer (custom masks) vs the torch path, and tree-step
   timings for a Llama-3.2-1B-shaped random draft, K = 7, F = 3, b ∈ {1, 4, 16}
   (`sglang_ssd.draft.gpu_check`);
2. chain verification: the FlashInfer `chain_speculative_sampling` route vs the torch route — the
   algorithm core's GPU tests (statistical agreement with the target law), run by pytest.
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
    r = subprocess.run([sys.executable, "-m", "sglang_ssd.draft.gpu_check", "--out", str(draft_json)],
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
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k not in ("draft_tree", "verify")}, indent=2))
    print(f"draft tree check rc={report['draft_tree']['rc']}, verify check rc={report['verify']['rc']}; "
          f"report: {out}")
    return 0 if report["draft_tree"]["rc"] == 0 and report["verify"]["rc"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
