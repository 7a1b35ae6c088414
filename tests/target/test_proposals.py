"""The chains' verify-tree metadata against the generic tree derivation."""

from __future__ import annotations

import pytest
import torch

from sglang_ssd.cpu import kernels
from sglang_ssd.target.proposals import chain_tree


@pytest.mark.parametrize("bs,d", [(1, 1), (1, 5), (3, 2), (4, 8)])
def test_chain_tree_is_what_the_tree_mask_derivation_gives_for_chains(bs, d):
    seq_lens = torch.randint(1, 500, (bs,), generator=torch.Generator().manual_seed(bs * 10 + d))
    mask = torch.ones(d, d, dtype=torch.bool).tril().repeat(bs, 1, 1).flatten()
    want = [torch.full((bs * d,), -7, dtype=torch.int64) for _ in range(4)]
    kernels.reconstruct_indices_from_tree_mask(mask, seq_lens, *want, bs, d)
    got = chain_tree(seq_lens, d)
    assert got[0].shape == (bs * d,) and all(t.shape == (bs, d) for t in got[1:])
    for g, w in zip(got, want):
        assert g.dtype == torch.int64 and g.flatten().tolist() == w.tolist()
