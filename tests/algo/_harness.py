"""Small fixed "models" over a few tokens and a vectorized simulation of one speculative round.

What is checked is the law of the whole block a round emits, the accepted drafts and the bonus, the
bonus after full acceptance included. A round emits L ≤ K+1 tokens (K+2 for a three-level chain); the
rows that stopped early are completed to n tokens by plain sampling from the same target. Exact SD
makes that n-token sequence distributed as n tokens of plain sampling from the target, whatever the
draft, and that law is computed exactly by enumerating all V^n sequences. So a wrong bonus after full
acceptance, a wrong residual, a wrong q′ all change the law of a sequence the test sees.

A model maps the context (the last two tokens) to logits; 10⁵ independent requests run as one batch.
The runtime functions are looked up on their modules at call time, so that ``tests/mutants`` can swap a
planted bug into them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from sglang_ssd.algo import SamplingBatch, SparseProbs, cascade, process_logits, saguaro
from sglang_ssd.algo import verify as verify_mod
from sglang_ssd.algo.probs import sample_from_weights
from sglang_ssd.algo.verify import ChainVerifyResult
from sglang_ssd.draft import recursive
from sglang_ssd.draft.l0 import L0Proposal

CTX0 = (1, 2)


class TableModel:
    """logits(ctx) = A[last] + B[second-to-last]: a fixed, context-dependent distribution."""

    def __init__(self, seed: int, vocab: int, scale: float = 1.0):
        g = torch.Generator().manual_seed(seed)
        self.vocab = vocab
        self.a = torch.randn(vocab, vocab, generator=g) * scale
        self.b = torch.randn(vocab, vocab, generator=g) * scale * 0.5

    def near(self, seed: int, noise: float) -> TableModel:
        """A draft: this model with its tables perturbed."""
        g = torch.Generator().manual_seed(seed)
        other = TableModel.__new__(TableModel)
        other.vocab = self.vocab
        other.a = self.a + noise * torch.randn(self.vocab, self.vocab, generator=g)
        other.b = self.b + noise * torch.randn(self.vocab, self.vocab, generator=g)
        return other

    def __call__(self, ctx: torch.Tensor) -> torch.Tensor:
        return self.a[ctx[:, 1]] + self.b[ctx[:, 0]]


def push(ctx: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    return torch.stack([ctx[:, 1], tok.long()], 1)


def contexts(ctx: torch.Tensor, tokens: torch.Tensor) -> list[torch.Tensor]:
    """The K+1 contexts along a chain: before s_1, ..., after s_K."""
    out = [ctx]
    for i in range(tokens.shape[1]):
        ctx = push(ctx, tokens[:, i])
        out.append(ctx)
    return out


def grammar(ctx: torch.Tensor, vocab: int) -> torch.Tensor:
    """A context-dependent grammar: token (last + 3) mod V is forbidden. Bool [N, V], True = allowed."""
    return torch.arange(vocab) != ((ctx[:, 1] + 3) % vocab)[:, None]


@dataclass
class Setup:
    """One configuration: the target, the draft and the request's sampling settings."""

    kind: str = "dense"  # dense | sparse | point | mixed (half point masses, half sparse)
    temperature: float = 1.0
    C: float = 1.0  # Saguaro: C < 1 down-weights the draft's top num_top tokens
    filters: bool = False  # top-k / top-p / min-p + a grammar mask on the target side
    penalties: bool = False  # frequency/presence/repetition + logit bias, applied as the server does
    K: int = 2
    vocab: int = 5
    num_top: int = 2  # Saguaro's top set F+1, F = 1
    support: int = 3  # sparse q′: the draft samples from its top-3 tokens
    point_hit: float = 0.85  # fast backup: share of guesses that are the draft's argmax (else uniform)
    noise: float = 0.6  # how far the draft's tables are from the target's
    mid_noise: float = 0.4  # three levels: how far the middle model is from the target
    seed: int = 0
    target: TableModel = field(init=False)
    draft: TableModel = field(init=False)

    def __post_init__(self):
        self.target = TableModel(1, self.vocab, 0.6)
        self.draft = self.target.near(2, self.noise)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def sampling(self, n: int) -> SamplingBatch:
        if self.filters:
            return SamplingBatch.make(n, self.temperature, top_k=3, top_p=0.95, min_p=0.05)
        return SamplingBatch.make(n, self.temperature)

    def mask(self, ctx: torch.Tensor) -> torch.Tensor | None:
        return grammar(ctx, self.vocab) if self.filters else None


