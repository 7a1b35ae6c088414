"""ZeroMQ round trip and lookup latency of the draft server (server started through its CLI).

Measures, per transport (ipc, tcp loopback):
- heartbeat round trip (the floor: two socket hops + msgpack);
- a round whose outcome hits the speculation cache: client round trip and the server's own lookup time,
  for q′ carried sparse (greedy), sparse top-64 (``--q-support 64``) and dense ([K, V] float32);
- the codec alone: encode + decode of one speculation of each form.
The bonus of each scripted outcome is the draft's best candidate at the fork point (computed here with
the same model), so every round is a hit; each round first waits ``--verify-ms`` (the target's
verification). If the tree is not finished by then the hit is partial (the rest of that one branch is
decoded before replying) and the round trip includes that work: the table counts those separately.

    python bench/wire_roundtrip.py                      # random tiny model with a 49152-token vocabulary
    python bench/wire_roundtrip.py --model models/target --rounds 20 --verify-ms 800
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sglang_ssd.algo.probs import SparseProbs  # noqa: E402
from sglang_ssd.draft.model import DraftModel, Span  # noqa: E402
from sglang_ssd.tools.random_model import write_random_model  # noqa: E402
from sglang_ssd.wire import DraftClient, DraftParams, Outcome  # noqa: E402
from sglang_ssd.wire.codec import Limits, decode_reply, encode_reply  # noqa: E402
from sglang_ssd.wire.messages import Speculations  # noqa: E402
from sglang_ssd.wire.spawn import DraftServerProcess, ipc_endpoint  # noqa: E402
from sglang_ssd.wire.speculation import Speculation, msg_to_spec, spec_to_msg  # noqa: E402
from sglang_ssd.wire.tensors import FrameWriter  # noqa: E402


def best_bonus(model: DraftModel, context: list[int], excluded: int | None) -> int:
    start, length = model.pool.alloc(len(context) + 1)
    try:
        pos = torch.arange(len(context))
        lg = model.forward([Span(start, torch.tensor(context), pos, pos, len(context),
                                 out_rows=torch.tensor([len(context) - 1]))])[0][0]  # fmt: skip
    finally:
        model.pool.release(start, length)
    top = model.to_full_ids(lg.topk(2).indices).tolist()
    return top[1] if top[0] == excluded else top[0]


def scripted_rounds(client: DraftClient, local: DraftModel, params: DraftParams, rounds: int, verify_ms: float):
    prompt = list(range(100, 140))
    spec = client.open("bench", prompt, 7, params)
    ctx = prompt + [7]
    rtts, hits = [], 0
    for _ in range(rounds):
        time.sleep(verify_ms / 1e3)
        drafted = spec.tokens.tolist()
        acc = len(drafted) // 2
        bonus = best_bonus(local, ctx + drafted[:acc], drafted[acc] if acc < len(drafted) else None)
        ctx = ctx + drafted[:acc] + [bonus]
        t0 = time.perf_counter()
        spec = client.round([Outcome("bench", acc, bonus)])[0]
        if spec.hit:
            rtts.append((time.perf_counter() - t0) * 1e3)
            hits += 1
    client.close("bench")
    return rtts, hits


def codec_us(spec: Speculation, repeats: int = 200) -> tuple[float, int]:
    t0 = time.perf_counter()
    for _ in range(repeats):
        w = FrameWriter()
        frames = encode_reply(1, Speculations(specs=[spec_to_msg(spec, w)]), w.frames)
        env, reader = decode_reply(frames, Limits())
        msg_to_spec(env.body.specs[0], reader)
    return (time.perf_counter() - t0) / repeats * 1e6, sum(len(f) for f in frames)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--verify-ms", type=float, default=300.0, help="scripted target's verification time")
    args = ap.parse_args()
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    folder = Path(args.model) if args.model else write_random_model(
        tempfile.mkdtemp(prefix="bench-wire-"), vocab_size=49152, hidden_size=64, intermediate_size=128,
        num_layers=2, num_heads=4, num_kv_heads=2,
    )  # fmt: skip
    local = DraftModel(folder, kv_slots=8192)
    vocab = local.vocab_size
    k = args.k
    print(f"model {folder} (vocab {vocab}), K={k}, fan-out uniform ΣF=24, {args.rounds} scripted rounds, "
          f"verify {args.verify_ms:.0f} ms")
    print()
    print("| transport | q′ form | heartbeat RTT µs (p50) | hit round RTT ms (p50) | server lookup ms (p50) | "
          "tree step ms (p50) | hits (partial) |")
    print("|---|---|---|---|---|---|---|")
    forms = [
        ("sparse, greedy", DraftParams(temperature=0.0), []),
        ("sparse top-64", DraftParams(temperature=1.0, seed=1), ["--q-support", "64"]),
        ("dense [K, V]", DraftParams(temperature=1.0, seed=1), []),
    ]
    for transport in ("ipc", "tcp"):
        for name, params, extra in forms:
            bind = ipc_endpoint() if transport == "ipc" else "tcp://127.0.0.1:*"
            cli = ["--k", str(k), "--fanout", "uniform", "--budget", "24", "--backup", "neural", *extra]
            with DraftServerProcess(folder, bind, *cli) as srv, DraftClient(srv.endpoint, timeout_s=60) as c:
                hb = []
                for _ in range(50):
                    t0 = time.perf_counter()
                    c.ping()
                    hb.append((time.perf_counter() - t0) * 1e6)
                rtts, hits = scripted_rounds(c, local, params, args.rounds, args.verify_ms)
                st = c.stats()
            med = statistics.median
            print(f"| {transport} | {name} | {med(hb):.0f} | {med(rtts) if rtts else float('nan'):.3f} | "
                  f"{st['lookup_ms_p50']:.3f} | {st['tree_step_ms_p50']:.2f} | {hits}/{args.rounds} "
                  f"({st.get('partial_hits', 0)}) |")
    print()
    print("| codec only (encode + decode one speculation) | µs | bytes |")
    print("|---|---|---|")
    toks = torch.arange(k)
    dense = torch.softmax(torch.randn(k, vocab), -1)
    top = torch.topk(dense, 64)
    for name, q in (
        ("point mass (fast backup)", None),
        ("sparse S=1 (greedy)", SparseProbs(toks.unsqueeze(1), torch.ones(k, 1), vocab)),
        ("sparse S=64", SparseProbs(top.indices, top.values, vocab)),
        ("dense", dense),
    ):
        us, nbytes = codec_us(Speculation("r", True, toks, q))
        print(f"| {name} | {us:.1f} | {nbytes} |")


if __name__ == "__main__":
    main()
