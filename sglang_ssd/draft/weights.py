"""Load a HF Llama-family checkpoint (``model.safetensors`` or a sharded index) into fused tensors.

Per layer the q/k/v projections are fused into one matrix and gate/up into another, so a forward pass
makes two large matmuls instead of five. A reduced-vocabulary head (``draft_vocab_size`` in the config)
comes with ``draft_token_ids`` int64 ``[V_sub]`` mapping head rows to full-vocabulary ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from sglang_ssd.cpu.linear import compact

from .model_config import ModelConfig


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [H]
    wqkv: torch.Tensor  # [(Hq + 2·Hkv)·D, H]
    bqkv: torch.Tensor | None  # [(Hq + 2·Hkv)·D]
    wo: torch.Tensor  # [H, Hq·D]
    bo: torch.Tensor | None
    mlp_norm: torch.Tensor  # [H]
    w_gate_up: torch.Tensor  # [2·I, H]
    b_gate_up: torch.Tensor | None
    w_down: torch.Tensor  # [H, I]
    b_down: torch.Tensor | None
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None


@dataclass
class ModelWeights:
    embed: torch.Tensor  # [V, H]
    layers: list[LayerWeights]
    norm: torch.Tensor  # [H]
    lm_head: torch.Tensor  # [V_head, H]
    head_token_ids: torch.Tensor | None  # int64 [V_sub] full-vocabulary id of each head row, or None

    def nbytes(self) -> int:
        ts = [self.embed, self.norm, self.lm_head]
        for layer in self.layers:
            ts += [t for t in vars(layer).values() if t is not None]
        seen, total = set(), 0
        for t in ts:
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
        return total


class _Checkpoint:
    """Name → tensor access across one or several safetensors files."""

    def __init__(self, folder: Path) -> None:
        index = folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        elif (folder / "model.safetensors").is_file():
            files = ["model.safetensors"]
        else:
            raise ValueError(f"model folder {folder} has no model.safetensors (or sharded index)")
        self.handles = [safe_open(str(folder / f), framework="pt") for f in files]
        self.where = {name: h for h in self.handles for name in h.keys()}

    def has(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str) -> torch.Tensor:
        if name not in self.where:
            raise ValueError(f"checkpoint lacks tensor {name!r}")
        return self.where[name].get_tensor(name)


def load_weights(folder: str | Path, cfg: ModelConfig, dtype: torch.dtype, device: torch.device) -> ModelWeights:
    ck = _Checkpoint(Path(folder))

    def get(name: str) -> torch.Tensor:
        return ck.get(name).to(device=device, dtype=dtype)

    def opt(name: str) -> torch.Tensor | None:
        return get(name) if ck.has(name) else None

    def cat_opt(names: list[str]) -> torch.Tensor | None:
        parts = [opt(n) for n in names]
        if all(p is None for p in parts):
            return None
        if any(p is None for p in parts):
            raise ValueError(f"checkpoint has only some of the biases {names}")
        return torch.cat(parts)

    layers = []
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        layers.append(
            LayerWeights(
                attn_norm=get(p + "input_layernorm.weight"),
                wqkv=torch.cat([get(a + "q_proj.weight"), get(a + "k_proj.weight"), get(a + "v_proj.weight")]),
                bqkv=cat_opt([a + "q_proj.bias", a + "k_proj.bias", a + "v_proj.bias"]),
                wo=get(a + "o_proj.weight"),
                bo=opt(a + "o_proj.bias"),
                mlp_norm=get(p + "post_attention_layernorm.weight"),
                w_gate_up=torch.cat([get(m + "gate_proj.weight"), get(m + "up_proj.weight")]),
                b_gate_up=cat_opt([m + "gate_proj.bias", m + "up_proj.bias"]),
                w_down=get(m + "down_proj.weight"),
                b_down=opt(m + "down_proj.bias"),
                q_norm=opt(a + "q_norm.weight") if cfg.qk_norm else None,
                k_norm=opt(a + "k_norm.weight") if cfg.qk_norm else None,
            )
        )
    embed = get("model.embed_tokens.weight")
    if embed.shape != (cfg.vocab_size, cfg.hidden_size):
        raise ValueError(f"embed_tokens is {tuple(embed.shape)}, config says ({cfg.vocab_size}, {cfg.hidden_size})")
    head_ids = None
    if ck.has("lm_head.weight"):
        lm_head = get("lm_head.weight")
    elif cfg.tie_word_embeddings:
        lm_head = embed
    else:
        raise ValueError("checkpoint has no lm_head.weight and the config does not tie embeddings")
    if cfg.draft_vocab_size:
        if lm_head.shape[0] != cfg.draft_vocab_size:
            raise ValueError(f"lm_head has {lm_head.shape[0]} rows, draft_vocab_size is {cfg.draft_vocab_size}")
        head_ids = ck.get("draft_token_ids").to(device=device, dtype=torch.int64)
        if head_ids.shape != (cfg.draft_vocab_size,):
            raise ValueError(f"draft_token_ids must be [{cfg.draft_vocab_size}], got {tuple(head_ids.shape)}")
        if int(head_ids.min()) < 0 or int(head_ids.max()) >= cfg.vocab_size:
            raise ValueError("draft_token_ids has ids outside the vocabulary")
    elif lm_head.shape[0] != cfg.vocab_size:
        raise ValueError(f"lm_head has {lm_head.shape[0]} rows, vocab_size is {cfg.vocab_size}")
    return ModelWeights(embed, layers, get("model.norm.weight"), lm_head, head_ids)


LINEARS = ("wqkv", "wo", "w_gate_up", "w_down")  # a layer's projections, which the linear route runs


def linear_weights(w: ModelWeights) -> list[torch.Tensor]:
    """Every projection weight of every layer, then the head: what ``compact_linears`` may store as bf16."""
    return [getattr(layer, name) for layer in w.layers for name in LINEARS] + [w.lm_head]


def compact_linears(w: ModelWeights) -> None:
    """Store each projection and the head as bf16 where that loses nothing (``cpu.linear.compact``: a
    draft trained and shipped in bf16): the CPU kernel then streams half the bytes for the same bits."""
    for layer in w.layers:
        for name in LINEARS:
            setattr(layer, name, compact(getattr(layer, name)))
    w.lm_head = compact(w.lm_head)
