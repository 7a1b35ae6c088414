"""The branch tree of one round (docs/ALGORITHM.md §2): glue chain, forks, batched branch steps.

- glue: feed ``tokens[kv_len:] + spec`` causally; rows ``r0 … r0+K'`` are the draft's logits at the K'+1
  fork points (after k = 0 … K' accepted tokens);
- forks: at fork point k the F_k candidate bonus tokens are the top-F_k draft logits **excluding**
  s_{k+1} (a rejected token is never the bonus);
- branch step s: every branch feeds its step-s token at RoPE position base + k + 1 + s and attends to the
  committed prefix, glue rows ``[0, r0 + k]`` and its own earlier branch tokens — one mask row per branch.
"""

from __future__ import annotations

import torch

from ..algo.probs import SparseProbs
from .model import DraftModel, Span
from .request import RequestState, Tree
from .sampler import proposal, sample


def num_top(plan: list[int], depth: int, c: float) -> int:
    """Saguaro's top set for a token drafted at ``depth`` (0-based): F + 1 where F is the fan-out the next
    round will use at that fork point (the sampled token itself is excluded from the forks)."""
    if c >= 1.0 or not plan:
        return 0
    return plan[min(depth, len(plan) - 1)] + 1


def glue_span(req: RequestState) -> Span:
    chain = req.tokens[req.kv_len :] + req.spec
    n = len(chain)
    r0 = len(req.tokens) - 1 - req.kv_len
    pos = torch.arange(req.kv_len, req.kv_len + n)
    return Span(
        start=req.extent[0],
        tokens=torch.tensor(chain, dtype=torch.int64),
        positions=pos,
        write=pos,
        kv_len=req.kv_len + n,
        out_rows=torch.arange(r0, n),
    )


def select_forks(req: RequestState, glue_logits: torch.Tensor, plan: list[int], model: DraftModel, k: int) -> Tree:
    """Tree of fork candidates from the glue logits ``[K'+1, V_head]`` and the fan-out ``plan`` (one
    entry per outcome k = 0..K_p, K_p ≥ the speculation's length K'); each branch drafts ``k`` tokens."""
    spec = req.spec
    kp, last = len(spec), len(plan) - 1
    fanout = [plan[min(j, last)] if j < kp else plan[last] for j in range(kp + 1)]
    width = min(max(fanout) + 1, glue_logits.shape[-1])
    top_vals, top_idx = torch.topk(glue_logits, width, dim=-1)
    top_full = model.to_full_ids(top_idx).tolist()
    finite = torch.isfinite(top_vals).tolist()
    fork_k, fork_tok = [], []
    for j in range(kp + 1):
        excluded = spec[j] if j < kp else None
        picked = [t for t, ok in zip(top_full[j], finite[j]) if ok and t != excluded][: fanout[j]]
        fork_k += [j] * len(picked)
        fork_tok += picked
    nb = len(fork_k)
    glue_len = len(req.tokens) - req.kv_len + kp
    r0 = len(req.tokens) - 1 - req.kv_len
    fk = torch.tensor(fork_k, dtype=torch.int64)
    return Tree(
        glue_start=req.kv_len,
        r0=r0,
        glue_len=glue_len,
        base=req.kv_len + glue_len,
        stride=nb,
        cols=torch.arange(nb),
        fork_k=fk,
        fork_tok=torch.tensor(fork_tok, dtype=torch.int64),
        positions0=req.kv_len + r0 + fk + 1,
        tokens=torch.zeros(nb, k, dtype=torch.int64),
    )


def tree_mask(t: Tree, s: int, kv_len: int) -> torch.Tensor:
    """bool ``[nb, kv_len]``: what each branch's step-``s`` token may attend to."""
    j = torch.arange(kv_len)
    prefix = (j < t.glue_start).unsqueeze(0)
    g = j - t.glue_start
    glue = ((g >= 0) & (g < t.glue_len)).unsqueeze(0) & (g.unsqueeze(0) <= (t.r0 + t.fork_k).unsqueeze(1))
    rel = (j - t.base).clamp_min(0)
    own = (j >= t.base).unsqueeze(0) & ((rel % t.stride).unsqueeze(0) == t.cols.unsqueeze(1))
    own &= (rel // t.stride <= s).unsqueeze(0)
    return prefix | glue | own


def tree_span(req: RequestState) -> Span:
    t = req.tree
    s = t.steps_done
    inputs = t.fork_tok if s == 0 else t.tokens[:, s - 1]
    write = t.base + s * t.stride + t.cols
    kv_len = int(write.max()) + 1
    return Span(
        start=req.extent[0],
        tokens=inputs.clone(),
        positions=t.positions0 + s,
        write=write,
        kv_len=kv_len,
        mask=tree_mask(t, s, kv_len),
    )


def advance_tree(req: RequestState, logits: torch.Tensor, model: DraftModel, c: float) -> None:
    """Sample every branch's next draft token from its step logits ``[nb, V_head]``."""
    t = req.tree
    s = t.steps_done
    q = proposal(logits, req.params, num_top(t.sample_plan, s, c))
    head = sample(q, req.seed, t.positions0 + s + 1)
    t.tokens[:, s] = model.to_full_ids(head).cpu()
    t.q.append(q)
    t.steps_done += 1


def tree_capacity(req: RequestState, k: int, budget: int) -> int:
    """Extent slots a round needs: context + glue + K steps of at most ``budget`` branches."""
    return len(req.tokens) + len(req.spec) + 1 + k * budget


def tree_capacity_for(prompt_len: int, k: int, budget: int) -> int:
    """Initial extent for a new request: prompt + one round's glue and tree, with room to grow."""
    return prompt_len + 2 * (k + 1) + k * budget + 64


def q_to_full(q: torch.Tensor | SparseProbs, model: DraftModel) -> torch.Tensor | SparseProbs:
    """q′ over head rows ⇒ q′ over the full vocabulary (exact; zero outside a reduced head)."""
    if isinstance(q, SparseProbs):
        return SparseProbs(model.to_full_ids(q.indices), q.probs, model.vocab_size)
    ids = model.head_token_ids
    if ids is None:
        return q
    out = q.new_zeros(*q.shape[:-1], model.vocab_size)
    out[..., ids] = q
    return out


def stack_steps(qs: list[torch.Tensor | SparseProbs]) -> torch.Tensor | SparseProbs:
    """Per-step q′ ``[nb, ·]`` ×K ⇒ ``[nb, K, ·]`` (sparse supports padded to the widest)."""
    if not isinstance(qs[0], SparseProbs):
        return torch.stack(qs, dim=1)
    width = max(q.support for q in qs)
    pad = torch.nn.functional.pad
    idx = torch.stack([pad(q.indices, (0, width - q.support)) for q in qs], dim=1)
    val = torch.stack([pad(q.probs, (0, width - q.support)) for q in qs], dim=1)
    return SparseProbs(idx, val, qs[0].vocab_size)