# ---- penalties: the server's rule -----------------------------------------------------------------
#
# SGLang's speculative workers (and ours, sglang_ssd/target/target_logits.py) add the penalties
# accumulated over the committed context to every position of the chain, then the logit bias. The
# law that rule gives a round is plain sampling with those penalties held fixed for the whole round.

FREQ, PRES, REP = 0.4, 0.3, 1.3


def committed_penalties(setup: Setup, counts: torch.Tensor) -> SimpleNamespace:
    """SGLang's accumulated tensors for a committed output with token ``counts [N, V]`` (what its
    frequency, presence and repetition penalizers accumulate), plus a fixed logit bias."""
    n, vocab = counts.shape
    seen = counts > 0
    bias = torch.zeros(vocab)
    bias[0], bias[vocab - 1] = 0.8, -0.5
    return SimpleNamespace(
        acc_additive_penalties=-(FREQ * counts + PRES * seen.float()),
        acc_scaling_penalties=torch.where(seen, REP, 1.0),
        logit_bias=bias.expand(n, vocab).clone(),
    )


def reference_penalize(logits: torch.Tensor, info: SimpleNamespace) -> torch.Tensor:
    """What SGLang's plain (non-speculative) sampler does to one step's logits ``[N, V]``: its own
    ``SamplingBatchInfo.apply_logits_bias`` (additive penalties, repetition scaling, logit bias)."""
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

    class Info(SimpleNamespace):  # just the fields and methods apply_logits_bias reads
        _apply_pre_grammar_logits_transforms = SamplingBatchInfo._apply_pre_grammar_logits_transforms
        _apply_post_grammar_logits_transforms = SamplingBatchInfo._apply_post_grammar_logits_transforms

    out = logits.float().clone()
    SamplingBatchInfo.apply_logits_bias(
        Info(**vars(info), penalizer_orchestrator=None, grammar_mask=None), out
    )
    return out


def server_penalize(logits: torch.Tensor, chain: torch.Tensor, info: SimpleNamespace) -> torch.Tensor:
    """The server's own function on the verify logits ``[N, K+1, V]``."""
    from sglang_ssd.target.target_logits import processed_logits

    n, width, vocab = logits.shape
    batch = SimpleNamespace(sampling_info=info, has_grammar=False)
    out, _ = processed_logits(batch, logits.reshape(n * width, vocab).clone(), chain, width)
    return out.view(n, width, vocab)


def _start(setup: Setup, n: int):
    ctx = torch.tensor(CTX0).expand(n, 2).clone()
    counts = torch.zeros(n, setup.vocab)
    for t in CTX0:
        counts[:, t] += 1
    return ctx, (committed_penalties(setup, counts) if setup.penalties else None)


def target_probs(setup: Setup, ctx: torch.Tensor, pen) -> torch.Tensor:
    """The target's processed distribution [N, V] after ``ctx`` (the law of plain sampling)."""
    logits = setup.target(ctx)
    if pen is not None:
        logits = reference_penalize(logits, pen)
    mask = setup.mask(ctx)
    return process_logits(
        logits[:, None], setup.sampling(ctx.shape[0]), None if mask is None else mask[:, None]
    )[:, 0]


# ---- the exact law --------------------------------------------------------------------------------


