"""Verification mechanics: greedy rule, chain lengths, reproducibility, per-position draws, the FlashInfer route."""

from __future__ import annotations

import functools

import pytest
import torch

from sglang_ssd.algo import (
    SamplingBatch,
    SparseProbs,
    cascade,
    process_logits,
    verify_chain,
    verify_chain_probs,
)
from sglang_ssd.algo import verify as verify_mod

from ._cases import Case
from ._harness import Setup
from ._stats import chi_square

V = 8


def test_greedy_accepts_while_argmax_and_bonus_is_argmax():
    logits = torch.full((2, 4, 5), -1.0)
    best = torch.tensor([[3, 1, 4, 2], [0, 0, 0, 0]])
    logits.scatter_(-1, best[..., None], 2.0)
    drafts = torch.tensor([[3, 1, 4], [0, 2, 0]])
    r = verify_chain(logits, drafts, None, SamplingBatch.make(2, 0.0))
    assert r.accept_len.tolist() == [3, 1]
    assert r.tokens.tolist() == [[3, 1, 4, 2], [0, 0, -1, -1]]
    assert r.bonus.tolist() == [2, 0] and r.num_emitted.tolist() == [4, 2]


def test_an_all_greedy_batch_matches_its_rows_inside_a_mixed_batch():
    """All-greedy batches skip the sampled rule (no coins drawn): same accept lengths, tokens and
    bonus as the same rows verified next to a sampled row, with and without shorter chains."""
    g = torch.Generator().manual_seed(3)
    B, K = 6, 4
    logits = torch.randn(B, K + 1, V, generator=g)
    drafts = torch.where(torch.rand(B, K, generator=g) < 0.6, logits[:, :K].argmax(-1),
                         torch.randint(0, V, (B, K), generator=g))  # fmt: skip
    q = torch.softmax(torch.randn(B + 1, K, V, generator=g), -1)
    temps = torch.tensor([0.0] * B + [0.8])
    for num in (None, torch.tensor([4, 3, 0, 2, 4, 1])):
        alone = verify_chain(logits, drafts, q[:B], SamplingBatch.make(B, 0.0), num_draft=num)
        mixed = verify_chain(torch.cat([logits, logits[:1]]), torch.cat([drafts, drafts[:1]]), q,
                             SamplingBatch(temperature=temps), num_draft=None if num is None else torch.cat([num, num[:1]]),
                             generator=torch.Generator().manual_seed(4))  # fmt: skip
        assert torch.equal(alone.accept_len, mixed.accept_len[:B]) and torch.equal(alone.tokens, mixed.tokens[:B])
        assert torch.equal(alone.bonus, mixed.bonus[:B]) and alone.accept_len.sum() > 0
        # the probabilities entry point (used by the cascade) takes the same short path
        greedy = SamplingBatch.make(B, 0.0)
        probs = verify_chain_probs(process_logits(logits, greedy), drafts, q[:B], greedy=greedy.greedy, num_draft=num)
        assert torch.equal(probs.tokens, alone.tokens) and torch.equal(probs.accept_len, alone.accept_len)


def test_forced_coins_accept_everything_the_target_allows():
    """u = 0 accepts every token with p > 0; a token the grammar forbids is rejected and never emitted."""
    B, K = 3, 3
    logits = torch.randn(B, K + 1, V, generator=torch.Generator().manual_seed(0))
    drafts = torch.tensor([[1, 2, 3], [4, 5, 6], [7, 0, 1]])
    mask = torch.ones(B, K + 1, V, dtype=torch.bool)
    mask[1, 1, 5] = False  # s_2 of request 1 is not allowed there
    r = verify_chain(
        logits, drafts, None, SamplingBatch.make(B, 1.0), allowed_mask=mask, uniforms=torch.zeros(B, K + 1)
    )
    assert r.accept_len.tolist() == [3, 1, 3]
    assert int(r.tokens[1, 1]) != 5


