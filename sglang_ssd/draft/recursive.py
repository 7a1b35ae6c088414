"""Recursive drafting (docs/ALGORITHM.md §9): L0 proposes, the draft model L1 verifies, the target gets L1's law.

Each L1 forward feeds, per branch (or per backup chain), its last token followed by L0's m proposals
g_1..g_m, and reads L1's logits after each. L1's processed distribution q₁ at each row (temperature,
filters, Saguaro — exactly what a plain step would sample from) verifies them with the SD rule of
``algo/cascade.py`` (the one the statistical cases of ``tests/algo`` check):
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

from ..algo.cascade import verify_level_probs
from ..algo.probs import SparseProbs
from .l0 import L0Level, L0Proposal
from .model import DraftModel, Span
from .request import RequestState
from .sampler import STREAM_L1_COIN, cat_q, counter_uniforms, proposal
from .tree import num_top, q_to_full


def _dense(q) -> torch.Tensor:
    """One-row q (dense or sparse) as a dense vector."""
    return q.to_dense()[0] if isinstance(q, SparseProbs) else q[0]


def verify_rows(rows: list[list], props: list[L0Proposal], model: DraftModel, seeds: list[int],
                pos0: list[int]) -> list[tuple[list[int], list]]:  # fmt: skip
    """SD of L0's tokens against L1's q₁ for several branches (or backup chains) at once, by
    ``algo/cascade.verify_level_probs``. Entry b: ``props[b]`` holds L0's m_b tokens, ``rows[b]`` m_b + 1
    one-row q₁ (head vocabulary; row i for the token at absolute position ``pos0[b] + i`` of a request
    with seed ``seeds[b]``). Returns per entry the emitted head ids (j ≤ m_b accepted proposals, then one
    drawn token) and their q₁ rows, the proposal the target verifies them with (never the residual)."""
    m = [len(p.tokens) for p in props]
    num = max(m)
    first = _dense(rows[0][0])
    q1 = torch.zeros(len(props), num + 1, first.shape[-1], device=first.device)
    for i, (rb, mb) in enumerate(zip(rows, m)):
        q1[i, : mb + 1] = torch.stack([_dense(r) for r in rb[: mb + 1]])
    g, q0 = _l0_head(props, model, num, q1.device)
    if model.head_token_ids is not None:
        # L0 may propose tokens the reduced head cannot produce: one more column, "outside the head",
        # where q₁ is 0 (such a token is always rejected) and q₀ keeps its mass (so no residual there).
        q1 = torch.nn.functional.pad(q1, (0, 1))
        g = torch.where(g < 0, q1.shape[-1] - 1, g)
    coins, draws = [], []
    for seed, p in zip(seeds, pos0):
        positions = torch.arange(p, p + num + 1)
        coins.append(counter_uniforms(seed, positions, STREAM_L1_COIN))
        draws.append(counter_uniforms(seed, positions))  # the uniforms a plain step at each position uses
    result = verify_level_probs(q1, g, q0, num_draft=torch.tensor(m, device=q1.device),
                                uniforms=torch.stack(coins).to(q1.device), draws=torch.stack(draws).to(q1.device),
                                check=False)  # fmt: skip
    n, tokens = result.num_emitted.tolist(), result.tokens.tolist()
    return [(tokens[i][: n[i]], rows[i][: n[i]]) for i in range(len(props))]


def _l0_head(props: list[L0Proposal], model: DraftModel, num: int, dev) -> tuple[torch.Tensor, torch.Tensor | None]:
    """L0's tokens as head ids ``[B, num]`` (−1 outside a reduced head, 0 past m_b) and q₀ ``[B, num, V]``
    on the head columns (plus "outside the head" for a reduced head), or None when every entry drew
    greedily. In a batch that mixes both, a greedy entry's q₀ is the one-hot point mass."""
    lengths = torch.tensor([len(p.tokens) for p in props])
    live = torch.arange(num) < lengths[:, None]
    full = torch.zeros(len(props), num, dtype=torch.int64)
    full[live] = torch.tensor([t for p in props for t in p.tokens], dtype=torch.int64)
    g = torch.where(live, model.to_head_ids(full).cpu(), 0).to(dev)
    sampled = [p.probs for p in props if p.probs is not None and p.tokens]
    if not sampled:
        return g, None
    q0 = torch.zeros(len(props), num, sampled[0][0].shape[-1], device=dev)
    for i, p in enumerate(props):
        if p.probs is not None and p.tokens:
            q0[i, : len(p.tokens)] = torch.stack(p.probs).to(dev).float()
        elif p.tokens:
            q0[i, : len(p.tokens)] = torch.nn.functional.one_hot(full[i, : len(p.tokens)], q0.shape[-1]).float()
    ids = model.head_token_ids
    if ids is None:
        return g, q0
    q0 = q0[..., ids.to(dev)]
    return g, torch.cat([q0, (live.to(dev)[..., None].float() - q0.sum(-1, keepdim=True)).clamp_min(0.0)], -1)


