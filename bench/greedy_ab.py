"""Greedy outputs of two checkouts on the project's prompt set: a refactor must change none of them.

    python bench/greedy_ab.py --code-b /tmp/b [--prompts 200] [--max-new 32] [--out DIR]

Each checkout serves the same launch (SSD with the launch defaults, its draft server on core 1, the
target on core 0) from its own code (first on the servers' PYTHONPATH); every prompt is sent once at
T = 0 in batches of 8, and the two sides' output ids are compared token by token. SSD at T = 0 emits the
target's own greedy tokens, so equal outputs check the target path, and any difference in the drafts
shows up as a difference only if it broke exactness. Prints, and writes ``greedy_ab.json`` under
``--out``:

    greedy A/B: n of N prompts identical (A = <commit>, B = <commit>)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_ssd.prompts import chat_ids, load_prompts  # noqa: E402
from sglang_ssd.tools.server_process import CPU_SERVER_ARGS, SGLangServer  # noqa: E402

BATCH = 8


def commit_of(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def outputs(tree: Path, target: str, draft: str, prompts: list[list[int]], max_new: int, log: str) -> list[list[int]]:
    """Every prompt's greedy output ids from an SSD server running ``tree``'s code."""
    argv = ["--model-path", target, *CPU_SERVER_ARGS, "--speculative-algorithm", "SSD",
            "--speculative-draft-model-path", draft, "--ssd-draft-cores", "1"]  # fmt: skip
    out: list[list[int]] = []
    with SGLangServer(argv, cpu_cores={0}, log_path=log, env={"PYTHONPATH": str(tree)}) as server:
        for i in range(0, len(prompts), BATCH):
            replies = server.generate(prompts[i : i + BATCH], {"temperature": 0, "max_new_tokens": max_new,
                                                               "ignore_eos": True})  # fmt: skip
            out += [r["output_ids"] for r in replies]
            print(f"  {tree.name}: {len(out)}/{len(prompts)} prompts", end="\r", flush=True)
    print()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--code-b", required=True, help="the other checkout (e.g. `git worktree add /tmp/b COMMIT`)")
    ap.add_argument("--target", default=str(ROOT / "models" / "target"))
    ap.add_argument("--draft", default=str(ROOT / "models" / "draft"))
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--max-new", type=int, default=32)
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "greedy_ab"))
    args = ap.parse_args(argv)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.target)
    prompts = [chat_ids(tok, p.prompt) for p in load_prompts(limit=args.prompts)]
    a, b = ROOT, Path(args.code_b).resolve()
    got_a = outputs(a, args.target, args.draft, prompts, args.max_new, "/tmp/greedy_ab_a.log")
    got_b = outputs(b, args.target, args.draft, prompts, args.max_new, "/tmp/greedy_ab_b.log")
    same = sum(x == y for x, y in zip(got_a, got_b))
    differ = [i for i, (x, y) in enumerate(zip(got_a, got_b)) if x != y]
    line = f"greedy A/B: {same} of {len(prompts)} prompts identical (A = {commit_of(a)}, B = {commit_of(b)})"
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "greedy_ab.json").write_text(json.dumps(
        {"line": line, "a": commit_of(a), "b": commit_of(b), "prompts": len(prompts), "max_new": args.max_new,
         "identical": same, "differ": differ, "outputs_a": got_a, "outputs_b": got_b}) + "\n")  # fmt: skip
    print(line)
    sys.exit(0 if same == len(prompts) else 1)


if __name__ == "__main__":
    main()
