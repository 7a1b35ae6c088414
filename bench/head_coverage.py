"""How much of the target's held-out output a frequency-ranked draft head of V tokens covers.

    python bench/head_coverage.py [--sizes 4096,8192,16384,32768] [--draft models/draft]

The ranking counts the target's answers in the committed answer store (``data/draft_answers/``) on the
ShareGPT training split only; coverage is measured on the held-out slice's greedy answers, which the
ranking never saw. A token outside the head is never proposed, so coverage bounds the greedy
acceptance a head of that size can reach. The shipped draft's own head (``draft_token_ids`` in the
draft folder's weights) is measured the same way. Prints one line per size and writes ``head_coverage.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "data" / "draft_answers"
VOCAB = 49152


def answers(paths: list[Path]) -> np.ndarray:
    return np.concatenate([np.load(p)["answers"].astype(np.int64) for p in paths])


def coverage(head: np.ndarray, held_out: np.ndarray) -> float:
    inside = np.zeros(VOCAB, dtype=bool)
    inside[head] = True
    return float(inside[held_out].mean())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4096,8192,16384,32768")
    ap.add_argument("--draft", default=str(ROOT / "models" / "draft"))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "draft"))
    args = ap.parse_args(argv)
    train = sorted(p for p in STORE.glob("*.npz") if "held_out" not in p.name)
    held = sorted(STORE.glob("*held_out*.npz"))
    train_ids, held_ids = answers(train), answers(held)
    ranked = np.argsort(-np.bincount(train_ids, minlength=VOCAB), kind="stable")
    report = {"train_tokens": int(train_ids.size), "held_out_tokens": int(held_ids.size), "coverage": {}}
    for v in (int(x) for x in args.sizes.split(",")):
        report["coverage"][v] = round(coverage(ranked[:v], held_ids), 4)
        print(f"head of {v:>5} most frequent training-answer tokens: {report['coverage'][v]:.4f} of held-out tokens")
    weights = Path(args.draft) / "model.safetensors"
    if weights.is_file():
        from safetensors.numpy import load_file

        shipped = load_file(str(weights))["draft_token_ids"].astype(np.int64)
        report["shipped_head"] = {"size": int(shipped.size), "coverage": round(coverage(shipped, held_ids), 4)}
        print(f"shipped draft head ({shipped.size} tokens): {report['shipped_head']['coverage']:.4f} of held-out tokens")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "head_coverage.json").write_text(json.dumps(report, indent=1) + "\n")
    print(f"({train_ids.size} training-answer tokens ranked, {held_ids.size} held-out tokens measured)")


if __name__ == "__main__":
    sys.exit(main())