def test_num_draft_shortens_chains_and_bonus_comes_from_p():
    B, K = 60_000, 3
    logits = torch.randn(1, K + 1, V, generator=torch.Generator().manual_seed(1)).expand(B, -1, -1)
    drafts = torch.zeros(B, K, dtype=torch.long)
    num = torch.zeros(B, dtype=torch.long)  # nothing drafted: the "bonus" is a plain sample from p_1
    sampling = SamplingBatch.make(B, 1.0)
    r = verify_chain(
        logits, drafts, None, sampling, num_draft=num, generator=torch.Generator().manual_seed(2)
    )
    assert bool((r.accept_len == 0).all())
    fit = chi_square(r.bonus, torch.softmax(logits[0, 0], -1))
    assert fit.pvalue > 0.01, fit


def test_per_request_generators_make_requests_reproducible_across_batches():
    B, K = 8, 4
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(B, K + 1, V, generator=g)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    drafts = torch.multinomial(q.view(-1, V), 1, generator=g).view(B, K)
    sampling = SamplingBatch.make(B, 0.9)

    def gens(ids):
        return [torch.Generator().manual_seed(100 + i) for i in ids]

    whole = verify_chain(logits, drafts, q, sampling, generator=gens(range(B)))
    again = verify_chain(logits, drafts, q, sampling, generator=gens(range(B)))
    assert torch.equal(whole.tokens, again.tokens)
    for i in (0, 5):  # request i alone, or in another batch, draws the very same coins
        alone = verify_chain(
            logits[i : i + 1],
            drafts[i : i + 1],
            q[i : i + 1],
            sampling.select(slice(i, i + 1)),
            generator=gens([i]),
        )
        assert torch.equal(alone.tokens[0], whole.tokens[i])
    other = verify_chain(logits, drafts, q, sampling, generator=gens(range(50, 50 + B)))
    assert not torch.equal(other.tokens, whole.tokens)


def test_per_position_draws_keep_k_and_draw_at_the_emitted_position():
    """cascade.verify_level_probs with ``draws``: the coins alone set k, and the token emitted after k
    acceptances is drawn with draws[:, k] (the draft server's per-position uniforms)."""
    g = torch.Generator().manual_seed(3)
    B, K = 64, 3
    p = torch.softmax(torch.randn(B, K + 1, V, generator=g), -1)
    q = torch.softmax(torch.randn(B, K, V, generator=g), -1)
    drafts = torch.multinomial(q.reshape(-1, V), 1, generator=g).reshape(B, K)
    coins, draws = torch.rand(B, K + 1, generator=g), torch.rand(B, K + 1, generator=g)
    num_draft = torch.randint(0, K + 1, (B,), generator=g)
    r = cascade.verify_level_probs(p, drafts, q, num_draft=num_draft, uniforms=coins, draws=draws)
    for b in range(B):
        u = torch.cat([coins[b, :K], draws[b, r.accept_len[b]].view(1)])[None]
        one = verify_chain_probs(p[b : b + 1], drafts[b : b + 1], q[b : b + 1], num_draft=num_draft[b : b + 1],
                                 uniforms=u)  # fmt: skip
        assert torch.equal(one.tokens[0], r.tokens[b])
    assert 0 < int((r.accept_len < num_draft).sum()) < B  # both a rejection and a full acceptance
    with pytest.raises(ValueError):
        cascade.verify_level_probs(p, drafts, q, draws=draws)


def test_deterministic_rows_need_no_support_in_draft_probs():
    """A fast-backup row's tokens are point masses whatever the q′ slot holds (e.g. zeros)."""
    B, K = 2, 2
    logits = torch.randn(B, K + 1, V)
    q = torch.zeros(B, K, V)
    q[0] = 1.0 / V
    drafts = torch.tensor([[1, 2], [3, 4]])
    r = verify_chain(logits, drafts, q, SamplingBatch.make(B, 1.0), deterministic=torch.tensor([False, True]))
    assert r.tokens.shape == (B, K + 1)


# ---- FlashInfer route ------------------------------------------------------------------------------


