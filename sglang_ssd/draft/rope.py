"""Rotary position embedding (half-split "rotate_half" form) with default, linear and llama3 scaling.

cos/sin are tabulated per absolute position in float32 (the product position × inv_freq is formed in
float32, as the reference implementation does, so logits agree to float32 rounding) and grown on demand.
"""

from __future__ import annotations

import math

import torch

from .model_config import ModelConfig


def inv_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """float32 ``[head_dim / 2]`` rotation frequencies (radians per position)."""
    dim = cfg.head_dim
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = cfg.rope_scaling.get("rope_type", "default")
    if kind == "linear":
        inv = inv / float(cfg.rope_scaling["factor"])
    elif kind == "llama3":
        s = cfg.rope_scaling
        factor = float(s["factor"])
        low, high = float(s.get("low_freq_factor", 1.0)), float(s.get("high_freq_factor", 4.0))
        old_len = float(s.get("original_max_position_embeddings", 8192))
        wavelen = 2 * math.pi / inv
        scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        inv = torch.where(medium, smoothed, scaled)
    return inv


class Rope:
    """cos/sin tables ``[P, head_dim]`` on ``device``; :meth:`apply` rotates q and k in place of copies."""

    def __init__(self, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
        self.inv_freq = inv_frequencies(cfg)
        self.device, self.dtype = device, dtype
        self.cos = torch.empty(0, cfg.head_dim, device=device, dtype=dtype)
        self.sin = self.cos
        self._grow(min(cfg.max_position, 4096))

    def _grow(self, n: int) -> None:
        freqs = torch.outer(torch.arange(n, dtype=torch.int64).float(), self.inv_freq)
        emb = torch.cat([freqs, freqs], dim=-1)
        self.cos = emb.cos().to(self.device, self.dtype)
        self.sin = emb.sin().to(self.device, self.dtype)

    def tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[N, 1, D]`` for int64 positions ``[N]`` (gathered once per forward, used per layer)."""
        need = int(positions.max()) + 1 if positions.numel() else 0
        if need > self.cos.shape[0]:
            self._grow(max(need, 2 * self.cos.shape[0]))
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)

    @staticmethod
    def apply(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """q ``[N, Hq, D]``, k ``[N, Hkv, D]`` ⇒ rotated (q, k)."""
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)
