"""Small fixed "models" over V = 8 tokens and a vectorized simulation of speculative rounds.

A model is a function from context (the last two tokens) to logits, so the target's exact law of the
first one or two emitted tokens is computable, while 10⁵ independent requests run as one batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from sglang_ssd.algo import SamplingBatch, SparseProbs, process_logits, saguaro_sample
from sglang_ssd.algo.cascade import cascade_draft, verify_cascade, verify_level
from sglang_ssd.algo.sampling_params import apply_penalties
from sglang_ssd.algo.verify import ChainVerifyResult, verify_chain

V = 8
N = 100_000
CTX0 = (2, 5)


class TableModel:
    """logits(ctx) = A[last] + B[second-to-last]: a fixed, context-dependent distribution."""

    def __init__(self, seed: int, scale: float = 1.0):
        g = torch.Generator().manual_seed(seed)
        self.a = torch.randn(V, V, generator=g) * scale
        self.b = torch.randn(V, V, generator=g) * scale * 0.5

    def near(self, seed: int, noise: float) -> TableModel:
        """A draft: this model with its tables perturbed."""
        g = torch.Generator().manual_seed(seed)
        other = TableModel.__new__(TableModel)
        other.a = self.a + noise * torch.randn(V, V, generator=g)
        other.b = self.b + noise * torch.randn(V, V, generator=g)
        return other

    def __call__(self, ctx: torch.Tensor) -> torch.Tensor:
        return self.a[ctx[:, 1]] + self.b[ctx[:, 0]]


def push(ctx: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    return torch.stack([ctx[:, 1], tok.long()], 1)


def grammar(ctx: torch.Tensor) -> torch.Tensor:
    """A context-dependent grammar: token (last + 3) mod V is forbidden. Bool [N, V], True = allowed."""
    banned = (ctx[:, 1] + 3) % V
    return torch.arange(V) != banned[:, None]


@dataclass
class Setup:
    """One configuration of the statistical check."""

    kind: str = "dense"  # dense | sparse | point | mixed
    temperature: float = 1.0
    C: float = 1.0
    filters: bool = False  # top-k / top-p / min-p + grammar mask on the target side
    penalties: bool = False
    K: int = 3
    num_top: int = 3  # Saguaro: top F+1 with F = 2
    support: int = 4  # sparse q': the draft samples from its top-4 tokens
    seed: int = 0
    target: TableModel = field(default_factory=lambda: TableModel(1))

    @property
    def draft(self) -> TableModel:
        return self.target.near(2, 1.0)

    def sampling(self, n: int) -> SamplingBatch:
        if self.filters:
            return SamplingBatch.make(n, self.temperature, top_k=6, top_p=0.92, min_p=0.03)
        return SamplingBatch.make(n, self.temperature)

    # penalties of the request: its output so far is the context (counts of CTX0's tokens)
    FREQ, PRES, REP = 0.4, 0.3, 1.3

    def penalize(self, logits: torch.Tensor, draft_tokens: torch.Tensor, counts: torch.Tensor):
        if not self.penalties:
            return logits
        n = logits.shape[0]
        return apply_penalties(
            logits,
            draft_tokens,
            counts,
            frequency=torch.full((n,), self.FREQ),
            presence=torch.full((n,), self.PRES),
            repetition=torch.full((n,), self.REP),
        )


def _draft(model: TableModel, ctx, setup: Setup, kind: str, gen: torch.Generator):
    """K draft tokens from ``ctx``; returns tokens [N, K], proposal, and the K+1 contexts."""
    ctxs, toks, qs = [ctx], [], []
    for _ in range(setup.K):
        logits = model(ctx)
        if kind == "point":
            # A deterministic guesser (fast backup): the draft's argmax or a random token, chosen by the
            # drafter's own coin. Its proposal is the point mass on whatever it outputs.
            coin = torch.rand(ctx.shape[0], generator=gen) < 0.5
            tok = torch.where(coin, logits.argmax(-1), torch.randint(0, V, (ctx.shape[0],), generator=gen))
            q = None
        else:
            tok, q = saguaro_sample(
                logits,
                setup.temperature,
                num_top=setup.num_top if setup.C < 1 else 0,
                C=setup.C,
                support=setup.support if kind == "sparse" else None,
                generator=gen,
            )
        toks.append(tok)
        qs.append(q)
        ctx = push(ctx, tok)
        ctxs.append(ctx)
    tokens = torch.stack(toks, 1)
    if kind == "point":
        return tokens, None, ctxs
    if kind == "sparse":
        return (
            tokens,
            SparseProbs(torch.stack([q.indices for q in qs], 1), torch.stack([q.probs for q in qs], 1), V),
            ctxs,
        )
    return tokens, torch.stack(qs, 1), ctxs


def _contexts(ctx, tokens):
    ctxs = [ctx]
    for i in range(tokens.shape[1]):
        ctx = push(ctx, tokens[:, i])
        ctxs.append(ctx)
    return ctxs


def spec_round(
    setup: Setup, ctx: torch.Tensor, counts: torch.Tensor, gen_draft, gen_verify, verify=verify_chain
) -> ChainVerifyResult:
    """One speculative round for every request: draft, target forward, verify."""
    n = ctx.shape[0]
    deterministic = None
    if setup.kind == "mixed":
        # Half the requests hit the speculation cache (sparse Saguaro q'), half fell to the fast backup.
        tok_s, q, _ = _draft(setup.draft, ctx, setup, "sparse", gen_draft)
        tok_p, _, _ = _draft(setup.draft, ctx, setup, "point", gen_draft)
        deterministic = torch.rand(n, generator=gen_draft) < 0.5
        tokens = torch.where(deterministic[:, None], tok_p, tok_s)
        ctxs = _contexts(ctx, tokens)
    else:
        tokens, q, ctxs = _draft(setup.draft, ctx, setup, setup.kind, gen_draft)
    logits = torch.stack([setup.target(c) for c in ctxs], 1)
    logits = setup.penalize(logits, tokens, counts)
    mask = torch.stack([grammar(c) for c in ctxs], 1) if setup.filters else None
    return verify(
        logits,
        tokens,
        q,
        setup.sampling(n),
        allowed_mask=mask,
        deterministic=deterministic,
        generator=gen_verify,
    )


def _start(n: int):
    ctx = torch.tensor(CTX0).expand(n, 2).clone()
    counts = torch.zeros(n, V)
    counts[:, CTX0[0]] += 1
    counts[:, CTX0[1]] += 1
    return ctx, counts


def first_two(setup: Setup, n: int = N, verify=verify_chain) -> tuple[torch.Tensor, torch.Tensor]:
    """(y1, y2) for ``n`` independent requests starting at CTX0; a request that emitted one token in
    round 1 takes its second from a round 2 started after y1."""
    gen_draft = torch.Generator().manual_seed(1000 + setup.seed)
    gen_verify = torch.Generator().manual_seed(2000 + setup.seed)
    ctx, counts = _start(n)
    r1 = spec_round(setup, ctx, counts, gen_draft, gen_verify, verify)
    y1 = r1.tokens[:, 0]
    counts2 = counts.scatter_add(1, y1[:, None], torch.ones(n, 1))
    r2 = spec_round(setup, push(ctx, y1), counts2, gen_draft, gen_verify, verify)
    y2 = torch.where(r1.accept_len >= 1, r1.tokens[:, 1], r2.tokens[:, 0])
    return y1, y2


def exact_law(setup: Setup) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's exact law: p(y1) [V] and p(y1, y2) [V, V], from plain (non-speculative) sampling."""
    ctx, counts = _start(1)
    empty = torch.zeros(1, 0, dtype=torch.long)

    def p_next(ctx, counts):
        logits = setup.penalize(setup.target(ctx)[:, None], empty.expand(ctx.shape[0], 0), counts)
        mask = grammar(ctx)[:, None] if setup.filters else None
        return process_logits(logits, setup.sampling(ctx.shape[0]), mask)[:, 0].double()

    p1 = p_next(ctx, counts)[0]
    ys = torch.arange(V)
    ctx2 = push(ctx.expand(V, 2), ys)
    counts2 = counts.expand(V, V).clone()
    counts2[ys, ys] += 1
    p2 = p_next(ctx2, counts2)  # [V (y1), V (y2)]
    return p1, p1[:, None] * p2