def _rows(logits: torch.Tensor, req: RequestState, depth0: int, plan: list[int], c: float) -> list:
    """q₁ for each logits row (row i drafts depth ``depth0 + i``; Saguaro's top set depends on depth)."""
    if c >= 1.0 or not plan:
        q = proposal(logits, req.params, 0)
        return [q[i : i + 1] for i in range(logits.shape[0])]
    return [proposal(logits[i : i + 1], req.params, num_top(plan, depth0 + i, c)) for i in range(logits.shape[0])]


def _observe(l0: L0Level, context: list[int], row, model: DraftModel) -> None:
    if l0.calibrating:
        l0.observe(context, _dense(q_to_full(row, model)).float())


def _count(stats, prop: L0Proposal, emitted: list[int]) -> None:
    if stats is not None:
        stats.count("l0_proposed", len(prop.tokens))
        stats.count("l0_accepted", len(emitted) - 1)
        stats.count("l1_steps")


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
    rows, props, pos0, off = [], [], [], 0
    for b, (prop, ctx) in t.pending.items():
        n = len(prop.tokens) + 1
        d0 = int(t.done[b])
        rows.append(_rows(logits[off : off + n], req, d0, t.sample_plan, c))
        off += n
        _observe(l0, ctx, rows[-1][0], model)
        props.append(prop)
        pos0.append(int(t.positions0[b]) + d0 + 1)
    verified = verify_rows(rows, props, model, [req.seed] * len(props), pos0) if props else []
    for b, prop, (emitted, q_up) in zip(t.pending, props, verified):
        d0 = int(t.done[b])
        take = min(len(emitted), k - d0)
        t.tokens[b, d0 : d0 + take] = model.to_full_ids(torch.tensor(emitted[:take])).cpu()
        t.qb[b] += q_up[:take]
        t.done[b] = d0 + take
        _count(stats, prop, emitted)
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
        rows = [_rows(lg, reqs[i], len(toks[i]), plan, c) for i, lg in zip(active, logits)]
        for (_, ctx), r in zip(props, rows):
            _observe(l0, ctx, r[0], model)
        seeds = [reqs[i].seed for i in active]
        pos0 = [len(reqs[i].tokens) + len(toks[i]) for i in active]
        verified = verify_rows(rows, [p for p, _ in props], model, seeds, pos0)
        for i, (prop, _), (emitted, q_up) in zip(active, props, verified):
            take = min(len(emitted), k - len(toks[i]))
            toks[i] += model.to_full_ids(torch.tensor(emitted[:take])).tolist()
            qs[i] += q_up[:take]
            _count(stats, prop, emitted)
    out = []
    for r, tk, ql in zip(reqs, toks, qs):
        r.kv_len = len(r.tokens) - 1  # the next glue re-feeds the last committed token
        out.append((torch.tensor(tk, dtype=torch.int64), q_to_full(cat_q(ql), model)))
    return out
