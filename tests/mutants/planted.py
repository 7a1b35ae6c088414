"""Planted bugs: known-wrong rules swapped into the verifier and the draft path by patching module
attributes for the duration of a ``with planted(m):`` block (runtime code carries no test switch).

Each mutant names the whole-block law cases (``tests/algo/_cases.py``) that must reject it. A mutant
is *caught* when one of them rejects the law at the cases' own level (p < 1e-3) while the same case
passes without the bug.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from unittest import mock

import torch

from sglang_ssd.algo import cascade, saguaro, sampling_params
from sglang_ssd.algo import verify as verify_mod
from sglang_ssd.algo.probs import sample_from_weights
from sglang_ssd.algo.sampling_params import GREEDY_EPS, SamplingBatch
from sglang_ssd.draft import recursive
from sglang_ssd.draft.sampler import STREAM_DRAFT
from sglang_ssd.target import target_logits

Patch = tuple[object, str, object]

_chain = verify_mod._chain_torch
_process = sampling_params.process_logits
_sample = saguaro.saguaro_sample
_level = cascade.verify_level
_verify_rows = recursive.verify_rows
_processed = target_logits.processed_logits


@dataclass(frozen=True)
class Mutant:
    name: str
    what: str
    patches: Callable[[], list[Patch]]
    cases: tuple[str, ...]
    fast: bool = False  # also run by `make test` (tests/mutants/test_mutants.py)


@contextmanager
def planted(m: Mutant) -> Iterator[None]:
    with ExitStack() as stack:
        for obj, attr, new in m.patches():
            stack.enter_context(mock.patch.object(obj, attr, new))
        yield


# ---- helpers on the torch rule --------------------------------------------------------------------


def _full(k: torch.Tensor, num: int, num_draft) -> torch.Tensor:
    return k == (num if num_draft is None else num_draft)


def _rebonus(change: Callable) -> list[Patch]:
    """Run the exact rule, then replace the bonus where ``change(p, s, k, full, u, bonus)`` says."""

    def chain(p, draft_tokens, q, deterministic, num_draft, u):
        r = _chain(p, draft_tokens, q, deterministic, num_draft, u)
        num = draft_tokens.shape[1]
        if num == 0:
            return r
        k = r.accept_len
        bonus = change(p, draft_tokens.long(), k, _full(k, num, num_draft), u, r.bonus)
        return verify_mod._emitted(draft_tokens, k, bonus)

    return [(verify_mod, "_chain_torch", chain)]


def _rows(p):
    return torch.arange(p.shape[0], device=p.device)


# ---- the verifier ---------------------------------------------------------------------------------


def bonus_copies_last_draft() -> list[Patch]:
    def change(p, s, k, full, u, bonus):
        last = s.gather(1, (k - 1).clamp_min(0)[:, None]).squeeze(1)
        return torch.where(full & (k > 0), last, bonus)

    return _rebonus(change)


def bonus_from_wrong_position() -> list[Patch]:
    def change(p, s, k, full, u, bonus):
        wrong = sample_from_weights(p[_rows(p), (k - 1).clamp_min(0)].float(), u[:, s.shape[1]])
        return torch.where(full & (k > 0), wrong, bonus)

    return _rebonus(change)


def reject_bonus_from_p() -> list[Patch]:
    def change(p, s, k, full, u, bonus):
        return torch.where(full, bonus, sample_from_weights(p[_rows(p), k].float(), u[:, s.shape[1]]))

    return _rebonus(change)


def bonus_reuses_rejecting_coin() -> list[Patch]:
    def chain(p, draft_tokens, q, deterministic, num_draft, u):
        num = draft_tokens.shape[1]
        r = _chain(p, draft_tokens, q, deterministic, num_draft, u)
        if num == 0:
            return r
        k = r.accept_len
        u2 = u.clone()
        rej = ~_full(k, num, num_draft)
        u2[:, num] = torch.where(rej, u[_rows(p), k.clamp(max=num - 1)], u[:, num])
        return _chain(p, draft_tokens, q, deterministic, num_draft, u2)  # same coins, same k

    return [(verify_mod, "_chain_torch", chain)]


def biased_fast_backup() -> list[Patch]:
    """The reference engine's rule for deterministic tokens at T > 0: accept one only when it is the
    target's argmax, else reject and draw from p without it."""

    def chain(p, draft_tokens, q, deterministic, num_draft, u):
        r = _chain(p, draft_tokens, q, deterministic, num_draft, u)
        point = torch.ones(p.shape[0], dtype=torch.bool) if q is None else deterministic
        num = draft_tokens.shape[1]
        if point is None or num == 0:
            return r
        s = draft_tokens.long()
        k = verify_mod._accept_len(s == p[:, :num].argmax(-1), num_draft)
        rows = _rows(p)
        p_k = p[rows, k].float()
        without = p_k.scatter(-1, s[rows, k.clamp(max=num - 1)][:, None], 0.0)
        w = torch.where(_full(k, num, num_draft)[:, None], p_k, without)
        w = torch.where(w.sum(-1, keepdim=True) > 0, w, p_k)
        biased = verify_mod._emitted(s, k, sample_from_weights(w, u[:, num]))
        return verify_mod._merge(point, biased, r)

    return [(verify_mod, "_chain_torch", chain)]


