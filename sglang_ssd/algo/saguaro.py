"""Saguaro sampling σ_{F,C} (paper Definition 14): the draft's proposal q′.

    σ_{F,C}(z)_t ∝ C·exp(z_t)  if t ∈ top_F(z),   exp(z_t) otherwise,    z = logits / T.

Down-weighting the draft's own top tokens (C < 1) moves the residual max(p − q′, 0) onto them, so the
bonus token after a rejection is more often one the speculation cache already branched on (higher hit
rate, lower acceptance). C = 1 is plain temperature sampling. The reference applies C to the top F+1
tokens, because the forks at a position are the top F *excluding* the sampled token: pass
``num_top = F + 1`` for that.

The verifier must use exactly the q′ returned here (dense, or the exact sparse form when the draft
samples from a truncated top-S distribution). Greedy rows (T ≤ 1e-6) get the point mass at the argmax.
"""

from __future__ import annotations

import torch

from .probs import Generators, SparseProbs, draw_uniforms, sample_proposal
from .sampling_params import GREEDY_EPS


def _per_row(value: float | torch.Tensor, rows: int, device, name: str) -> torch.Tensor:
    t = torch.as_tensor(value, dtype=torch.float32, device=device)
    if t.dim() == 0:
        t = t.expand(rows)
    if t.shape != (rows,):
        raise ValueError(f"{name} must be a scalar or have shape ({rows},), got {tuple(t.shape)}")
    return t.view(rows, 1)


def saguaro_probs(
    logits: torch.Tensor,
    temperature: float | torch.Tensor,
    *,
    num_top: int = 0,
    C: float | torch.Tensor = 1.0,
    support: int | None = None,
) -> torch.Tensor | SparseProbs:
    """q′ = σ_{num_top, C}(logits / T) for ``logits [N, V]``.

    ``temperature``, ``C``: scalars or per-row ``[N]``. ``support``: when set, the draft samples from the
    top-``support`` tokens of the logits only (q′ renormalized there) and q′ comes back as
    :class:`SparseProbs` ``[N, support]`` (exact, small on the wire); otherwise dense float32 ``[N, V]``.
    """
    if logits.dim() != 2 or not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be a float [N, V] tensor, got {logits.dtype} {tuple(logits.shape)}")
    rows, vocab = logits.shape
    if not 0 <= num_top <= vocab:
        raise ValueError(f"num_top must be in [0, {vocab}], got {num_top}")
    if support is not None and not max(1, num_top) <= support <= vocab:
        raise ValueError(f"support must be in [max(1, num_top), {vocab}], got {support}")
    temp = _per_row(temperature, rows, logits.device, "temperature")
    c = _per_row(C, rows, logits.device, "C")
    if bool(((c < 0) | (c > 1)).any()):
        raise ValueError("C must be in [0, 1]")
    greedy = temp <= GREEDY_EPS
    z = logits.float() / torch.where(greedy, 1.0, temp)
    if support is not None:
        z, indices = torch.topk(z, support, dim=-1)  # sorted: the top tokens come first
        top = torch.arange(support, device=z.device) < num_top
    else:
        top = torch.zeros_like(z, dtype=torch.bool)
        if num_top:
            top.scatter_(-1, torch.topk(z, num_top, dim=-1).indices, True)
    q = torch.softmax(z, dim=-1) * torch.where(top, c, 1.0)
    total = q.sum(-1, keepdim=True)
    if bool(((total <= 0) & ~greedy).any()):
        raise ValueError("C = 0 leaves no probability mass outside the top tokens")
    q = q / total
    if bool(greedy.any()):
        point = torch.zeros_like(q).scatter_(-1, z.argmax(-1, keepdim=True), 1.0)
        q = torch.where(greedy, point, q)
    if support is not None:
        return SparseProbs(indices, q, vocab)
    return q


def saguaro_sample(
    logits: torch.Tensor,
    temperature: float | torch.Tensor,
    *,
    num_top: int = 0,
    C: float | torch.Tensor = 1.0,
    support: int | None = None,
    generator: Generators = None,
) -> tuple[torch.Tensor, torch.Tensor | SparseProbs]:
    """Draw one draft token per row from q′ (see :func:`saguaro_probs`); returns ``(tokens [N], q′)``.

    ``generator``: one for all rows, one per row, or None. Hand q′ on to the verifier unchanged.
    """
    q = saguaro_probs(logits, temperature, num_top=num_top, C=C, support=support)
    u = draw_uniforms(logits.shape[0], 1, generator, logits.device)[:, 0]
    return sample_proposal(q, u), q
