"""Recursive drafting (docs/ALGORITHM.md §9): L0 proposes, the draft model L1 verifies, the target gets L1's law.

Each L1 forward feeds, per branch (or per backup chain), its last token followed by L0's m proposals
g_1..g_m, and reads L1's logits after each. L1's processed distribution q₁ at each row (temperature,
filters, Saguaro — exactly what a plain step would sample from) verifies them with the SD rule:
accept g_i with probability min(1, q₁(g_i)/q₀(g_i)) (q₀ = 1 for a greedy L0), on the first rejection
draw from norm(max(0, q₁ − q₀)), after m acceptances draw a bonus from q₁. Every emitted token is then
distributed as q₁ given its real context, so the block is a draft for the target with proposal q₁ —
the rows sent upward are q₁ itself, never the residual. At a greedy L1 (point-mass q₁) the emitted
tokens are exactly L1's argmax chain.

Randomness: the residual/bonus draw at position p uses the same (seed, p) uniform a plain step would,
the acceptance coin its own stream. KV of rejected proposals stays in its slots but is masked out and
overwritten by the next step, which resumes at the first unverified depth.
"""

from __future__ import annotations

import torch

from ..algo.probs import SparseProbs, sample_from_weights
from .l0 import L0Level, L0Proposal
from .model import DraftModel, Span
from .request import RequestState
from .sampler import STREAM_L1_COIN, cat_q, counter_uniforms, proposal
from .tree import num_top, q_to_full


def _dense(q) -> torch.Tensor:
    """One-row q (dense or sparse) as a dense vector."""
    return q.to_dense()[0] if isinstance(q, SparseProbs) else q[0]


def verify_rows(
    rows: list, prop: L0Proposal, model: DraftModel, seed: int, pos0: int
) -> list[int]:
    """SD of L0's tokens against L1's q₁ ``rows`` (m+1 one-row proposals, head vocabulary; row i is L1's
    distribution for the token at absolute position ``pos0 + i``). Returns the emitted head ids (j ≤ m
    accepted proposals, then one drawn token)."""
    m = len(prop.tokens)
    positions = torch.arange(pos0, pos0 + m + 1)
    u_draw = counter_uniforms(seed, positions)
    u_coin = counter_uniforms(seed, positions, STREAM_L1_COIN)
    g_head = model.to_head_ids(torch.tensor(prop.tokens, dtype=torch.int64)).tolist() if m else []
    out: list[int] = []
    for i in range(m + 1):
        q1 = _dense(rows[i]).float()
        if i == m:
            out.append(int(sample_from_weights(q1, u_draw[i])))
            return out
        g = g_head[i]
        q0g = 1.0 if prop.probs is None else float(prop.probs[i][prop.tokens[i]])
        if g >= 0 and float(u_coin[i]) < min(1.0, float(q1[g]) / q0g):
            out.append(g)
            continue
        if prop.probs is None:
            res = q1.clone()
            if g >= 0:
                res[g] = 0.0
        else:
            q0 = prop.probs[i]
            ids = model.head_token_ids
            q0h = q0 if ids is None else q0[ids.to(q0.device)]
            res = (q1 - q0h.to(q1.device)).clamp_min(0.0)
        if float(res.sum()) <= 0:  # q₁ ≤ q₀ everywhere: only possible through rounding
            res = q1
        out.append(int(sample_from_weights(res, u_draw[i])))
        return out
    return out


def _rows(logits: torch.Tensor, req: RequestState, depth0: int, plan: list[int], c: float) -> list:
    """q₁ for each logits row (row i drafts depth ``depth0 + i``; Saguaro's top set depends on depth)."""
    if c >= 1.0 or not plan:
        q = proposal(logits, req.params, 0)
        return [q[i : i + 1] for i in range(logits.shape[0])]
    return [proposal(logits[i : i + 1], req.params, num_top(plan, depth0 + i, c)) for i in range(logits.shape[0])]


def _observe(l0: L0Level, context: list[int], row, model: DraftModel) -> None:
    if l0.calibrating:
        l0.observe(context, _dense(q_to_full(row, model)).float())


# ---- tree branches ---------------------------------------------------------------------------------------
def branch_context(req: RequestState, b: int) -> list[int]:
    t = req.tree
    k = int(t.fork_k[b])
    return req.tokens + req.spec[:k] + [int(t.fork_tok[b])] + t.tokens[b, : int(t.done[b])].tolist()


