"""Recursive drafting L0 → L1 (docs/ALGORITHM.md §9): what the draft model emits keeps exactly its own law.

- greedy: L0-proposed, L1-verified drafts are token-identical to plain L1 decoding (tree branches and
  backups), with identical q′;
- T > 0: every q′ row sent upward is L1's processed distribution on the branch's real context
  (teacher-forced re-decoding), and the drafted tokens follow that law (chi-square over many seeds, for
  a greedy and a sampling L0, on the backup chain and on tree branches).
"""

from __future__ import annotations

import random

import pytest
import torch

from sglang_ssd.algo.probs import SparseProbs
from sglang_ssd.draft.engine import DraftEngine, EngineConfig
from sglang_ssd.draft.l0 import L0Level
from sglang_ssd.draft.model import DraftModel, Span
from sglang_ssd.draft.ngram import NgramDraft
from sglang_ssd.draft.request import Stage
from sglang_ssd.draft.sampler import proposal
from sglang_ssd.draft.tree import num_top, q_to_full
from sglang_ssd.tools.random_model import write_random_model
from sglang_ssd.wire.messages import DraftParams, OutcomeMsg
from tests.algo._stats import chi_square
from tests.draft.test_exactness import PARAMS, Q_ATOL, check_tree, reference_draft


def _dense(q, vocab):
    return q.to_dense() if isinstance(q, SparseProbs) else q


def fitted_l0(model: DraftModel, seed: int, tokens: int = 3, temperature=0.0, n_seq: int = 40) -> L0Level:
    """An n-gram L0 fitted on the draft's own greedy text plus noise, so that it is right sometimes."""
    rng = random.Random(seed)
    vocab = model.vocab_size
    seqs = []
    for _ in range(n_seq):
        ctx = [rng.randrange(vocab) for _ in range(4)]
        toks, _ = reference_draft(model, ctx, 12, proposal_params(0.0), 0, [], 1.0)
        seqs.append(ctx + [t if rng.random() < 0.7 else rng.randrange(vocab) for t in toks])
    return L0Level(NgramDraft(order=3, vocab_size=vocab).fit(seqs), tokens=tokens, temperature=temperature)


def proposal_params(t: float):
    from sglang_ssd.draft.sampler import RowParams

    return RowParams(temperature=t, support=1 if t == 0 else None)


def forced_q(model: DraftModel, context: list[int], tokens: list[int], params, plan, c: float) -> torch.Tensor:
    """Teacher-forced L1 q′ rows ``[K, V]`` for ``tokens`` after ``context``."""
    seq = context + tokens
    start, length = model.pool.alloc(len(seq) + 1)
    try:
        pos = torch.arange(len(seq) - 1)
        logits = model.forward([Span(start, torch.tensor(seq[:-1]), pos, pos, len(seq) - 1,
                                     out_rows=torch.arange(len(context) - 1, len(seq) - 1))])[0]  # fmt: skip
        rows = [proposal(logits[s : s + 1], params, num_top(plan, s, c)) for s in range(len(tokens))]
        return torch.cat([_dense(q_to_full(r, model), model.vocab_size) for r in rows])
    finally:
        model.pool.release(start, length)


def run(engine: DraftEngine, rng: random.Random, n_requests: int, rounds: int, params_list, exact_tokens: bool) -> dict:
    model, vocab, k = engine.model, engine.model.vocab_size, engine.k
    specs, checked = {}, {"branches": 0, "hits": 0, "backups": 0}
    for i in range(n_requests):
        prompt = [rng.randrange(vocab) for _ in range(rng.randrange(3, 30))]
        specs[f"r{i}"] = engine.open(f"r{i}", prompt, rng.randrange(vocab), params_list[i % len(params_list)])
    for _ in range(rounds):
        while engine.has_work():
            engine.work_step()
        outcomes = []
        for rid, spec in specs.items():
            req = engine.requests[rid]
            t = req.tree
            if exact_tokens:
                checked["branches"] += check_tree(engine, req)
            else:
                assert req.stage is Stage.READY
                for b in range(t.num_branches):
                    kk = int(t.fork_k[b])
                    ctx = req.tokens + req.spec[:kk] + [int(t.fork_tok[b])]
                    toks, q = engine.cached(req, b)
                    ref = forced_q(model, ctx, toks.tolist(), req.params, t.sample_plan, engine.cfg.saguaro_c)
                    torch.testing.assert_close(_dense(q, vocab), ref, atol=Q_ATOL, rtol=0)
                    checked["branches"] += 1
            acc = rng.randrange(len(spec.tokens) + 1)
            cached = [int(t.fork_tok[b]) for b in range(t.num_branches) if int(t.fork_k[b]) == acc]
            bonus = rng.choice(cached) if cached and rng.random() < 0.6 else rng.randrange(vocab)
            outcomes.append(OutcomeMsg(rid=rid, accepted=acc, bonus=bonus, spec_id=spec.spec_id))
        for o, spec in zip(outcomes, engine.round(outcomes)):
            assert spec.error is None
            req = engine.requests[o.rid]
            checked["hits"] += spec.hit
            if not spec.hit:
                plan = engine.planner.plan(after_miss=True)
                if exact_tokens:
                    ref_toks, ref_q = reference_draft(model, req.tokens, k, req.params, req.seed, plan,
                                                      engine.cfg.saguaro_c)  # fmt: skip
                    assert spec.tokens.tolist() == ref_toks
                else:
                    ref_q = forced_q(model, req.tokens, spec.tokens.tolist(), req.spec_params, plan,
                                     engine.cfg.saguaro_c)  # fmt: skip
                torch.testing.assert_close(_dense(spec.q, vocab), ref_q, atol=Q_ATOL, rtol=0)
                checked["backups"] += 1
            specs[o.rid] = spec
    return checked


