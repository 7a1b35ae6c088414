"""At T > 0, SSD's output through the server has the target's exact law (statistical test).

The first token of a request is sampled by SGLang's own sampler at prefill; every later token comes
from our verification (accepted draft or bonus). So we test the law of token 2 given token 1, and of
token 3 given tokens 1-2, against the target's exact conditional probabilities (transformers, fp32),
with a chi-square over the most frequent conditioning contexts.
"""

from __future__ import annotations

from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from scipy.stats import chisquare

from tests.e2e.conftest import chat_ids

PROMPT = "Write a short poem about rain."
SAMPLES = 480
MIN_EXPECTED = 5.0


def _sample(server, ids, temperature, n=SAMPLES):
    params = {"temperature": temperature, "max_new_tokens": 3, "ignore_eos": True}
    with ThreadPoolExecutor(32) as pool:
        outs = list(pool.map(lambda _: server.generate(ids, params)["output_ids"], range(n)))
    return [tuple(o) for o in outs]


def _chi_square(observed: Counter, probs: torch.Tensor) -> tuple[float, int, float]:
    """(statistic, dof, total variation) over bins with expected count ≥ 5, the rest lumped."""
    n = sum(observed.values())
    expected = probs * n
    keep = (expected >= MIN_EXPECTED).nonzero().flatten().tolist()
    obs = [observed.get(t, 0) for t in keep]
    exp = [float(expected[t]) for t in keep]
    obs.append(n - sum(obs))
    exp.append(n - sum(exp))
    stat = chisquare(obs, exp).statistic if len(obs) > 1 else 0.0
    tv = 0.5 * sum(abs(o - e) for o, e in zip(obs, exp)) / n
    return float(stat), len(obs) - 1, tv


@pytest.mark.parametrize(
    "server_name,temperature",
    [("ssd_server", 0.7), ("ssd_server", 1.0), ("ssd3_server", 0.7), ("ssd3_server", 1.0), ("ssd_auto_server", 0.7)],
)
def test_ssd_sampling_has_the_target_law(request, server_name, tokenizer, target_path, temperature):
    """Two-level SSD, three-level (L0 → L1 → target, both draft temperatures calibrating live), and
    `--ssd-k auto` (rounds of any K down to SGLang's own sampling step, requests parked between)."""
    n = SAMPLES
    from scipy.stats import chi2
    from transformers import AutoModelForCausalLM

    ids = chat_ids(tokenizer, PROMPT)
    samples = _sample(request.getfixturevalue(server_name), ids, temperature, n)
    model = AutoModelForCausalLM.from_pretrained(str(target_path), dtype=torch.float32).eval()

    def law(context):
        with torch.inference_mode():
            logits = model(torch.tensor([ids + list(context)])).logits[0, -1]
        return torch.softmax(logits / temperature, -1)

    total_stat, total_dof, report = 0.0, 0, []
    for depth in (1, 2):  # token 2 | token 1, token 3 | tokens 1-2
        contexts = Counter(s[:depth] for s in samples)
        for context, count in contexts.most_common(3):
            if count < 40:
                continue
            nxt = Counter(s[depth] for s in samples if s[:depth] == context)
            stat, dof, tv = _chi_square(nxt, law(context))
            total_stat += stat
            total_dof += dof
            report.append(f"depth {depth + 1} | {context}: n={count} chi2={stat:.1f}/{dof} TV={tv:.3f}")
    assert total_dof >= 4, f"too few testable bins: {report}"
    p_value = chi2.sf(total_stat, total_dof)
    print(f"T={temperature}: p={p_value:.3g}; " + "; ".join(report))
    assert p_value > 0.001, report
