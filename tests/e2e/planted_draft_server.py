"""A draft server with a deliberately wrong rule, for the e2e power check only (never used otherwise).

The planted bug: the draft samples its tokens at temperature HOTTER·T but still reports q′ at T, as
if a draft-temperature multiplier reached the sampler and not the q′ sent to the verifier. With the
target as its own draft, q′ ≈ p, so nearly every drafted token is accepted and the drafted
positions follow the hotter law; the bonus positions stay exact. tests/e2e/test_ssd_sampling.py
must reject this server's output. Runs with the flags of `python -m sglang_ssd.draft_server`.
"""

from __future__ import annotations

import sys

import torch

import sglang_ssd.draft.sampler as sampler
from sglang_ssd.algo.probs import SparseProbs
from sglang_ssd.draft.cli import main

HOTTER = 1.3
_exact = sampler.sample_proposal


def _hotter(q, u):
    if isinstance(q, SparseProbs):
        w = q.probs.float().clamp(min=0) ** (1 / HOTTER)
        return _exact(SparseProbs(q.indices, w / w.sum(-1, keepdim=True), q.vocab_size), u)
    w = q.float().clamp(min=0) ** (1 / HOTTER)
    return _exact(w / w.sum(-1, keepdim=True), u)


# sampler.sample() looks sample_proposal up at call time: tree branches and neural backups both go
# through it (a three-level chain's L1 does not; this server is two-level).
sampler.sample_proposal = _hotter

if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main())
