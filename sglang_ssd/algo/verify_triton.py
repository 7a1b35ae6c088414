"""Chain verification as one Triton kernel: the rule of :mod:`.verify`, one program per request.

For GPUs without FlashInfer (Triton ships with PyTorch there). Unlike FlashInfer's fused kernel it takes
the caller's uniforms, so with the same coins it must reproduce the torch path: the accept decisions
bit for bit (the same float32 products u·q(s) < p(s)), the bonus up to the order of a float32 prefix
sum at a CDF boundary. Runs under ``TRITON_INTERPRET=1`` on a CPU, which is how CI checks it.

Inputs are dense: target ``p [B, K+1, V]`` and proposal ``q [B, K, V]`` (point masses one-hot, see
:func:`.verify.dense_proposal`), float32, contiguous in V.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _chain_verify_kernel(
    p_ptr, q_ptr, s_ptr, n_ptr, u_ptr, k_ptr, bonus_ptr,
    K, V, stride_pb, stride_pk, stride_qb, stride_qk,
    BLOCK: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    n = tl.load(n_ptr + b).to(tl.int32)
    k = tl.zeros((), tl.int32)
    live = tl.full((), 1, tl.int32)
    for i in range(0, K):
        x = tl.load(s_ptr + b * K + i).to(tl.int64)
        px = tl.load(p_ptr + b * stride_pb + i * stride_pk + x)
        qx = tl.load(q_ptr + b * stride_qb + i * stride_qk + x)
        u = tl.load(u_ptr + b * (K + 1) + i)
        ok = (u * qx < px) & (i < n) & (live == 1)
        k = k + ok.to(tl.int32)
        live = live * ok.to(tl.int32)
    # Bonus position k: the residual max(p − q, 0) after a rejection, p itself after a full chain.
    resid = k < n
    kq = tl.minimum(k, K - 1).to(tl.int64)
    p_row = p_ptr + b * stride_pb + k.to(tl.int64) * stride_pk
    q_row = q_ptr + b * stride_qb + kq * stride_qk
    total = tl.zeros((), tl.float32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < V
        pv = tl.load(p_row + offs, mask=m, other=0.0)
        qv = tl.load(q_row + offs, mask=m & resid, other=0.0)
        w = tl.where(resid, tl.maximum(pv - qv, 0.0), pv)
        total += tl.sum(w, axis=0)
    use_p = total <= 0.0  # p = q at a rejection: only rounding lands here; fall back to p
    if use_p:
        total = tl.zeros((), tl.float32)
        for start in range(0, V, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            total += tl.sum(tl.load(p_row + offs, mask=offs < V, other=0.0), axis=0)
    target = tl.load(u_ptr + b * (K + 1) + K) * total
    running = tl.zeros((), tl.float32)
    found = tl.full((), V, tl.int32)
    best_w = tl.full((), -1.0, tl.float32)
    best_i = tl.zeros((), tl.int32)
    for start in range(0, V, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < V
        pv = tl.load(p_row + offs, mask=m, other=0.0)
        qv = tl.load(q_row + offs, mask=m & resid & (use_p == 0), other=0.0)
        w = tl.where(resid & (use_p == 0), tl.maximum(pv - qv, 0.0), pv)
        w = tl.where(m, w, 0.0)
        cdf = running + tl.cumsum(w, axis=0)
        first = tl.min(tl.where((cdf > target) & m, offs, V), axis=0)
        found = tl.minimum(found, first)
        running += tl.sum(w, axis=0)
        bw = tl.max(w, axis=0)
        bi = tl.min(tl.where(w == bw, offs, V), axis=0)
        better = bw > best_w
        best_i = tl.where(better, bi, best_i)
        best_w = tl.where(better, bw, best_w)
    idx = tl.minimum(found, V - 1)
    # As the torch path: an index of zero weight (u·total rounded up to the total) becomes the heaviest.
    w_idx = tl.load(p_row + idx) - tl.where(resid & (use_p == 0), tl.load(q_row + idx), 0.0)
    idx = tl.where(w_idx > 0.0, idx, best_i)
    tl.store(k_ptr + b, k)
    tl.store(bonus_ptr + b, idx)


def chain_verify_triton(
    p: torch.Tensor, draft_tokens: torch.Tensor, q: torch.Tensor, num_draft: torch.Tensor | None,
    uniforms: torch.Tensor, block: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(k [B] int64, bonus [B] int64) by the exact rule, from dense ``p``, ``q`` and ``uniforms [B, K+1]``."""
    batch, positions, vocab = p.shape
    num = positions - 1
    if num < 1:
        raise ValueError("chain_verify_triton needs at least one draft position")
    p = p.float().contiguous()
    q = q.float().contiguous()
    s = draft_tokens.long().contiguous()
    n = (num_draft if num_draft is not None else torch.full((batch,), num, device=p.device)).int().contiguous()
    u = uniforms.float().contiguous()
    k = torch.empty(batch, dtype=torch.int32, device=p.device)
    bonus = torch.empty(batch, dtype=torch.int32, device=p.device)
    _chain_verify_kernel[(batch,)](
        p, q, s, n, u, k, bonus, num, vocab, p.stride(0), p.stride(1), q.stride(0), q.stride(1),
        BLOCK=min(block, triton.next_power_of_2(vocab)),
    )  # fmt: skip
    return k.long(), bonus.long()