@pytest.mark.parametrize("fanout,c", [([3, 2, 2, 1, 2], 1.0), ([2, 1, 1, 1, 1], 0.4)])
def test_greedy_recursive_equals_plain_decoding(tiny_llama, fanout, c):
    model = DraftModel(tiny_llama, kv_slots=8192)
    l0 = fitted_l0(model, 1)
    engine = DraftEngine(model, EngineConfig(k=4, fanout_list=fanout, saguaro_c=c, backup="neural"), l0=l0)
    checked = run(engine, random.Random(7), 4, 3, [DraftParams(temperature=0.0)], exact_tokens=True)
    assert checked["branches"] >= 4 * 3 * 5 and checked["hits"] > 0 and checked["backups"] > 0
    s = engine.stats.counters
    # L0 was used and L1 accepted some of its tokens (one forward then drafts several).
    assert s["l0_proposed"] > 0 and 0 < s["l0_accepted"] < s["l0_proposed"]
    assert s["l1_steps"] < checked["branches"] * 4


@pytest.mark.parametrize("l0_temperature", [0.0, 0.8, "auto"])
def test_sampled_recursive_sends_l1_distributions(tiny_llama, l0_temperature):
    model = DraftModel(tiny_llama, kv_slots=8192)
    l0 = fitted_l0(model, 2, temperature=l0_temperature)
    l0.calib_rows = 40
    engine = DraftEngine(model, EngineConfig(k=4, fanout_list=[2, 1, 1, 1, 1], saguaro_c=0.5, backup="neural"), l0=l0)
    checked = run(engine, random.Random(8), 4, 3, PARAMS, exact_tokens=False)
    assert checked["branches"] > 0 and checked["backups"] > 0
    if l0_temperature == "auto":
        assert l0.rows_seen >= 40 and l0.tau in l0.grid and set(l0.measured()) == {f"{t:g}" for t in l0.grid}


@pytest.mark.parametrize("with_l0", [False, True])
def test_draft_temperature_calibration_stays_exact(tiny_llama, with_l0):
    """τ₁ = m·T changes between speculations while calibrating; every q′ is still what was sampled."""
    model = DraftModel(tiny_llama, kv_slots=8192)
    l0 = fitted_l0(model, 4, temperature=0.5) if with_l0 else None
    engine = DraftEngine(model, EngineConfig(k=3, fanout_list=[2, 1, 1, 1], backup="neural", draft_temperature="auto"),
                         l0=l0)  # fmt: skip
    engine.tau1.rounds_per_arm = 2
    checked = run(engine, random.Random(9), 4, 4, PARAMS[1:], exact_tokens=False)
    assert checked["branches"] > 0
    cal = engine.tau1
    assert sum(cal.verdicts.values()) >= 8 and min(cal.verdicts.values()) >= 1
    temps = {r.params.temperature for r in engine.requests.values() if r.draft_params.draft_temperature is None}
    assert temps and all(t > 0 for t in temps)


def test_temperature_calibrator_picks_the_best_measured():
    from sglang_ssd.draft.level_temps import TemperatureCalibrator

    cal = TemperatureCalibrator(grid=(0.5, 1.0), rounds_per_arm=3)
    seen = set()
    while cal.calibrating:
        m = cal.choose()
        seen.add(m)
        cal.observe(m, 3 if m == 0.5 else 1, 4)
    assert seen == {0.5, 1.0} and cal.best() == 0.5 and cal.choose() == 0.5
    assert cal.snapshot()["tau1_alpha_x0.5"] == 0.75
    fixed = TemperatureCalibrator(multiplier=0.8)
    assert not fixed.calibrating and fixed.choose() == 0.8
    with pytest.raises(ValueError):
        TemperatureCalibrator(multiplier=0.0)


