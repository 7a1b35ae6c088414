"""The real target's greedy reference, computed in a separate process while the server-free tests run.

The reference (transformers, fp32, batch 1, 20 prompts x 32 tokens) takes about a minute of one
core; during the first part of `make test` the second core is idle, so the e2e conftest starts this
computation at collection time and the `hf_greedy` fixture only collects the result.
"""

from __future__ import annotations

from pathlib import Path

NEW_TOKENS = 32


def equality_prompt_ids(target_path: Path) -> list[list[int]]:
    """20 prompts, 5 of each kind, as chat-templated token ids."""
    from transformers import AutoTokenizer

    from sglang_ssd.prompts import chat_ids, load_prompts

    tokenizer = AutoTokenizer.from_pretrained(str(target_path))
    prompts = []
    for kind in ("chat", "math", "code", "feedback"):
        prompts += [chat_ids(tokenizer, p.prompt) for p in load_prompts(kind, limit=5)]
    return prompts


def hf_greedy_reference(target_path: str) -> list[list[int]]:
    """Greedy continuations of ``equality_prompt_ids`` from Hugging Face transformers, fp32.

    An explicit argmax loop over the model's logits with its KV cache: `generate()` in
    transformers 5.19 does not return the plain argmax chain for this model (seen on prompt
    chat-003, position 9: logits 18.31 vs 17.89, generate picks the second), so it is not used.
    """
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(target_path, dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for ids in equality_prompt_ids(Path(target_path)):
            out = model(torch.tensor([ids]), use_cache=True)
            tokens = [int(out.logits[0, -1].argmax())]
            while len(tokens) < NEW_TOKENS:
                out = model(torch.tensor([tokens[-1:]]), past_key_values=out.past_key_values, use_cache=True)
                tokens.append(int(out.logits[0, -1].argmax()))
            outs.append(tokens)
    return outs
