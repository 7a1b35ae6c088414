"""The backup drafters that answer a miss (and every request's first round).

- neural (JIT): the draft model decodes K tokens now from the committed context, all missed requests
  batched in each of the K forwards; tokens are sampled from q′ exactly as a tree branch would be (same
  counter-based uniforms), so the verifier gets the q′ they came from;
- fast: the context lookup's deterministic tokens (q = None: point mass), T_b ≈ 0.
"""

from __future__ import annotations

import torch

from .model import DraftModel, Span
from .request import RequestState
from .sampler import proposal, sample
from .tree import num_top, q_to_full, stack_steps

Draft = tuple[torch.Tensor, object]


def ensure_capacity(model: DraftModel, req: RequestState, need: int) -> None:
    """Grow the request's KV extent to ``need`` slots (keeps its committed KV); may raise PoolExhausted."""
    start, length = req.extent
    if need > length:
        req.extent = model.pool.grow(start, length, need, keep=req.kv_len)


def fast_draft(reqs: list[RequestState], k: int) -> list[Draft]:
    return [(torch.tensor(r.lookup.propose(r.tokens, k), dtype=torch.int64), None) for r in reqs]


def neural_draft(model: DraftModel, reqs: list[RequestState], k: int, plan: list[int], c: float) -> list[Draft]:
    """K tokens per request from its committed context (extents must already hold len(tokens) + K slots).

    Step 0 feeds everything after the committed KV (at least the last token), later steps one token.
    ``plan``: the fan-out these tokens will be forked with (sets Saguaro's top set).
    """
    toks: list[list[int]] = [[] for _ in reqs]
    qs: list[list] = [[] for _ in reqs]
    for j in range(k):
        spans = []
        for r, tk in zip(reqs, toks):
            if j == 0:
                chain = r.tokens[r.kv_len :]
                pos = torch.arange(r.kv_len, len(r.tokens))
                spans.append(Span(r.extent[0], torch.tensor(chain), pos, pos, len(r.tokens),
                                  out_rows=torch.tensor([len(chain) - 1])))  # fmt: skip
            else:
                p = len(r.tokens) - 1 + j
                pos = torch.tensor([p])
                spans.append(Span(r.extent[0], torch.tensor([tk[-1]]), pos, pos, p + 1))
        logits = model.forward(spans)
        for r, lg, tk, ql in zip(reqs, logits, toks, qs):
            q = proposal(lg, r.params, num_top(plan, j, c))
            head = sample(q, r.seed, torch.tensor([len(r.tokens) + j]))
            tk.append(int(model.to_full_ids(head)[0]))
            ql.append(q)
    out = []
    for r, tk, ql in zip(reqs, toks, qs):
        # The next glue re-feeds the last committed token: it needs that token's logits too.
        r.kv_len = len(r.tokens) - 1
        out.append((torch.tensor(tk, dtype=torch.int64), q_to_full(stack_steps(ql)[0], model)))
    return out