def test_reduced_head_recursive(tiny_reduced):
    """L0 may propose tokens the draft's reduced head cannot produce: they are simply rejected."""
    model = DraftModel(tiny_reduced, kv_slots=4096)
    l0 = L0Level(NgramDraft(order=2, vocab_size=256).fit([list(range(256)) * 2]), tokens=2, temperature=0.0)
    engine = DraftEngine(model, EngineConfig(k=3, fanout_list=[2, 2, 1, 2], backup="neural"), l0=l0)
    checked = run(engine, random.Random(5), 3, 2, [DraftParams(temperature=0.0)], exact_tokens=True)
    assert checked["branches"] > 0
    allowed = set(model.head_token_ids.tolist())
    assert all(set(r.spec) <= allowed for r in engine.requests.values())


# ---- statistical: the drafted tokens follow L1's law ---------------------------------------------------------
V_SMALL = 8


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    folder = write_random_model(tmp_path_factory.mktemp("v8"), vocab_size=V_SMALL, hidden_size=32,
                                intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, seed=5)  # fmt: skip
    return folder


def joint_law(model: DraftModel, context: list[int], params) -> torch.Tensor:
    """Exact P(x1, x2 | context) of two plain draft steps, flattened [V·V]."""
    v = model.vocab_size
    p1 = forced_q(model, context, [0], params, [], 1.0)[0]
    law = torch.zeros(v, v, dtype=torch.float64)
    for x1 in range(v):
        p2 = forced_q(model, context, [x1, 0], params, [], 1.0)[1]
        law[x1] = p1[x1].double() * p2.double()
    return law.flatten()


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("l0_temperature", [0.0, 1.0])
@pytest.mark.parametrize("path", ["backup", "tree"])
def test_recursive_draft_has_l1_law(small_model, temperature, l0_temperature, path):
    model = DraftModel(small_model, kv_slots=1 << 15)
    # A deliberately poor L0 (uniform-ish table) so that rejections and residual draws happen often.
    rng = random.Random(3)
    l0 = L0Level(NgramDraft(order=2, vocab_size=V_SMALL).fit([[rng.randrange(V_SMALL) for _ in range(400)]]),
                 tokens=2, temperature=l0_temperature)  # fmt: skip
    engine = DraftEngine(model, EngineConfig(k=2, fanout_list=[1, 1, 1], backup="neural"), l0=l0)
    prompt, first = [1, 5, 2, 7, 3], 4
    params = proposal_params(temperature)
    n = 3000
    samples = []
    if path == "backup":
        context = prompt + [first]
        for i in range(n):
            spec = engine.open(f"r{i % 50}", prompt, first, DraftParams(temperature=temperature, seed=10_000 + i))
            samples.append(spec.tokens[0] * V_SMALL + spec.tokens[1])
    else:
        # Fix the speculation so every request's tree has the same branch contexts; study branch k = 0.
        spec_fixed = [6, 0]
        for i in range(0, n, 100):
            rids = [f"t{j}" for j in range(100)]
            for j, rid in enumerate(rids):
                engine.open(rid, prompt, first, DraftParams(temperature=temperature, seed=20_000 + i + j))
                req = engine.requests[rid]
                req.spec = list(spec_fixed)
                req.stage, req.tree = Stage.GLUE, None
            while engine.has_work():
                engine.work_step()
            for rid in rids:
                req = engine.requests[rid]
                b = int((req.tree.fork_k == 0).nonzero()[0, 0])
                toks, _ = engine.cached(req, b)
                samples.append(toks[0] * V_SMALL + toks[1])
            engine.close(rids)
        context = prompt + [first] + [int(engine_fork0(model, prompt + [first], spec_fixed[0]))]
    fit = chi_square(torch.tensor(samples), joint_law(model, context, params))
    assert fit.pvalue > 1e-3, f"{path} T={temperature} τ0={l0_temperature}: {fit}"
    assert fit.tv < 0.06, str(fit)
    assert engine.stats.counters["l0_accepted"] > 0


def engine_fork0(model: DraftModel, context: list[int], excluded: int) -> int:
    """The k = 0 fork with F = 1: the draft's argmax after ``context`` other than ``excluded``."""
    q = forced_q(model, context, [0], proposal_params(1.0), [], 1.0)[0]
    order = torch.argsort(q, descending=True).tolist()
    return next(t for t in order if t != excluded)
