"""The project's prompt set: 200 short prompts in four kinds, 50 each.

The prompts live in ``sglang_ssd/data/prompts.jsonl``, one JSON object per line::

    {"id": "math-007", "kind": "math", "prompt": "...", "answer": "30"}

``answer`` is the numeric reference answer (as a string) for ``math`` prompts and
``null`` for the other kinds. They are sized for a small instruction model
(SmolLM2-135M-Instruct): 8-80 words each, everyday topics.

Benchmark export
----------------
``export_bench_dataset`` writes the set in the JSONL "conversations" format read by
SGLang 0.5.23's ``--dataset-name custom`` loader
(``sglang.benchmark.datasets.custom.sample_custom_requests``)::

    python -m sglang_ssd.prompts --out bench/prompts_custom.jsonl
    python -m sglang.bench_serving --backend sglang --host 127.0.0.1 --port 30000 \\
        --dataset-name custom --dataset-path bench/prompts_custom.jsonl \\
        --tokenizer models/target --apply-chat-template \\
        --num-prompts 200 --sharegpt-output-len 128 --seed 0

``--sharegpt-output-len`` fixes the number of generated tokens per request; without
it the loader takes the output length from the tokenized assistant turn, which here
is only a short reference (the math answer or a placeholder), so always pass it.
The loader shuffles the rows with ``random`` (seeded by ``--seed``) before taking
``--num-prompts`` of them. Note that the ``sglang.benchmark.datasets`` package
imports the HF ``datasets`` library at import time, so bench_serving needs it
installed even though the custom loader itself does not use it.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

KINDS: tuple[str, ...] = ("chat", "math", "code", "feedback")
DATA_PATH = Path(__file__).parent / "data" / "prompts.jsonl"

# The custom loader drops rows whose assistant turn tokenizes to < 2 tokens, so the
# placeholder must be a few tokens long.
BENCH_PLACEHOLDER = "(no reference answer recorded)"


@dataclass(frozen=True)
class Prompt:
    """One prompt of the set. ``answer`` is a numeric string for math, else None."""

    id: str
    kind: str
    prompt: str
    answer: str | None = None


def _parse_line(line: str, lineno: int) -> Prompt:
    obj = json.loads(line)
    missing = {"id", "kind", "prompt"} - obj.keys()
    if missing:
        raise ValueError(f"prompts.jsonl line {lineno}: missing keys {sorted(missing)}")
    if obj["kind"] not in KINDS:
        raise ValueError(f"prompts.jsonl line {lineno}: unknown kind {obj['kind']!r}")
    return Prompt(obj["id"], obj["kind"], obj["prompt"], obj.get("answer"))


def load_prompts(kind: str | None = None, limit: int | None = None, path: str | Path | None = None) -> list[Prompt]:
    """Load the prompt set in file order (kinds grouped, ids ascending).

    kind: one of ``KINDS`` or None for all kinds.
    limit: keep at most this many prompts (after filtering by kind); None keeps all.
    path: an alternative JSONL file in the same format (default: the packaged set).
    """
    if kind is not None and kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} or None, got {kind!r}")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 0):
        raise ValueError(f"limit must be a non-negative int or None, got {limit!r}")
    source = Path(path) if path is not None else DATA_PATH
    prompts: list[Prompt] = []
    with source.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            p = _parse_line(line, lineno)
            if kind is None or p.kind == kind:
                prompts.append(p)
    return prompts if limit is None else prompts[:limit]


def chat_ids(tokenizer, prompt: str) -> list[int]:
    """Token ids of `prompt` sent through the tokenizer's chat template, ready for the assistant's answer."""
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def export_bench_dataset(
    path: str | Path,
    kinds: Iterable[str] | None = None,
    limit_per_kind: int | None = None,
) -> int:
    """Write prompts as bench_serving ``custom`` JSONL; return the number of rows.

    Each line is ``{"id", "kind", "conversations": [user turn, assistant turn]}``; the
    loader reads only ``conversations`` (``content`` of turns 0 and 1). The assistant
    turn is the math answer or ``BENCH_PLACEHOLDER``. See the module docstring for
    the bench_serving command.

    kinds: subset of ``KINDS`` (default all); limit_per_kind: prompts per kind.
    """
    chosen = list(KINDS if kinds is None else kinds)
    for k in chosen:
        if k not in KINDS:
            raise ValueError(f"kinds must contain only {KINDS}, got {k!r}")
    rows = [p for k in chosen for p in load_prompts(k, limit_per_kind)]
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for p in rows:
            turns = [
                {"role": "user", "content": p.prompt},
                {"role": "assistant", "content": p.answer if p.answer is not None else BENCH_PLACEHOLDER},
            ]
            f.write(json.dumps({"id": p.id, "kind": p.kind, "conversations": turns}, ensure_ascii=False) + "\n")
    return len(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Export the prompt set for sglang bench_serving (--dataset-name custom).")
    ap.add_argument("--out", required=True, help="output JSONL path")
    ap.add_argument("--kinds", nargs="*", default=None, choices=KINDS)
    ap.add_argument("--limit-per-kind", type=int, default=None)
    args = ap.parse_args(argv)
    n = export_bench_dataset(args.out, args.kinds, args.limit_per_kind)
    print(f"wrote {n} prompts to {args.out}")


if __name__ == "__main__":
    main()
