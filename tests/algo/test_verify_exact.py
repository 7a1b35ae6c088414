"""One speculative round emits a block with the target's law, for every proposal kind
(docs/ALGORITHM.md §3, §10): the accepted drafts and the bonus, the bonus after full acceptance included.

Each case (``_cases.py``) runs 10⁴–2·10⁵ independent requests as one batch over V = 3–5 tokens, for
dense, sparse and point-mass proposals and a mixed batch, Saguaro C ∈ {1, 0.3}, filters (top-k, top-p,
min-p, grammar mask) on and off, K ∈ {1, 2, 4}, T ∈ {0, 0.7, 1}, two and three levels (algo/cascade.py
and the draft server's draft/recursive.py), and penalties with logit bias as the server applies them.
A round's block, completed to K+1 (three levels: K+2) tokens by plain sampling from the target, is
compared with the exact law of K+1 tokens of plain sampling (chi-square, false alarm 1e-3 per case;
each case also asserts its power: ≥ 0.9 against any TV bias ≥ 0.03, 0.04 for the draft server's
recursive level, and that ≥ 1 % of its rows accepted every draft). T = 0 must be token-identical to
greedy decoding. That these checks can fail is shown by the planted bugs in tests/mutants.

Penalties: SGLang's speculative rule, which the server follows (sglang_ssd/target/target_logits.py):
the penalties accumulated over the committed context, and the logit bias, are added to every position
of the chain. The penalty cases build the verify logits with that very function and compare with plain
sampling under the committed context's penalties held for the whole round. That is the guarantee: a
round is exact for the penalties it starts with; a later round starts from the updated ones.
"""

from __future__ import annotations

import pytest

from ._cases import CASES


@pytest.mark.parametrize("name", list(CASES))
def test_round_emits_the_target_law(name):
    result = CASES[name].evaluate()
    print(result)
    result.check()
