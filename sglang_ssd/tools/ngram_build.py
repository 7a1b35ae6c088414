"""Build the n-gram drafter (L0, ``sglang_ssd/draft/ngram.py``) and measure its greedy acceptance.

Corpus: the target's answers cached under ``models/draft_data`` by ``sglang_ssd.tools.draft_data`` when
present, else the chat-templated prompt set:

    python -m sglang_ssd.tools.ngram_build --target models/target --out models/ngram.json --eval 20
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from sglang_ssd.draft.ngram import NgramDraft


# --------------------------------------------------------------------------------------------- building
def corpus_from_draft_data(data_dir: Path) -> list[list[int]]:
    """prompt + answer ids of every training record cached by `sglang_ssd.tools.draft_data` in `data_dir`.

    Only the training batches (`*_batch_*.pt`) are read: the evaluation references cached there by
    `draft_eval` (`eval_ref_*.pt`) answer held-out prompts and must stay out of any fitted table.
    """
    seqs = []
    for f in sorted(data_dir.glob("*_batch_*.pt")):
        for rec in torch.load(f, weights_only=True):
            seqs.append(rec["prompt"].tolist() + rec["answer"].tolist())
    return seqs


def corpus_from_prompts(tokenizer) -> list[list[int]]:
    """Chat-templated ids of every prompt of the packaged prompt set (fallback corpus)."""
    from sglang_ssd.prompts import chat_ids, load_prompts

    return [chat_ids(tokenizer, p.prompt) for p in load_prompts()]


# --------------------------------------------------------------------------------------------- measuring
@torch.inference_mode()
def target_continuations(target_dir: Path, prompts: list[list[int]], n_new: int, eos_id: int) -> list[list[int]]:
    """Greedy fp32 continuations of each prompt (ids) by the target, stopping at EOS or n_new tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    outs = []
    for ids in prompts:
        gen = model.generate(torch.tensor([ids]), max_new_tokens=n_new, do_sample=False, eos_token_id=eos_id,
                             pad_token_id=eos_id)
        outs.append(gen[0, len(ids):].tolist())
    return outs


def cached_continuations(cache: Path, target_dir: Path, prompts: list[list[int]], n_new: int,
                         eos_id: int) -> list[list[int]]:
    """`target_continuations`, reused from the JSON file `cache` when it holds the same prompts and n_new."""
    if cache.is_file():
        obj = json.loads(cache.read_text(encoding="utf-8"))
        if obj.get("prompts") == prompts and obj.get("n_new") == n_new:
            return obj["continuations"]
    conts = target_continuations(target_dir, prompts, n_new, eos_id)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"n_new": n_new, "prompts": prompts, "continuations": conts}), encoding="utf-8")
    return conts


def greedy_acceptance(model: NgramDraft, prompts: list[list[int]], conts: list[list[int]], k: int) -> dict:
    """Per-token and K-chain greedy acceptance of `model` against the target continuations `conts`.

    per_token: fraction of positions whose first proposed token equals the target's next token.
    Chain: rounds of k proposals verified greedily (accepted prefix + the target's bonus token);
    alpha = Σ accepted / (Σ accepted + rounds that stopped at a rejection), the maximum-likelihood
    per-token acceptance of the capped-geometric acceptance length.
    """
    hits = positions = accepted = rejections = rounds = emitted = 0
    for ids, cont in zip(prompts, conts, strict=True):
        for i in range(len(cont)):
            positions += 1
            hits += model.propose(ids + cont[:i], 1) == [cont[i]]
        i = 0
        while i < len(cont):
            kk = min(k, len(cont) - i - 1)  # the last token is always the bonus
            draft = model.propose(ids + cont[:i], kk)
            a = 0
            while a < len(draft) and draft[a] == cont[i + a]:
                a += 1
            rounds += 1
            accepted += a
            rejections += a < kk
            emitted += a + 1
            i += a + 1
    return {"per_token": hits / positions, "alpha": accepted / max(accepted + rejections, 1), "k": k,
            "tokens_per_round": emitted / rounds, "accepted_per_round": accepted / rounds, "rounds": rounds,
            "positions": positions}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build the n-gram drafter (L0) and measure its greedy acceptance.")
    ap.add_argument("--target", default="models/target", help="target model folder (tokenizer, weights)")
    ap.add_argument("--out", default="models/ngram.json")
    ap.add_argument("--data", default="models/draft_data", help="cached target answers (draft_data.py)")
    ap.add_argument("--order", type=int, default=4)
    ap.add_argument("--eval", type=int, default=0, help="measure on this many prompts (spread over the kinds)")
    ap.add_argument("--eval-new", type=int, default=64, help="target tokens per evaluation prompt")
    ap.add_argument("--k", type=int, default=4, help="chain length for the chain acceptance")
    ap.add_argument("--eval-cache", default="models/ngram_eval_targets.json",
                    help="target continuations are reused from here when prompts and length match")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    from transformers import AutoTokenizer

    from sglang_ssd.prompts import KINDS, chat_ids, load_prompts

    tok = AutoTokenizer.from_pretrained(args.target)
    data_dir = Path(args.data)
    corpus = corpus_from_draft_data(data_dir) if data_dir.is_dir() else []
    source = f"{len(corpus)} target answers from {data_dir}"
    if not corpus:
        corpus, source = corpus_from_prompts(tok), "the chat-templated prompt set (no target answers found)"
    model = NgramDraft(order=args.order, vocab_size=len(tok)).fit(corpus)
    model.save(args.out)
    print(f"fitted on {model.num_tokens} tokens of {source}; wrote {args.out} "
          f"({Path(args.out).stat().st_size / 1e6:.2f} MB)")
    if args.eval > 0:
        per_kind = -(-args.eval // len(KINDS))
        chosen = [p for kind in KINDS for p in load_prompts(kind)[-per_kind:]][: args.eval]
        ids = [chat_ids(tok, p.prompt) for p in chosen]
        conts = cached_continuations(Path(args.eval_cache), Path(args.target), ids, args.eval_new, tok.eos_token_id)
        res = greedy_acceptance(model, ids, conts, args.k)
        print(f"eval prompts: {[p.id for p in chosen]}")
        print(json.dumps(res))
        # An unfitted drafter has an empty table: context lookup alone (no proposal counts as a miss).
        print("lookup only:", json.dumps(greedy_acceptance(NgramDraft(), ids, conts, args.k)))


if __name__ == "__main__":
    main()
