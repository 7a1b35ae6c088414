"""Tensor parallel SSD: the source rank's speculation and decisions reach every rank unchanged.

Two real processes in a gloo group (what SGLang's TP group uses on CPU). Rank 0 alone has the stacked
speculation (sparse in one round, dense in the next, with different K as auto-K would choose); each
rank then verifies with a *different* local RNG state, as two processes drawing non-seeded coins
would. Without the outcome broadcast the ranks' decisions diverge (checked, so the test can fail);
with it they are identical, and the proposal arrives bit-identical.
"""

from __future__ import annotations

import json
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sglang_ssd.algo.probs import SparseProbs
from sglang_ssd.algo.sampling_params import SamplingBatch
from sglang_ssd.algo.verify import verify_chain
from sglang_ssd.target.proposals import BatchProposal
from sglang_ssd.target.tp_sync import TPSync

B, V = 6, 40


def source_proposals() -> list[BatchProposal]:
    g = torch.Generator().manual_seed(0)
    out = []
    for k, sparse in ((3, True), (5, False), (1, True)):
        tokens = torch.randint(0, V, (B, k), generator=g)
        num = torch.randint(0, k + 1, (B,), generator=g)
        det = torch.zeros(B, dtype=torch.bool)
        det[0] = True
        if sparse:
            idx = torch.randint(0, V, (B, k, 4), generator=g)
            idx[..., 0] = tokens
            val = torch.rand(B, k, 4, generator=g)
            q = SparseProbs(idx, val / val.sum(-1, keepdim=True), V)
        else:
            q = torch.softmax(torch.randn(B, k, V, generator=g), -1)
        out.append(BatchProposal(tokens, num, q, det))
    return out


def _dense(q):
    return q.to_dense() if isinstance(q, SparseProbs) else q


def _worker(rank: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    sync = TPSync(dist.group.WORLD, src=0, rank_in_group=rank)
    torch.manual_seed(100 + rank)  # different coins on each rank
    logits_gen = torch.Generator().manual_seed(7)
    report = {"rounds": []}
    for prop in source_proposals():
        got, hits = sync.proposal(prop if rank == 0 else None, [1, 0, -1, 1, 1, 0] if rank == 0 else None)
        k = got.tokens.shape[1]
        logits = torch.randn(B, k + 1, V, generator=logits_gen)  # the same on both ranks, like TP logits
        sampling = SamplingBatch(temperature=torch.full((B,), 1.0), top_k=torch.zeros(B, dtype=torch.long),
                                 top_p=torch.ones(B))  # fmt: skip
        local = verify_chain(logits, got.tokens, got.q, sampling, deterministic=got.deterministic,
                             num_draft=got.num_draft, check=False)  # fmt: skip
        synced = sync.outcome(local)
        report["rounds"].append({
            "k": k, "hits": hits, "tokens": got.tokens.tolist(), "num": got.num_draft.tolist(),
            "det": got.deterministic.tolist(), "q": _dense(got.q).flatten().tolist()[:500],
            "q_sum": float(_dense(got.q).double().sum()), "sparse": isinstance(got.q, SparseProbs),
            "local": local.tokens.tolist(), "synced": synced.tokens.tolist(), "accept": synced.accept_len.tolist(),
        })  # fmt: skip
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    dist.destroy_process_group()


def test_source_speculation_and_decisions_reach_every_rank(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    r0, r1 = (json.loads((tmp_path / f"rank{i}.json").read_text())["rounds"] for i in (0, 1))
    src = source_proposals()
    local_differs = False
    for a, b, p in zip(r0, r1, src):
        for key in ("k", "hits", "tokens", "num", "det", "q", "q_sum", "sparse", "synced", "accept"):
            assert a[key] == b[key], key
        assert a["tokens"] == p.tokens.tolist() and a["k"] == p.tokens.shape[1]
        assert a["synced"] == a["local"]  # rank 0's own decisions are what everyone uses
        local_differs |= a["local"] != b["local"]
    assert local_differs, "ranks with different RNG states should decide differently without the broadcast"