def deterministic_rows_ignored() -> list[Patch]:
    """A mixed batch loses its fast-backup mask: point-mass rows are verified with whatever q′ the
    batch's tensor holds for them."""

    def chain(p, draft_tokens, q, deterministic, num_draft, u):
        return _chain(p, draft_tokens, q, None, num_draft, u)

    return [(verify_mod, "_chain_torch", chain)]


def temperature_twice() -> list[Patch]:
    def process(logits, sampling, allowed_mask=None):
        t = sampling.temperature.clamp_min(GREEDY_EPS).view(-1, *([1] * (logits.dim() - 1)))
        return _process(logits / t, sampling, allowed_mask)

    return [(verify_mod, "process_logits", process)]


def filters_ignored() -> list[Patch]:
    def process(logits, sampling, allowed_mask=None):
        return _process(logits, SamplingBatch(sampling.temperature), allowed_mask)

    return [(verify_mod, "process_logits", process)]


def sampled_rows_verified_greedily() -> list[Patch]:
    """SGLang's CPU path: sampled requests verified by argmax."""

    def process(logits, sampling, allowed_mask=None):
        return _process(logits, SamplingBatch(torch.zeros_like(sampling.temperature)), allowed_mask)

    return [(verify_mod, "process_logits", process)]


def server_drops_repetition_penalty() -> list[Patch]:
    """The server's verify logits (sglang/target_logits.py) get the additive penalties and the logit
    bias but not the repetition scaling."""

    def processed(batch, logits, chain, width):
        info = batch.sampling_info
        saved, info.acc_scaling_penalties = info.acc_scaling_penalties, None
        try:
            return _processed(batch, logits, chain, width)
        finally:
            info.acc_scaling_penalties = saved

    return [(target_logits, "processed_logits", processed)]


# ---- the draft path -------------------------------------------------------------------------------


def q_instead_of_q_prime() -> list[Patch]:
    """The draft samples from Saguaro's q′ (C < 1) but sends the plain tempered q."""

    def sample(logits, temperature, *, num_top=0, C=1.0, support=None, generator=None):
        tok, _ = _sample(logits, temperature, num_top=num_top, C=C, support=support, generator=generator)
        return tok, saguaro.saguaro_probs(logits, temperature, support=support)

    return [(saguaro, "saguaro_sample", sample)]


def saguaro_top_set_off_by_one() -> list[Patch]:
    """The draft down-weights its top F+1 tokens but sends q′ computed with the top F only."""

    def sample(logits, temperature, *, num_top=0, C=1.0, support=None, generator=None):
        tok, _ = _sample(logits, temperature, num_top=num_top, C=C, support=support, generator=generator)
        q = saguaro.saguaro_probs(logits, temperature, num_top=max(num_top - 1, 0), C=C, support=support)
        return tok, q

    return [(saguaro, "saguaro_sample", sample)]


def _residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    r = (p - q).clamp_min(0.0)
    total = r.sum(-1, keepdim=True)
    return torch.where(total > 0, r / total.clamp_min(1e-30), p)


def cascade_residual_upward() -> list[Patch]:
    """The middle level sends, at its rejection position, the residual it drew from instead of its own
    distribution."""

    def level(logits, draft_tokens, draft_probs, sampling, **kw):
        result, probs = _level(logits, draft_tokens, draft_probs, sampling, **kw)
        num = draft_tokens.shape[1]
        if num == 0:
            return result, probs
        k = result.accept_len
        rows = _rows(probs)
        kk = k.clamp(max=num - 1)
        q = verify_mod.dense_proposal(draft_probs, draft_tokens, probs.shape[-1])
        resid = _residual(probs[rows, kk], q[rows, kk])
        rej = ~_full(k, num, kw.get("num_draft"))
        out = probs.clone()
        out[rows[rej], kk[rej]] = resid[rej]
        return result, out

    return [(cascade, "verify_level", level)]


def _residual_up(rows, prop, emitted, up):
    j = len(emitted) - 1
    if j < len(prop.tokens):  # L0's j-th proposal was rejected; emitted[j] came from the residual
        q1 = recursive._dense(rows[j]).float()
        if prop.probs is None:
            q0 = torch.zeros_like(q1)
            q0[prop.tokens[j]] = 1.0
        else:
            q0 = prop.probs[j].float()
        up = up[:j] + [_residual(q1, q0)[None]]
    return emitted, up


