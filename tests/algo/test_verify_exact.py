"""The emitted tokens have the target's law, for every proposal kind (paper §3; ALGORITHM.md §10).

Each case simulates 10⁵ independent requests as one batch with a small fixed target over V = 8 tokens,
and compares the first emitted token and the first two emitted tokens with the target's exact law
(chi-square p > 0.01; TV reported). Temperature 0 must be token-identical to greedy decoding.
"""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.algo.verify import ChainVerifyResult, verify_chain

from ._harness import Setup, V, cascade_first_two, exact_law, first_two
from ._stats import chi_square

P_MIN = 0.01


def check_law(y1, y2, setup: Setup, label: str) -> None:
    p1, p12 = exact_law(setup)
    if setup.temperature == 0:
        # Greedy: every request emits the greedy continuation.
        g1 = int(p1.argmax())
        g2 = int(p12[g1].argmax())
        assert bool((y1 == g1).all()) and bool((y2 == g2).all()), label
        return
    fit1 = chi_square(y1, p1)
    fit2 = chi_square(y1 * V + y2, p12)
    print(f"{label}: first token {fit1}; first two {fit2}")
    assert fit1.pvalue > P_MIN, f"{label}: first token {fit1}"
    assert fit2.pvalue > P_MIN, f"{label}: first two tokens {fit2}"


TEMPS = [0.0, 0.7, 1.0]


@pytest.mark.parametrize("filters", [False, True], ids=["plain", "filtered"])
@pytest.mark.parametrize("C", [1.0, 0.3], ids=["C1", "C0.3"])
@pytest.mark.parametrize("temperature", TEMPS, ids=[f"T{t}" for t in TEMPS])
@pytest.mark.parametrize("kind", ["dense", "sparse"])
def test_sampled_proposal_has_target_law(kind, temperature, C, filters):
    setup = Setup(
        kind=kind,
        temperature=temperature,
        C=C,
        filters=filters,
        seed={"dense": 10, "sparse": 20}[kind] + int(C * 10),
    )
    y1, y2 = first_two(setup)
    check_law(y1, y2, setup, f"{kind} T={temperature} C={C} filters={filters}")


@pytest.mark.parametrize("filters", [False, True], ids=["plain", "filtered"])
@pytest.mark.parametrize("temperature", TEMPS, ids=[f"T{t}" for t in TEMPS])
def test_point_mass_proposal_has_target_law(temperature, filters):
    setup = Setup(kind="point", temperature=temperature, filters=filters, seed=7)
    y1, y2 = first_two(setup)
    check_law(y1, y2, setup, f"point T={temperature} filters={filters}")


@pytest.mark.parametrize("temperature", TEMPS, ids=[f"T{t}" for t in TEMPS])
def test_mixed_batch_hits_and_fast_backup_has_target_law(temperature):
    """One batch, half the rows with a cached sparse q', half with fast-backup point masses."""
    setup = Setup(kind="mixed", temperature=temperature, C=0.3, filters=True, seed=11)
    y1, y2 = first_two(setup)
    check_law(y1, y2, setup, f"mixed T={temperature}")


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["T0", "T1"])
def test_penalized_target_has_target_law(temperature):
    """Penalties against each position's own history (output so far + the draft prefix)."""
    setup = Setup(kind="sparse", temperature=temperature, C=0.3, penalties=True, seed=13)
    y1, y2 = first_two(setup)
    check_law(y1, y2, setup, f"penalties T={temperature}")


@pytest.mark.parametrize("filters", [False, True], ids=["plain", "filtered"])
@pytest.mark.parametrize("temperature", TEMPS, ids=[f"T{t}" for t in TEMPS])
def test_multi_level_has_target_law(temperature, filters):
    """M0 → M1 → M2 with M1 at its own temperature: M2's output has M2's law (ALGORITHM.md §9)."""
    setup = Setup(kind="dense", temperature=temperature, C=0.3, filters=filters, K=3, seed=17)
    tau_mid = 0.0 if temperature == 0 else 1.2 * temperature
    y1, y2 = cascade_first_two(setup, tau_mid)
    check_law(y1, y2, setup, f"cascade T={temperature} tau_mid={tau_mid} filters={filters}")


# ---- the check can fail ------------------------------------------------------------------------


def verify_biased(
    target_logits,
    draft_tokens,
    draft_probs,
    sampling,
    *,
    allowed_mask=None,
    deterministic=None,
    generator=None,
) -> ChainVerifyResult:
    """The reference engine's fast-backup rule: at T > 0 accept a deterministic token only when it is
    the target's argmax (then always), else reject and draw from p without that token."""
    from sglang_ssd.algo.sampling_params import process_logits

    p = process_logits(target_logits, sampling, allowed_mask)
    batch, positions, _ = p.shape
    s = draft_tokens.long()
    accept = s == p[:, :-1].argmax(-1)
    k = accept.long().cumprod(1).sum(1)
    rows = torch.arange(batch)
    p_k = p[rows, k]
    kk = k.clamp(max=positions - 2)
    resid = p_k.scatter(-1, s[rows, kk][:, None], 0.0)
    weights = torch.where((k == positions - 1)[:, None], p_k, resid)
    bonus = torch.multinomial(weights, 1, generator=generator).squeeze(1)
    tokens = torch.cat([s, torch.full((batch, 1), -1)], 1)
    pos = torch.arange(positions)
    tokens = torch.where(pos == k[:, None], bonus[:, None], tokens)
    tokens = torch.where(pos > k[:, None], -1, tokens)
    return ChainVerifyResult(k, tokens, bonus)


def test_biased_argmax_rule_is_caught():
    setup = Setup(kind="point", temperature=1.0, seed=7)
    p1, p12 = exact_law(setup)
    y1, y2 = first_two(setup, verify=verify_biased)
    fit1 = chi_square(y1, p1)
    fit2 = chi_square(y1 * V + y2, p12)
    print(f"biased rule: first token {fit1}; first two {fit2}")
    assert fit1.pvalue < 1e-6 and fit2.pvalue < 1e-6
    # ... while the exact rule passes on the very same drafts.
    y1, y2 = first_two(setup, verify=verify_chain)
    assert chi_square(y1, p1).pvalue > P_MIN


def test_greedy_verification_of_sampled_request_is_caught():
    """SGLang's CPU path verifies sampled requests greedily; the same check rejects that too."""
    setup = Setup(kind="dense", temperature=1.0, seed=3)
    p1, _ = exact_law(setup)

    def greedy_verify(logits, tokens, q, sampling, **kw):
        from sglang_ssd.algo import SamplingBatch

        return verify_chain(logits, tokens, q, SamplingBatch.make(logits.shape[0], 0.0), **kw)

    y1, _ = first_two(setup, verify=greedy_verify)
    assert chi_square(y1, p1).pvalue < 1e-6