def fake_chain_speculative_sampling(
    draft_probs,
    draft_token_ids,
    target_probs,
    maybe_output_accepted_token_num=None,
    maybe_output_emitted_draft_token_num=None,
    deterministic=True,
    generator=None,
    seed=None,
    offset=None,
):
    """FlashInfer's documented contract in plain torch: int32 [B, n+1] output, −1 after the emitted
    tokens, emitted draft count written to maybe_output_emitted_draft_token_num."""
    batch, n, vocab = draft_probs.shape
    s = draft_token_ids.long()
    u = torch.rand(batch, n, generator=generator)
    q_s = draft_probs.gather(-1, s[..., None])[..., 0]
    p_s = target_probs[:, :n].gather(-1, s[..., None])[..., 0]
    k = (u * q_s < p_s).long().cumprod(1).sum(1)
    rows = torch.arange(batch)
    q_pad = torch.cat([draft_probs, torch.zeros(batch, 1, vocab)], 1)
    weights = (target_probs[rows, k] - q_pad[rows, k]).clamp_min(0)
    weights = torch.where((k == n)[:, None], target_probs[rows, k], weights)
    bonus = torch.multinomial(weights, 1, generator=generator)[:, 0]
    out = torch.cat([s, torch.full((batch, 1), -1)], 1)
    pos = torch.arange(n + 1)
    out = torch.where(pos == k[:, None], bonus[:, None], out)
    out = torch.where(pos > k[:, None], -1, out)
    maybe_output_emitted_draft_token_num.copy_(k.int())
    return out.int()


@pytest.mark.parametrize("kind", ["dense", "sparse", "point", "mixed"])
def test_flashinfer_route_glue_has_target_law(kind, monkeypatch):
    """The conversion to the kernel's dense inputs (sparse q′, point masses, mixed rows) and the reading
    of its outputs, checked with a stand-in kernel of the same contract (whole block, K = 2)."""
    monkeypatch.setattr(verify_mod, "_flashinfer_kernel", lambda: fake_chain_speculative_sampling)
    setup = Setup(kind=kind, temperature=1.0, C=0.3, filters=kind == "mixed", seed=21)
    result = Case(f"flashinfer glue {kind}", setup).evaluate(
        verify=functools.partial(verify_chain, backend="flashinfer")
    )
    print(result)
    result.check()


def test_flashinfer_route_glue_shorter_chains_have_target_law(monkeypatch):
    """Multi-level verification (variable chain length J = k+1) through the kernel route."""
    monkeypatch.setattr(verify_mod, "_flashinfer_kernel", lambda: fake_chain_speculative_sampling)
    setup = Setup(kind="sparse", temperature=1.0, C=0.3, seed=23)
    result = Case("flashinfer glue cascade", setup, "cascade", backend="flashinfer").evaluate()
    print(result)
    result.check()


@pytest.mark.skipif(
    not torch.cuda.is_available() or verify_mod._flashinfer_kernel() is None,
    reason="needs CUDA and flashinfer",
)
@pytest.mark.parametrize("kind", ["dense", "sparse", "point"])
def test_flashinfer_kernel_matches_target_law_on_gpu(kind):
    B, K, Vg = 200_000, 4, 16
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(1, K + 1, Vg, device="cuda").expand(B, -1, -1)
    draft_logits = torch.randn(B * K, Vg, device="cuda", generator=g)
    from sglang_ssd.algo import saguaro_sample

    tokens, q = saguaro_sample(
        draft_logits, 1.0, num_top=3, C=0.3, support=6 if kind == "sparse" else None, generator=g
    )
    tokens = tokens.view(B, K)
    q = q.reshape(B, K) if isinstance(q, SparseProbs) else q.view(B, K, Vg)
    if kind == "point":
        q = None
    r = verify_chain(
        logits, tokens, q, SamplingBatch.make(B, 1.0, device="cuda"), generator=g, backend="flashinfer"
    )
    fit = chi_square(r.tokens[:, 0].cpu(), torch.softmax(logits[0, 0].float().cpu(), -1))
    assert fit.pvalue > 0.01, fit
    ref = verify_chain_probs(torch.softmax(logits.float(), -1), tokens, q, backend="torch", generator=g)
    assert abs(float(r.accept_len.float().mean() - ref.accept_len.float().mean())) < 0.02