def recursive_residual_upward() -> list[Patch]:
    """The draft server's L1 (draft/recursive.py) sends the residual row upward where it rejected L0."""

    def verify_rows(rows, props, model, seeds, pos0):
        out = _verify_rows(rows, props, model, seeds, pos0)
        return [_residual_up(rb, prop, emitted, up) for rb, prop, (emitted, up) in zip(rows, props, out)]

    return [(recursive, "verify_rows", verify_rows)]


def recursive_coins_are_draws() -> list[Patch]:
    """The draft server's L1 takes its acceptance coins from the draft stream, so the token drawn after
    a rejection reuses the uniform that rejected (a uniform conditioned on u ≥ q₁/q₀)."""
    return [(recursive, "STREAM_L1_COIN", STREAM_DRAFT)]


MUTANTS: list[Mutant] = [
    Mutant("bonus_copies_last_draft",
           "all K drafts accepted: the bonus is a copy of s_K, not a draw from p_{K+1}",
           bonus_copies_last_draft, ("dense-K1-C1-plain-T1", "point-K4-C1-plain-T0.7"), fast=True),
    Mutant("bonus_from_wrong_position",
           "all K drafts accepted: the bonus is drawn from p_K instead of p_{K+1}",
           bonus_from_wrong_position, ("dense-K1-C1-plain-T1", "sparse-K2-C1-plain-T1")),
    Mutant("reject_bonus_from_p",
           "after a rejection the bonus is drawn from p, not from norm(max(p - q', 0))",
           reject_bonus_from_p, ("dense-K2-C1-plain-T1",)),
    Mutant("bonus_reuses_rejecting_coin",
           "after a rejection the bonus draw reuses the uniform that rejected (not a fresh one)",
           bonus_reuses_rejecting_coin, ("dense-K2-C1-plain-T1",)),
    Mutant("q_instead_of_q_prime",
           "the draft samples from Saguaro q' (C = 0.3) but sends the plain q",
           q_instead_of_q_prime, ("dense-K2-C0.3-plain-T0.7", "sparse-K2-C0.3-plain-T0.7"), fast=True),
    Mutant("saguaro_top_set_off_by_one",
           "the draft down-weights its top F+1 tokens (C = 0.3) but sends q' built on the top F",
           saguaro_top_set_off_by_one, ("sparse-K2-C0.3-plain-T0.7", "dense-K4-C0.3-filtered-T0.7")),
    Mutant("cascade_residual_upward",
           "three levels (algo/cascade.py): the middle level sends its residual upward, not its p",
           cascade_residual_upward, ("cascade-dense-K2-C0.3-T1",), fast=True),
    Mutant("recursive_residual_upward",
           "three levels (draft/recursive.py): L1 sends the residual row upward where it rejected L0",
           recursive_residual_upward, ("recursive-pointL0-K2-C0.3-T1-V3", "recursive-pointL0-K4-filtered-T1-V3")),
    Mutant("recursive_coins_are_draws",
           "three levels (draft/recursive.py): L1's acceptance coins are its draw uniforms (same stream)",
           recursive_coins_are_draws, ("recursive-pointL0-K2-C0.3-T1-V3", "recursive-sampledL0-K1-T0.7-V4")),
    Mutant("biased_fast_backup",
           "fast backup: a deterministic token accepted only when it is p's argmax, else p without it",
           biased_fast_backup, ("point-K2-C1-plain-T1", "mixed-K2-C0.3-filtered-T0.7"), fast=True),
    Mutant("deterministic_rows_ignored",
           "mixed batch: the fast-backup rows are verified with the q' the batch holds for them",
           deterministic_rows_ignored, ("mixed-K2-C0.3-filtered-T0.7",)),
    Mutant("temperature_twice",
           "the verifier divides logits already divided by T by T again (p at T^2)",
           temperature_twice, ("dense-K2-C0.3-plain-T0.7",)),
    Mutant("filters_ignored",
           "the verifier's p ignores top-k / top-p / min-p (the draft's filtered-out tokens can pass)",
           filters_ignored, ("dense-K2-C1-filtered-T0.7",)),
    Mutant("server_drops_repetition_penalty",
           "the server's verify logits miss the repetition penalty (additive ones and bias applied)",
           server_drops_repetition_penalty, ("penalties-sparse-K2-C0.3-T1",)),
    Mutant("sampled_rows_verified_greedily",
           "sampled requests verified by argmax (SGLang's CPU path)",
           sampled_rows_verified_greedily, ("dense-K1-C1-plain-T1",)),
]  # fmt: skip