def l0_tree_span(req: RequestState, l0: L0Level, model: DraftModel, k: int) -> Span:
    """One L1 step over every unfinished branch: its last token + L0's proposals (≤ K − 1 − done)."""
    t = req.tree
    if t.done is None:
        t.done = torch.zeros(t.num_branches, dtype=torch.int64)
        t.qb = [[] for _ in range(t.num_branches)]
    t.pending = {}
    toks, rows_b, rows_d = [], [], []
    for b in range(t.num_branches):
        d0 = int(t.done[b])
        if d0 >= k:
            continue
        ctx = branch_context(req, b)
        m = min(l0.tokens, k - 1 - d0)
        prop = l0.propose(ctx, m, req.seed, int(t.positions0[b]) + d0 + 1, model.vocab_size)
        t.pending[b] = (prop, ctx)
        toks += [ctx[-1], *prop.tokens]
        rows_b += [b] * (len(prop.tokens) + 1)
        rows_d += list(range(d0, d0 + len(prop.tokens) + 1))
    rb, rd = torch.tensor(rows_b), torch.tensor(rows_d)
    write = t.base + rd * t.stride + t.cols[rb]
    kv_len = int(write.max()) + 1
    j = torch.arange(kv_len)
    prefix = (j < t.glue_start).unsqueeze(0)
    g = j - t.glue_start
    glue = ((g >= 0) & (g < t.glue_len)).unsqueeze(0) & (g.unsqueeze(0) <= (t.r0 + t.fork_k[rb]).unsqueeze(1))
    rel = (j - t.base).clamp_min(0)
    own = (j >= t.base).unsqueeze(0) & ((rel % t.stride).unsqueeze(0) == t.cols[rb].unsqueeze(1))
    own &= (rel // t.stride).unsqueeze(0) <= rd.unsqueeze(1)
    return Span(req.extent[0], torch.tensor(toks, dtype=torch.int64), t.positions0[rb] + rd, write, kv_len,
                mask=prefix | glue | own)  # fmt: skip


def l0_advance_tree(req: RequestState, logits: torch.Tensor, model: DraftModel, l0: L0Level, k: int, c: float,
                    stats=None) -> None:  # fmt: skip
    """Verify each branch's proposals, append what L1 emits, and publish every depth all branches reached."""
    t = req.tree
    off = 0
    for b, (prop, ctx) in t.pending.items():
        n = len(prop.tokens) + 1
        d0 = int(t.done[b])
        rows = _rows(logits[off : off + n], req, d0, t.sample_plan, c)
        off += n
        _observe(l0, ctx, rows[0], model)
        emitted = verify_rows(rows, prop, model, req.seed, int(t.positions0[b]) + d0 + 1)
        take = min(len(emitted), k - d0)
        t.tokens[b, d0 : d0 + take] = model.to_full_ids(torch.tensor(emitted[:take])).cpu()
        t.qb[b] += rows[:take]
        t.done[b] = d0 + take
        if stats is not None:
            stats.count("l0_proposed", len(prop.tokens))
            stats.count("l0_accepted", len(emitted) - 1)
            stats.count("l1_steps")
    t.pending = {}
    reached = int(t.done.min()) if t.num_branches else k
    while t.steps_done < reached:
        s = t.steps_done
        t.q.append(cat_q([t.qb[b][s] for b in range(t.num_branches)]))
        t.steps_done += 1


# ---- backup chains ---------------------------------------------------------------------------------------
def l0_neural_draft(model: DraftModel, reqs: list[RequestState], k: int, plan: list[int], c: float, l0: L0Level,
                    stats=None) -> list[tuple[torch.Tensor, object]]:  # fmt: skip
    """K tokens per request from its committed context, L0 proposing and L1 verifying (the recursive
    form of ``backup.neural_draft``; extents must already hold len(tokens) + K slots)."""
    toks: list[list[int]] = [[] for _ in reqs]
    qs: list[list] = [[] for _ in reqs]
    first = [True] * len(reqs)
    while True:
        active = [i for i, tk in enumerate(toks) if len(tk) < k]
        if not active:
            break
        spans, props = [], []
        for i in active:
            r, n = reqs[i], len(toks[i])
            ctx = r.tokens + toks[i]
            p_last = len(r.tokens) - 1 + n  # position of the last known token
            prop = l0.propose(ctx, min(l0.tokens, k - 1 - n), r.seed, p_last + 1, model.vocab_size)
            head = r.tokens[r.kv_len : -1] if first[i] else []
            start = p_last - len(head)
            chain = head + [ctx[-1], *prop.tokens]
            pos = torch.arange(start, start + len(chain))
            spans.append(Span(r.extent[0], torch.tensor(chain, dtype=torch.int64), pos, pos, start + len(chain),
                              out_rows=torch.arange(len(head), len(chain))))  # fmt: skip
            props.append((prop, ctx))
            first[i] = False
        logits = model.forward(spans)
        for i, lg, (prop, ctx) in zip(active, logits, props):
            r, n = reqs[i], len(toks[i])
            rows = _rows(lg, r, n, plan, c)
            _observe(l0, ctx, rows[0], model)
            emitted = verify_rows(rows, prop, model, r.seed, len(r.tokens) + n)
            take = min(len(emitted), k - n)
            toks[i] += model.to_full_ids(torch.tensor(emitted[:take])).tolist()
            qs[i] += rows[:take]
            if stats is not None:
                stats.count("l0_proposed", len(prop.tokens))
                stats.count("l0_accepted", len(emitted) - 1)
                stats.count("l1_steps")
    out = []
    for r, tk, ql in zip(reqs, toks, qs):
        r.kv_len = len(r.tokens) - 1  # the next glue re-feeds the last committed token
        out.append((torch.tensor(tk, dtype=torch.int64), q_to_full(cat_q(ql), model)))
    return out
