"""The *law model*: a tiny random-weight target for the e2e sampling-law tests.

Exactness does not depend on the model's size, but a test's power depends on its sample count, and a
sample of the real 135M target costs a CPU second or more. This model (2 layers, hidden 128, a 512-token
vocabulary) costs next to nothing per token, so the tests afford thousands of samples through the very
same servers, sockets and verifier. Its logit scale makes the next-token laws peaked but not certain
(the top token holds 42-97 % of the mass between the 10th and 90th percentile of the positions
sampled, 67 % at the median): samples share contexts for many positions,
and each position still leaves mass to the alternatives. It has no tokenizer (servers run with
`--skip-tokenizer-init` and take token ids). An n-gram table fitted on its own samples is its L0 for
the three-level chain.
"""

from __future__ import annotations

from pathlib import Path

import torch

from sglang_ssd.draft.ngram import NgramDraft
from sglang_ssd.tools.random_model import write_random_model

VOCAB = 512
LOGIT_SCALE = 7.0
SEED = 1
PROMPT = list(range(1, 9))  # any ids do: the laws are random


def build(folder: Path) -> Path:
    """Write the law model and its n-gram L0 (``folder/ngram.json``); deterministic."""
    write_random_model(folder, vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_layers=2,
                       num_heads=4, num_kv_heads=2, logit_scale=LOGIT_SCALE, seed=SEED)  # fmt: skip
    NgramDraft(vocab_size=VOCAB).fit(_samples(folder)).save(folder / "ngram.json")
    return folder


def lookup_prompt(model, length: int = 256) -> list[int]:
    """PROMPT and a sample of ``length`` more tokens from the model: a context in which the fast
    backup's suffix lookup finds an earlier match at about 40 % of the positions that follow (8 new
    tokens: 3 %), so its point-mass proposals are exercised."""
    return _sample(model, 1, length, seed=SEED + 1)[0]


def _samples(folder: Path, count: int = 64, length: int = 48) -> list[list[int]]:
    """Sequences sampled from the model at T = 1 (the corpus of its n-gram L0)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    return _sample(model, count, length, seed=SEED)


def _sample(model, count: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.tensor([PROMPT] * count)
    with torch.inference_mode():
        for _ in range(length):
            probs = torch.softmax(model(ids).logits[:, -1].double(), -1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=g)], 1)
    return ids.tolist()


def clear_greedy(model, count: int, length: int, new_tokens: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """``count`` random prompts of ``length`` tokens with their greedy continuations (transformers,
    fp32), keeping only prompts where every step has a clear winner (top-2 logit gap > 1e-3), so a
    rounding difference between SGLang's forward and this one cannot flip a token."""
    g = torch.Generator().manual_seed(seed)
    out: list[tuple[list[int], list[int]]] = []
    while len(out) < count:
        ids = torch.randint(0, model.config.vocab_size, (length,), generator=g).tolist()
        x, ok = torch.tensor([ids]), True
        with torch.inference_mode():
            for _ in range(new_tokens):
                top = torch.topk(model(x).logits[0, -1], 2)
                ok &= float(top.values[0] - top.values[1]) > 1e-3
                x = torch.cat([x, top.indices[:1][None]], 1)
        if ok:
            out.append((ids, x[0, length:].tolist()))
    return out