# ---- three levels -----------------------------------------------------------------------------------


def cascade_first_two(
    setup: Setup, tau_mid: float, n: int = N, backend: str = "auto"
) -> tuple[torch.Tensor, torch.Tensor]:
    """M0 (draft) → M1 (middle, sampling at its own temperature tau_mid) → M2 (target)."""
    middle = setup.target.near(3, 0.6)
    small = middle.near(4, 0.8)
    gen_draft = torch.Generator().manual_seed(3000 + setup.seed)
    gen_mid = torch.Generator().manual_seed(4000 + setup.seed)
    gen_top = torch.Generator().manual_seed(5000 + setup.seed)

    def one_round(ctx):
        tokens, q, ctxs = _draft(small, ctx, setup, setup.kind, gen_draft)
        mid_logits = torch.stack([middle(c) for c in ctxs], 1)
        mid_sampling = SamplingBatch.make(ctx.shape[0], tau_mid)
        r_mid, p_mid = verify_level(mid_logits, tokens, q, mid_sampling, generator=gen_mid, backend=backend)
        draft = cascade_draft(r_mid, p_mid)
        top_ctxs = _contexts(ctx, draft.tokens)
        top_logits = torch.stack([setup.target(c) for c in top_ctxs], 1)
        mask = torch.stack([grammar(c) for c in top_ctxs], 1) if setup.filters else None
        return verify_cascade(
            top_logits,
            draft,
            setup.sampling(ctx.shape[0]),
            allowed_mask=mask,
            generator=gen_top,
            backend=backend,
        )

    ctx, _ = _start(n)
    r1 = one_round(ctx)
    y1 = r1.tokens[:, 0]
    r2 = one_round(push(ctx, y1))
    y2 = torch.where(r1.accept_len >= 1, r1.tokens[:, 1], r2.tokens[:, 0])
    return y1, y2
