"""The draft model: a few Llama layers on the target's embedding, with a reduced-vocabulary head.

Folder format (docs/INTERFACES.md): a Hugging Face Llama folder whose embedding is the target's;
`config.json` has `"draft_vocab_size": V_sub`; `model.safetensors` holds `lm_head.weight` [V_sub, H]
and `draft_token_ids` (int64 [V_sub], the full-vocabulary id of each head row). The draft gives
probability 0 to every token outside the subset, so the full-vocabulary logits are −inf there.

`load_draft(folder)` returns a `LlamaForCausalLM` whose `lm_head` is a `SubsetHead`: called like any
HF causal LM (KV cache, `logits_to_keep`, ...) it returns full-vocabulary logits [B, T, V].
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

DRAFT_TOKEN_IDS = "draft_token_ids"
# `target_copies` source meaning "the target's embedding rows of draft_token_ids" (a frozen head).
HEAD_FROM_EMBEDDING = "model.embed_tokens.weight[draft_token_ids]"


class SubsetHead(nn.Module):
    """Output head over a subset of the vocabulary.

    weight: [V_sub, H]; token_ids: int64 [V_sub] (full-vocabulary ids, distinct, each < vocab_size).
    `forward(h [..., H]) -> [..., vocab_size]` logits, −inf outside the subset; `sub_logits(h)` gives
    the [..., V_sub] logits in head-row order (what training uses).
    """

    def __init__(self, weight: torch.Tensor, token_ids: torch.Tensor, vocab_size: int):
        super().__init__()
        if weight.dim() != 2 or token_ids.shape != (weight.shape[0],):
            raise ValueError(f"weight [V_sub, H] and token_ids [V_sub] disagree: {tuple(weight.shape)}, "
                             f"{tuple(token_ids.shape)}")
        if token_ids.numel() and (int(token_ids.min()) < 0 or int(token_ids.max()) >= vocab_size):
            raise ValueError(f"token_ids must lie in [0, {vocab_size})")
        if torch.unique(token_ids).numel() != token_ids.numel():
            raise ValueError("token_ids must be distinct")
        self.weight = nn.Parameter(weight)
        self.register_buffer("token_ids", token_ids.to(torch.long))
        self.vocab_size = vocab_size

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    def sub_logits(self, h: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(h, self.weight)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        sub = self.sub_logits(h)
        full = sub.new_full((*sub.shape[:-1], self.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.token_ids, sub)


def draft_config(target_config: dict, num_layers: int, draft_vocab_size: int, source_layers: list[int]) -> dict:
    """config.json of a draft built on `target_config` (a dict): fewer layers, untied reduced head."""
    if num_layers <= 0 or len(source_layers) != num_layers:
        raise ValueError(f"num_layers ({num_layers}) must be positive and match source_layers {source_layers}")
    if not 0 < draft_vocab_size <= target_config["vocab_size"]:
        raise ValueError(f"draft_vocab_size must be in (0, {target_config['vocab_size']}], got {draft_vocab_size}")
    cfg = {k: v for k, v in target_config.items() if not k.startswith("_")}
    cfg.update(num_hidden_layers=num_layers, tie_word_embeddings=False, draft_vocab_size=draft_vocab_size,
               draft_source_layers=list(source_layers), dtype="float32", torch_dtype="float32")
    return cfg


def load_draft(folder: str | Path, dtype: torch.dtype = torch.float32):
    """Load a draft folder into a `LlamaForCausalLM` with a `SubsetHead` (or a plain head without
    `draft_vocab_size`); returns the model in eval mode on CPU."""
    from safetensors.torch import load_file
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise ValueError(f"folder has no config.json: {folder}")
    cfg_dict = json.loads((folder / "config.json").read_text())
    state = load_file(str(folder / "model.safetensors"))
    v_sub = cfg_dict.get("draft_vocab_size")
    config = LlamaConfig(**{k: v for k, v in cfg_dict.items() if k not in ("draft_vocab_size",)})
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    if v_sub is not None:
        ids = state.pop(DRAFT_TOKEN_IDS)
        weight = state.pop("lm_head.weight")
        if weight.shape != (v_sub, config.hidden_size) or ids.shape != (v_sub,):
            raise ValueError(f"head {tuple(weight.shape)} / token ids {tuple(ids.shape)} do not match "
                             f"draft_vocab_size={v_sub}, hidden_size={config.hidden_size}")
        model.lm_head = SubsetHead(weight.to(dtype), ids, config.vocab_size)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    missing = [k for k in missing if not (v_sub is not None and k.startswith("lm_head."))]
    if missing or unexpected:
        raise ValueError(f"draft weights do not match the config: missing {missing}, unexpected {unexpected}")
    # Buffers that are not in the checkpoint (rotary inverse frequencies) still live on meta.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    return model.to(dtype).eval()
