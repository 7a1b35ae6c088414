"""Random-weight Llama-family models: a folder on disk (config.json + model.safetensors), or weights built
directly on a device (large shapes for timing, no file written).

For tests and microbenchmarks: shapes and numerics are those of a real checkpoint, only the values are
random (the weights do not change a step's cost). Scales are chosen so the next-token distributions
are peaked rather than uniform, which makes greedy ties unlikely and sampling tests informative.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file


def write_random_model(
    folder: str | Path,
    *,
    vocab_size: int = 256,
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int | None = None,
    rope_theta: float = 10000.0,
    rope_scaling: dict | None = None,
    tie_word_embeddings: bool = False,
    arch: str = "llama",
    draft_token_ids: list[int] | None = None,
    max_position_embeddings: int = 4096,
    logit_scale: float = 4.0,
    seed: int = 0,
) -> Path:
    """``arch``: "llama" or "qwen3" (q/k norms). ``draft_token_ids``: write a reduced-vocabulary head
    with these full-vocabulary ids (sorted, unique)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    d = head_dim or hidden_size // num_heads

    def rnd(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).float().contiguous()

    h, inter = hidden_size, intermediate_size
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": rnd(vocab_size, h, scale=1.0)}
    for i in range(num_layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1.0 + rnd(h, scale=0.1)
        t[p + "post_attention_layernorm.weight"] = 1.0 + rnd(h, scale=0.1)
        t[p + "self_attn.q_proj.weight"] = rnd(num_heads * d, h, scale=h**-0.5)
        t[p + "self_attn.k_proj.weight"] = rnd(num_kv_heads * d, h, scale=h**-0.5)
        t[p + "self_attn.v_proj.weight"] = rnd(num_kv_heads * d, h, scale=h**-0.5)
        t[p + "self_attn.o_proj.weight"] = rnd(h, num_heads * d, scale=(num_heads * d) ** -0.5)
        t[p + "mlp.gate_proj.weight"] = rnd(inter, h, scale=h**-0.5)
        t[p + "mlp.up_proj.weight"] = rnd(inter, h, scale=h**-0.5)
        t[p + "mlp.down_proj.weight"] = rnd(h, inter, scale=inter**-0.5)
        if arch == "qwen3":
            t[p + "self_attn.q_norm.weight"] = 1.0 + rnd(d, scale=0.1)
            t[p + "self_attn.k_norm.weight"] = 1.0 + rnd(d, scale=0.1)
    t["model.norm.weight"] = 1.0 + rnd(h, scale=0.1)
    cfg = {
        "architectures": ["Qwen3ForCausalLM" if arch == "qwen3" else "LlamaForCausalLM"],
        "model_type": arch,
        "vocab_size": vocab_size,
        "hidden_size": h,
        "intermediate_size": inter,
        "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": d,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": rope_theta,
        "max_position_embeddings": max_position_embeddings,
        "tie_word_embeddings": tie_word_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": "float32",
    }
    if rope_scaling:
        cfg["rope_scaling"] = rope_scaling
    if tie_word_embeddings:
        t["model.embed_tokens.weight"] *= logit_scale * h**-0.5
    elif draft_token_ids is not None:
        ids = torch.tensor(sorted(set(draft_token_ids)), dtype=torch.int64)
        t["lm_head.weight"] = rnd(ids.shape[0], h, scale=logit_scale * h**-0.5)
        t["draft_token_ids"] = ids
        cfg["draft_vocab_size"] = int(ids.shape[0])
    else:
        t["lm_head.weight"] = rnd(vocab_size, h, scale=logit_scale * h**-0.5)
    save_file(t, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


def random_weights(cfg, dtype, device, seed: int = 0):
    """:class:`ModelWeights` for ``cfg`` drawn on ``device`` (timing runs; values scaled as above)."""
    from sglang_ssd.draft.weights import LayerWeights, ModelWeights

    g = torch.Generator(device=device).manual_seed(seed)
    h, d, inter = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size

    def rnd(*shape, scale):
        return (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) * scale).to(dtype)

    layers = []
    for _ in range(cfg.num_layers):
        layers.append(LayerWeights(
            attn_norm=1.0 + rnd(h, scale=0.1),
            wqkv=rnd((cfg.num_heads + 2 * cfg.num_kv_heads) * d, h, scale=h**-0.5),
            bqkv=None,
            wo=rnd(h, cfg.num_heads * d, scale=(cfg.num_heads * d) ** -0.5),
            bo=None,
            mlp_norm=1.0 + rnd(h, scale=0.1),
            w_gate_up=rnd(2 * inter, h, scale=h**-0.5),
            b_gate_up=None,
            w_down=rnd(h, inter, scale=inter**-0.5),
            b_down=None,
            q_norm=None,
            k_norm=None,
        ))  # fmt: skip
    embed = rnd(cfg.vocab_size, h, scale=1.0)
    lm_head = embed if cfg.tie_word_embeddings else rnd(cfg.vocab_size, h, scale=4.0 * h**-0.5)
    return ModelWeights(embed, layers, 1.0 + rnd(h, scale=0.1), lm_head, None)
