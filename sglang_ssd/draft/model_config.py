"""Draft model architecture read from a HF ``config.json`` (Llama family, Qwen2, Qwen3).

Handles both spellings of the RoPE settings (``rope_theta`` + ``rope_scaling`` and the newer
``rope_parameters``), tied embeddings, and the optional reduced-vocabulary head
(``draft_vocab_size``: the head has V_sub rows mapped to full-vocabulary ids by ``draft_token_ids``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

SUPPORTED = {"llama", "mistral", "qwen2", "qwen3"}


@dataclass(frozen=True)
class ModelConfig:
    arch: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict = field(default_factory=dict)
    max_position: int = 8192
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    draft_vocab_size: int | None = None

    @property
    def head_vocab_size(self) -> int:
        """Rows of the LM head: V_sub for a reduced-vocabulary head, V otherwise."""
        return self.draft_vocab_size or self.vocab_size

    @classmethod
    def from_dict(cls, cfg: dict) -> ModelConfig:
        arch = cfg.get("model_type", "llama")
        if arch not in SUPPORTED:
            raise ValueError(f"config.model_type {arch!r} is not supported (one of {sorted(SUPPORTED)})")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.hidden_act {cfg.get('hidden_act')!r}: only silu is supported")
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        rope = dict(cfg.get("rope_parameters") or {})
        scaling = dict(cfg.get("rope_scaling") or {})
        theta = float(cfg.get("rope_theta", rope.get("rope_theta", 10000.0)))
        scaling = {**{k: v for k, v in rope.items() if k != "rope_theta"}, **scaling}
        kind = scaling.get("rope_type", scaling.get("type", "default"))
        if kind not in ("default", "llama3", "linear"):
            raise ValueError(f"config rope type {kind!r} is not supported (default, llama3, linear)")
        if kind == "default":
            scaling = {}
        else:
            scaling["rope_type"] = kind
        draft_vocab = cfg.get("draft_vocab_size")
        return cls(
            arch=arch,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position=int(cfg.get("max_position_embeddings", 8192)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", arch == "qwen2")),
            mlp_bias=bool(cfg.get("mlp_bias", False)),
            qk_norm=arch == "qwen3",
            draft_vocab_size=int(draft_vocab) if draft_vocab else None,
        )

    @classmethod
    def from_folder(cls, path: str | Path) -> ModelConfig:
        p = Path(path) / "config.json"
        if not p.is_file():
            raise ValueError(f"model folder {path} has no config.json")
        return cls.from_dict(json.loads(p.read_text()))