def exact_law(setup: Setup, n: int) -> torch.Tensor:
    """p(y_1..y_n) for all V^n sequences (float64, first token most significant)."""
    vocab = setup.vocab
    ctx, pen = _start(setup, 1)
    law = torch.ones(1, dtype=torch.float64)
    for _ in range(n):
        m = law.numel()
        rows = ctx.expand(m, 2) if ctx.shape[0] == 1 else ctx
        p = target_probs(setup, rows, None if pen is None else _rows(pen, m)).double()
        law = (law[:, None] * p).reshape(-1)
        ctx = push(rows.repeat_interleave(vocab, 0), torch.arange(vocab).repeat(m))
    return law


def _rows(pen: SimpleNamespace, m: int) -> SimpleNamespace:
    return SimpleNamespace(**{k: v[:1].expand(m, -1) for k, v in vars(pen).items()})


def greedy_chain(setup: Setup, n: int) -> list[int]:
    ctx, pen = _start(setup, 1)
    out = []
    for _ in range(n):
        y = target_probs(setup, ctx, pen).argmax(-1)
        out.append(int(y))
        ctx = push(ctx, y)
    return out


def encode(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Sequence [N, n] → its cell index in :func:`exact_law`."""
    code = torch.zeros(tokens.shape[0], dtype=torch.long)
    for j in range(tokens.shape[1]):
        code = code * vocab + tokens[:, j]
    return code


# ---- one round ------------------------------------------------------------------------------------


@dataclass
class Block:
    """``tokens [N, n]``: the round's block completed by plain sampling; ``emitted [N]``: how many of
    them the round emitted; ``full [N]``: the round accepted every draft (its last token is the bonus
    drawn after full acceptance)."""

    tokens: torch.Tensor
    emitted: torch.Tensor
    full: torch.Tensor


def draft_chain(model: TableModel, ctx, setup: Setup, kind: str, gen: torch.Generator, pen=None):
    """K draft tokens from ``ctx``; returns tokens [N, K] and the proposal (None for point masses).
    ``pen``: the draft applies the request's penalties too (that only raises acceptance)."""
    toks, qs = [], []
    n = ctx.shape[0]
    for _ in range(setup.K):
        logits = model(ctx)
        if pen is not None:
            logits = reference_penalize(logits, pen)
        if setup.filters:  # a draft that knows the grammar (its q′ may still hold what top-k/p cut)
            logits = logits.masked_fill(~grammar(ctx, setup.vocab), float("-inf"))
        if kind == "point":
            # A deterministic guesser (fast backup): the draft's argmax or a uniform token, chosen by
            # the drafter's own coin. Its proposal is the point mass on whatever it outputs.
            hit = torch.rand(n, generator=gen) < setup.point_hit
            tok = torch.where(hit, logits.argmax(-1), torch.randint(0, setup.vocab, (n,), generator=gen))
            q = None
        else:
            tok, q = saguaro.saguaro_sample(
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
    tokens = torch.stack(toks, 1)
    if kind == "point":
        return tokens, None
    if kind == "sparse":
        return tokens, SparseProbs(
            torch.stack([q.indices for q in qs], 1), torch.stack([q.probs for q in qs], 1), setup.vocab
        )
    return tokens, torch.stack(qs, 1)


def complete(setup: Setup, ctx, result: ChainVerifyResult, n: int, pen, gen, num_draft=None) -> Block:
    """Extend each row's emitted block to n tokens by plain sampling from the (same-round) target.
    ``num_draft``: the rows' chain lengths when they differ (three levels), else K."""
    emitted = result.num_emitted
    width = result.tokens.shape[1]
    full = result.accept_len == (width - 1 if num_draft is None else num_draft)
    out = torch.full((ctx.shape[0], n), -1, dtype=torch.long)
    out[:, : min(width, n)] = result.tokens[:, :n]
    for j in range(n):
        need = torch.nonzero(emitted <= j).squeeze(1)
        if need.numel():
            sub = None if pen is None else SimpleNamespace(**{k: v[need] for k, v in vars(pen).items()})
            p = target_probs(setup, ctx[need], sub)
            out[need, j] = sample_from_weights(p, torch.rand(need.numel(), generator=gen))
        ctx = push(ctx, out[:, j])
    return Block(out, emitted, full)


def chain_block(setup: Setup, rows: int, verify=None) -> Block:
    """One round: draft K tokens, the target's forward over the K+1 positions, verify, complete."""
    verify = verify or verify_mod.verify_chain
    gen_draft = torch.Generator().manual_seed(1000 + setup.seed)
    gen_verify = torch.Generator().manual_seed(2000 + setup.seed)
    gen_fill = torch.Generator().manual_seed(3000 + setup.seed)
    ctx, pen = _start(setup, rows)
    deterministic = None
    if setup.kind == "mixed":
        # Half the requests hit the speculation cache (sparse Saguaro q′), half fell to the fast backup.
        tok_s, q = draft_chain(setup.draft, ctx, setup, "sparse", gen_draft)
        tok_p, _ = draft_chain(setup.draft, ctx, setup, "point", gen_draft)
        deterministic = torch.rand(rows, generator=gen_draft) < 0.5
        tokens = torch.where(deterministic[:, None], tok_p, tok_s)
    else:
        tokens, q = draft_chain(setup.draft, ctx, setup, setup.kind, gen_draft, pen)
    ctxs = contexts(ctx, tokens)
    logits = torch.stack([setup.target(c) for c in ctxs], 1)
    if pen is not None:
        chain = torch.cat([ctx[:, 1:], tokens], 1)
        logits = server_penalize(logits, chain, pen)
    mask = torch.stack([grammar(c, setup.vocab) for c in ctxs], 1) if setup.filters else None
    result = verify(
        logits,
        tokens,
        q,
        setup.sampling(rows),
        allowed_mask=mask,
        deterministic=deterministic,
        generator=gen_verify,
    )
    return complete(setup, ctx, result, setup.K + 1, pen, gen_fill)


# ---- three levels, algo/cascade.py ----------------------------------------------------------------


def cascade_block(setup: Setup, tau_mid: float, rows: int, backend: str = "auto") -> Block:
    """M0 (draft, K tokens) → M1 (middle, at its own temperature tau_mid) → M2 (target): M2 verifies
    M1's block of J = k+1 ≤ K+1 tokens with M1's distributions as q, so a round emits ≤ K+2 tokens."""
    middle = setup.target.near(3, setup.mid_noise)
    small = middle.near(4, 0.5)
    gen_draft = torch.Generator().manual_seed(4000 + setup.seed)
    gen_mid = torch.Generator().manual_seed(5000 + setup.seed)
    gen_top = torch.Generator().manual_seed(6000 + setup.seed)
    gen_fill = torch.Generator().manual_seed(7000 + setup.seed)
    ctx, _ = _start(setup, rows)
    tokens, q = draft_chain(small, ctx, setup, setup.kind, gen_draft)
    mid_logits = torch.stack([middle(c) for c in contexts(ctx, tokens)], 1)
    r_mid, p_mid = cascade.verify_level(
        mid_logits, tokens, q, SamplingBatch.make(rows, tau_mid), generator=gen_mid, backend=backend
    )
    draft = cascade.cascade_draft(r_mid, p_mid)
    top_ctxs = contexts(ctx, draft.tokens)
    top_logits = torch.stack([setup.target(c) for c in top_ctxs], 1)
    mask = torch.stack([grammar(c, setup.vocab) for c in top_ctxs], 1) if setup.filters else None
    result = cascade.verify_cascade(
        top_logits, draft, setup.sampling(rows), allowed_mask=mask, generator=gen_top, backend=backend
    )
    # Padding past J is not part of the block: keep the emitted tokens only.
    return complete(setup, ctx, result, setup.K + 2, None, gen_fill, draft.num_draft)


# ---- three levels, draft/recursive.py -------------------------------------------------------------

_HEAD = SimpleNamespace(to_head_ids=lambda t: t, head_token_ids=None)  # full vocabulary = head vocabulary


def recursive_block(
    setup: Setup, rows: int, l0: str = "point", m: int = 2, tau1: float | None = None
) -> Block:
    """L0 → L1 → target, L1 verifying L0 with ``recursive.verify_rows`` as the draft server does
    (``l0_neural_draft``'s loop: L0 proposes ≤ m tokens, L1 emits what it accepts and one drawn token,
    until K tokens), then the target verifies L1's K tokens with the q′ rows verify_rows sends upward.

    ``l0``: "point" (greedy n-gram-like guesses) or "sampled" (L0 samples, dense q₀). L1 samples at
    ``tau1`` (default: the request's temperature) with Saguaro C. One batched call per L1 step, but
    the counter uniforms are drawn per row: keep ``rows`` to a few 10⁴.
    """
    vocab, k = setup.vocab, setup.K
    middle = setup.target.near(3, setup.mid_noise)
    small = middle.near(4, 0.5)
    tau1 = setup.temperature if tau1 is None else tau1
    gen_l0 = torch.Generator().manual_seed(8000 + setup.seed)
    gen_top = torch.Generator().manual_seed(9000 + setup.seed)
    gen_fill = torch.Generator().manual_seed(10000 + setup.seed)
    ctx0, _ = _start(setup, rows)
    toks = torch.zeros(rows, k, dtype=torch.long)
    q1 = torch.zeros(rows, k, vocab)
    done = torch.zeros(rows, dtype=torch.long)
    base = 1000  # absolute position of the first drafted token (the counter uniforms are per position)
    while bool((done < k).any()):
        active = torch.nonzero(done < k).squeeze(1)
        ctx = ctx0[active]
        for j in range(k):  # the context after the tokens already drafted
            take = done[active] > j
            ctx = torch.where(take[:, None], push(ctx, toks[active, j]), ctx)
        # L0's proposals (up to m; fewer near the end of the chain) and L1's rows after each prefix.
        props, prop_q, l1 = [], [], []
        c = ctx
        for _ in range(m + 1):
            z = middle(c)
            l1.append(saguaro.saguaro_probs(z, tau1, num_top=setup.num_top if setup.C < 1 else 0, C=setup.C))
            zs = small(c)
            if l0 == "point":
                g = zs.argmax(-1)
                prop_q.append(None)
            else:
                p0 = torch.softmax(zs / 0.8, -1)
                g = torch.multinomial(p0, 1, generator=gen_l0).squeeze(1)
                prop_q.append(p0)
            props.append(g)
            c = push(c, g)
        l1 = torch.stack(l1, 1)  # [A, m+1, V]
        rows_list, prop_list, d0s = [], [], done[active].tolist()
        for a, d0 in enumerate(d0s):
            mr = min(m, k - 1 - d0)
            q0 = None if l0 == "point" else [prop_q[i][a] for i in range(mr)]
            prop_list.append(L0Proposal([int(props[i][a]) for i in range(mr)], q0))
            rows_list.append([l1[a, i : i + 1] for i in range(mr + 1)])
        seeds = [7919 * r + 17 + setup.seed for r in active.tolist()]
        verified = recursive.verify_rows(rows_list, prop_list, _HEAD, seeds, [base + d0 for d0 in d0s])
        for r, d0, (emitted, q_up) in zip(active.tolist(), d0s, verified):
            take = min(len(emitted), k - d0)
            toks[r, d0 : d0 + take] = torch.tensor(emitted[:take])
            q1[r, d0 : d0 + take] = torch.cat(q_up[:take])
            done[r] = d0 + take
    ctxs = contexts(ctx0, toks)
    logits = torch.stack([setup.target(c) for c in ctxs], 1)
    mask = torch.stack([grammar(c, setup.vocab) for c in ctxs], 1) if setup.filters else None
    result = verify_mod.verify_chain(
        logits, toks, q1, setup.sampling(rows), allowed_mask=mask, generator=gen_top
    )
    return complete(setup, ctx0, result, k + 1, None, gen_fill)
