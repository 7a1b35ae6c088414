"""The fast subset of the planted-bug controls, run by `make test`; `make mutants` runs them all.

Each planted bug must make the whole-block law test of its first named case reject (p < 1e-3) on the
same seeds on which tests/algo/test_verify_exact.py passes without the bug.
"""

from __future__ import annotations

import pytest

from sglang_ssd.algo import cascade, saguaro
from sglang_ssd.algo import verify as verify_mod
from sglang_ssd.draft import recursive
from sglang_ssd.target import target_logits
from tests.algo._cases import ALL_CASES, CASES

from .planted import MUTANTS, planted


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.fast], ids=lambda m: m.name)
def test_planted_bug_is_caught(mutant):
    assert mutant.cases[0] in CASES  # its clean run is part of make test
    with planted(mutant):
        result = ALL_CASES[mutant.cases[0]].evaluate()
    print(f"{mutant.name}: {result}")
    assert result.rejected, f"planted bug survived: {mutant.name} ({mutant.what}): {result}"


def test_every_mutant_names_known_cases_and_patches_something():
    assert len({m.name for m in MUTANTS}) == len(MUTANTS) >= 8
    for m in MUTANTS:
        assert m.cases and all(c in ALL_CASES for c in m.cases), m.name
        assert m.patches(), m.name


def test_planting_is_undone():
    watched = [(verify_mod, "_chain_torch"), (verify_mod, "process_logits"), (saguaro, "saguaro_sample"),
               (cascade, "verify_level"), (recursive, "verify_rows"), (recursive, "STREAM_L1_COIN"),
               (target_logits, "processed_logits")]  # fmt: skip
    before = [getattr(o, a) for o, a in watched]
    for m in MUTANTS:
        with planted(m):
            assert any(getattr(o, a) is not b for (o, a), b in zip(watched, before)), m.name
    assert [getattr(o, a) for o, a in watched] == before
