"""Through real ZeroMQ sockets, with the server started as a separate process through its CLI."""

from __future__ import annotations

import contextlib
import random
import statistics
import time

import msgspec
import pytest
import torch
import zmq

from sglang_ssd.draft.model import DraftModel, Span
from sglang_ssd.tools.random_model import write_random_model
from sglang_ssd.wire import DraftClient, DraftParams, DraftUnavailable, Outcome
from sglang_ssd.wire.codec import Limits, decode_reply, encode_request
from sglang_ssd.wire.messages import Heartbeat, Open
from sglang_ssd.wire.spawn import DraftServerProcess, ipc_endpoint
from sglang_ssd.wire.transport import curve_available

TINY = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("tiny"), **TINY, seed=3)


@pytest.fixture(scope="module")
def medium_model(tmp_path_factory):
    """Big enough that a tree step costs visibly more than a lookup."""
    return write_random_model(
        tmp_path_factory.mktemp("medium"), vocab_size=4096, hidden_size=256, intermediate_size=768,
        num_layers=4, num_heads=8, num_kv_heads=2, seed=4,
    )  # fmt: skip


ARGS = ["--k", "4", "--fanout-list", "2,2,2,2,2", "--backup", "neural"]


@pytest.fixture(scope="module")
def shared_server(tiny_model):
    """One ipc server for the tests that do not need their own (a start costs seconds on a busy box)."""
    with DraftServerProcess(tiny_model, ipc_endpoint(), *ARGS, "--max-message-mb", "1", "--idle-timeout", "2") as srv:
        yield srv


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_round_trip_over_sockets(tiny_model, shared_server, transport):
    with contextlib.ExitStack() as stack:
        if transport == "ipc":
            srv = shared_server
        else:
            srv = stack.enter_context(DraftServerProcess(tiny_model, "tcp://127.0.0.1:*", *ARGS))
        with DraftClient(srv.endpoint, timeout_s=30) as c:
            assert c.ping()
            info = c.server_info()
            assert info.k == 4 and info.vocab_size == 256 and info.mode == "async"
            spec = c.open("a", [1, 2, 3, 4], 5, DraftParams(temperature=0.8, seed=1))
            assert spec.tokens.shape == (4,) and spec.q.shape == (4, 256)
            nxt = c.round([Outcome("a", 1, 9)])[0]
            assert nxt.ok and nxt.tokens.shape == (4,)
            rtts = []
            for _ in range(20):
                t0 = time.perf_counter()
                c.ping()
                rtts.append((time.perf_counter() - t0) * 1e6)
            c.close("a")
            assert "unknown request id" in c.round([Outcome("a", 0, 1)])[0].error
        print(f"\n{transport} heartbeat round trip: median {statistics.median(rtts):.0f} us")
        assert statistics.median(rtts) < 50_000  # order of magnitude only: a loaded box stays far below


@pytest.mark.skipif(not curve_available(), reason="libzmq built without CURVE")
def test_curve_encryption(tiny_model, tmp_path):
    public, secret = zmq.curve_keypair()
    key_file = tmp_path / "server.key"
    key_file.write_bytes(secret)
    with DraftServerProcess(tiny_model, "tcp://127.0.0.1:*", *ARGS, "--curve-secret-file", str(key_file)) as srv:
        with DraftClient(srv.endpoint, timeout_s=30, curve_server_key=public) as c:
            assert c.open("a", [1, 2, 3], 4, DraftParams()).ok
        # Without the server's key the handshake never completes: no service, no crash.
        with DraftClient(srv.endpoint, timeout_s=0.5) as plain:
            assert not plain.ping()
        wrong_public, _ = zmq.curve_keypair()
        with DraftClient(srv.endpoint, timeout_s=0.5, curve_server_key=wrong_public) as wrong:
            assert not wrong.ping()
        assert srv.alive()


def _bonus_by_rank(model: DraftModel, context: list[int], excluded: int | None, rank: int) -> int:
    """The draft's rank-th most likely next token after ``context`` (1-based), skipping ``excluded``."""
    start, length = model.pool.alloc(len(context) + 1)
    try:
        pos = torch.arange(len(context))
        logits = model.forward([Span(start, torch.tensor(context), pos, pos, len(context),
                                     out_rows=torch.tensor([len(context) - 1]))])[0][0]  # fmt: skip
    finally:
        model.pool.release(start, length)
    order = [t for t in logits.argsort(descending=True).tolist() if t != excluded]
    return order[rank - 1]


def test_scripted_target_hit_rate_and_latency(medium_model):
    """A target that replays a known acceptance process: k ~ capped geometric(α), and the bonus is the
    draft's 1st / 2nd / 6th candidate with probability 0.5 / 0.2 / 0.3. With F_k = 2 everywhere the
    cache holds ranks 1–2, so the hit rate must be 0.7 (up to sampling noise), whatever α is."""
    alpha, batch, rounds = 0.6, 3, 30
    rng = random.Random(0)
    local = DraftModel(medium_model, kv_slots=8192)
    with DraftServerProcess(medium_model, ipc_endpoint(), *ARGS) as srv, DraftClient(srv.endpoint, timeout_s=60) as c:
        contexts, specs = {}, {}
        for i in range(batch):
            rid = f"r{i}"
            prompt = [rng.randrange(4096) for _ in range(rng.randrange(20, 60))]
            first = rng.randrange(4096)
            specs[rid] = c.open(rid, prompt, first, DraftParams(temperature=0.0))
            contexts[rid] = prompt + [first]
        hits = misses = 0
        hit_rtts, miss_rtts = [], []
        for _ in range(rounds):
            time.sleep(0.25)  # the target verifies; the draft pre-speculates meanwhile
            outcomes = []
            for rid, spec in specs.items():
                drafted = spec.tokens.tolist()
                acc = 0
                while acc < len(drafted) and rng.random() < alpha:
                    acc += 1
                rank = rng.choices([1, 2, 6], weights=[0.5, 0.2, 0.3])[0]
                ctx = contexts[rid] + drafted[:acc]
                excluded = drafted[acc] if acc < len(drafted) else None
                bonus = _bonus_by_rank(local, ctx, excluded, rank)
                contexts[rid] = ctx + [bonus]
                outcomes.append(Outcome(rid, acc, bonus))
            t0 = time.perf_counter()
            replies = c.round(outcomes)
            rtt = (time.perf_counter() - t0) * 1e3
            n_hit = sum(r.hit for r in replies)
            hits += n_hit
            misses += len(replies) - n_hit
            (hit_rtts if n_hit == len(replies) else miss_rtts).append(rtt)
            specs = {r.rid: r for r in replies}
        st = c.stats()
    n = hits + misses
    rate = hits / n
    sigma = (0.7 * 0.3 / n) ** 0.5
    print(
        f"\nhit rate {rate:.3f} over {n} outcomes (expected 0.700 ± {sigma:.3f}); "
        f"acceptance {st['acceptance_rate']:.3f}\n"
        f"client round trip, all-hit rounds: median {statistics.median(hit_rtts):.2f} ms "
        f"({len(hit_rtts)} rounds); rounds with a miss: median "
        f"{statistics.median(miss_rtts) if miss_rtts else float('nan'):.2f} ms\n"
        f"server lookup p50 {st['lookup_ms_p50']:.3f} ms, whole round message p50 {st['handle_round_ms_p50']:.3f} ms, "
        f"tree step p50 {st['tree_step_ms_p50']:.2f} ms, partial hits {st.get('partial_hits', 0)}, "
        f"neural backup p50 {st.get('backup_neural_ms_p50', float('nan')):.2f} ms"
    )
    assert abs(rate - 0.7) < 4 * sigma
    assert st["hits"] == hits and st["misses"] == misses
    # Orders of magnitude only: a lookup is a table read, a tree step a batched forward.
    assert st["lookup_ms_p50"] < st["tree_step_ms_p50"]
    assert statistics.median(hit_rtts) < 20 * st["backup_neural_ms_p50"] + 50


def test_bad_input_over_socket(shared_server):
    """Garbage, oversized and inconsistent messages from a raw socket get error replies (or, beyond the
    hard frame limit, a disconnect); the server keeps serving everyone else."""
    srv = shared_server
    with DraftClient(srv.endpoint, timeout_s=30) as c:
        before = c.stats()
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(srv.endpoint)

    def ask(frames, timeout_ms=5000):
        raw.send_multipart(frames)
        if not raw.poll(timeout_ms):
            return None
        env, _ = decode_reply(raw.recv_multipart(), Limits())
        return env.body

    def header(v, body):
        return msgspec.msgpack.encode({"v": v, "seq": 2, "client": "x", "body": body})

    try:
        hb = encode_request(1, "raw", Heartbeat())[0]
        assert ask([b"\xff\x00garbage"]).code == "bad_message"
        assert ask([header(1, {"type": "nope"})]).code == "bad_message"
        assert ask([header(7, {"type": "heartbeat"})]).code == "version"
        assert ask([hb, b"unexpected tensor"]).code == "bad_message"
        assert ask([hb + b"\x00" * (1 << 20)]).code == "too_large"
        assert ask([hb]).mode == "async"
        with DraftClient(srv.endpoint, timeout_s=30) as c:
            c.open("a", [1, 2, 3], 4, DraftParams())
            specs = c.round([Outcome("a", 0, 5), Outcome("missing", 0, 5)])
            assert specs[0].ok and "unknown request id" in specs[1].error
            # Beyond the hard limit (2× the soft one) libzmq drops the sender before we allocate.
            assert ask([b"\x00" * (3 << 20)], timeout_ms=1000) is None
            assert c.ping() and srv.alive()
            st = c.stats()
            c.close("a")
    finally:
        raw.close()
        ctx.term()
    grew = {name: st.get(name, 0) - before.get(name, 0) for name in ("error_bad_message", "error_too_large", "error_version")}
    assert grew == {"error_bad_message": 3, "error_too_large": 1, "error_version": 1}


def test_vanished_client_is_cleaned_up(shared_server):
    """A client that opens requests and disappears (socket gone, nothing closed): the server frees them
    after the idle timeout, KV included, and keeps serving."""
    srv = shared_server
    ctx = zmq.Context()
    ghost = ctx.socket(zmq.DEALER)
    ghost.setsockopt(zmq.LINGER, 0)
    ghost.connect(srv.endpoint)
    for i in range(3):
        body = Open(rid=f"ghost{i}", prompt_tokens=[1, 2, 3, 4], first_token=5, params=DraftParams())
        ghost.send_multipart(encode_request(i + 1, "ghost", body))
        assert ghost.poll(20_000)
        ghost.recv_multipart()
    ghost.close()
    ctx.term()
    with DraftClient(srv.endpoint, timeout_s=30) as c:
        before = c.stats()
        assert before["requests_open"] >= 3
        deadline = time.monotonic() + 20
        while c.stats()["requests_open"] and time.monotonic() < deadline:
            time.sleep(0.3)
        st = c.stats()
        assert st["requests_open"] == 0 and st["kv_slots_used"] == 0
        assert st["expired"] - before.get("expired", 0) >= 3


def test_timeout_dead_server_and_reconnect(tiny_model):
    bind = ipc_endpoint()
    srv = DraftServerProcess(tiny_model, bind, *ARGS)
    c = DraftClient(srv.endpoint, timeout_s=2)
    try:
        # A call that cannot finish in time raises, and its late reply is never mistaken for another's.
        with pytest.raises(DraftUnavailable):
            c.timeout_s = 0.001
            c.open("long", list(range(200)) * 10, 1, DraftParams())
        c.timeout_s = 30  # generous while the server answers (a loaded CI box); short again for the dead one
        assert c.ping()
        assert c.open("a", [1, 2, 3], 4, DraftParams()).ok
        c.timeout_s = 5
        srv.stop()
        t0 = time.perf_counter()
        with pytest.raises(DraftUnavailable):
            c.round([Outcome("a", 0, 1)])
        assert time.perf_counter() - t0 < 10
        assert not c.ping(timeout_s=0.2)
        srv = DraftServerProcess(tiny_model, bind, *ARGS)
        c.timeout_s = 30
        assert c.ping()
        # The new server has never heard of "a": the worker re-opens it.
        assert "unknown request id" in c.round([Outcome("a", 0, 1)])[0].error
        assert c.open("a", [1, 2, 3], 4, DraftParams()).ok
    finally:
        c.disconnect()
        srv.stop()


def test_one_draft_server_serves_several_replicas(shared_server):
    """`--dp-size N`: every replica's worker has its own link (its own DEALER socket) to the same draft
    server. Interleaved replicas get exactly what each would get alone, and closing one replica's
    requests leaves the other's untouched."""

    def session(client: DraftClient, prefix: str, steps: int = 4):
        spec = client.open(f"{prefix}-r", [3, 1, 4, 1, 5], 9, DraftParams(temperature=0.9, seed=17))
        yield spec.tokens.tolist()
        for i in range(steps):
            spec = client.round([Outcome(f"{prefix}-r", i % 3, 7 + i)])[0]
            assert spec.ok, spec.error
            yield spec.tokens.tolist()

    with DraftClient(shared_server.endpoint, timeout_s=30) as alone:
        reference = list(session(alone, "solo"))
        alone.close("solo-r")
    with DraftClient(shared_server.endpoint, timeout_s=30) as a, DraftClient(shared_server.endpoint, timeout_s=30) as b:
        got_a, got_b = [], []
        for ta, tb in zip(session(a, "dp0"), session(b, "dp1")):
            got_a.append(ta)
            got_b.append(tb)
        assert got_a == reference and got_b == reference  # same seed and outcomes ⇒ same drafts
        a.close("dp0-r")
        assert "unknown request id" in a.round([Outcome("dp0-r", 0, 1)])[0].error
        assert b.round([Outcome("dp1-r", 0, 1)])[0].ok
        b.close("dp1-r")


def test_posted_round_equals_blocking_round_with_calls_in_between(shared_server):
    """The worker posts a round after its step and collects it at the next: the speculations must be
    exactly those of a blocking round, even when other calls (a ping, another request's open, a close)
    are answered while the round's reply waits."""

    def run(client: DraftClient, prefix: str, posted: bool) -> list[list[int]]:
        rid = f"{prefix}-r"
        drafts = [client.open(rid, [2, 7, 1, 8], 2, DraftParams(temperature=0.9, seed=5)).tokens.tolist()]
        for i in range(5):
            outcome = Outcome(rid, i % 3, 11 + i)
            if posted:
                ticket = client.post_round([outcome])
                assert client.ping()
                other = client.open(f"{prefix}-other{i}", [4, 4, 4], 1, DraftParams())
                assert other.ok
                client.close(f"{prefix}-other{i}")
                spec = client.collect_round(ticket)[0]
            else:
                spec = client.round([outcome])[0]
            assert spec.ok, spec.error
            drafts.append(spec.tokens.tolist())
        client.close(rid)
        return drafts

    with DraftClient(shared_server.endpoint, timeout_s=30) as c:
        assert run(c, "posted", True) == run(c, "blocking", False)
        # A request closed while its round is in flight is forgotten once the reply is collected.
        c.open("gone", [1, 2, 3], 4, DraftParams())
        ticket = c.post_round([Outcome("gone", 0, 5)])
        c.close("gone")
        assert c.collect_round(ticket)[0].ok
        assert "gone" not in c._spec_ids
        # A reset connection loses the posted round: collecting says so instead of hanging.
        c.open("lost", [1, 2, 3], 4, DraftParams())
        ticket = c.post_round([Outcome("lost", 0, 5)])
        c._reset()
        with pytest.raises(DraftUnavailable, match="lost"):
            c.collect_round(ticket)


def test_the_depth_a_round_asks_for_reaches_the_server(tiny_model):
    """Auto-K's K travels with the round over real sockets: the server drafts that many tokens from its
    next tree on (the reply to the asking round was drafted before it), and never more than its own K."""
    with DraftServerProcess(tiny_model, ipc_endpoint(), *ARGS) as srv, DraftClient(srv.endpoint, timeout_s=30) as c:
        spec = c.open("r", [3, 1, 4, 1, 5], 9, DraftParams(temperature=0.0))
        lengths = [len(spec.tokens)]
        for depth in (2, None, 1, 9, None):
            time.sleep(0.2)  # the server pre-speculates meanwhile: some rounds hit, some miss
            spec = c.collect_round(c.post_round([Outcome("r", 1, int(spec.tokens[1]) if len(spec.tokens) > 1 else 0)],
                                                depth))[0]  # fmt: skip
            assert spec.ok, spec.error
            lengths.append(len(spec.tokens))
        stats = c.stats()
        c.close("r")
    assert lengths == [4, 4, 2, 2, 1, 4]
    assert stats["k"] == 4 and stats["depth_changes"] == 3


def test_the_budget_a_round_asks_for_reaches_the_server(tiny_model):
    """Auto-K's ΣF for the batch travels with the round: the server forks that many branches per request
    from its next trees on, never more than its own ΣF, and keeps it while rounds name none."""
    args = ["--k", "4", "--budget", "10", "--fanout", "geometric", "--backup", "neural"]
    with DraftServerProcess(tiny_model, ipc_endpoint(), *args) as srv, DraftClient(srv.endpoint, timeout_s=30) as c:
        spec = c.open("r", [3, 1, 4, 1, 5], 9, DraftParams(temperature=0.0))
        forks = [c.stats()["forks"]]
        for budget in (3, None, 1, 1000):
            spec = c.collect_round(c.post_round([Outcome("r", 0, int(spec.tokens[0]))], budget=budget))[0]
            assert spec.ok, spec.error
            stats = c.stats()
            forks.append(stats["forks"])
            assert sum(int(f) for f in stats["fanout"].split(",")) == stats["forks"]
        c.close("r")
    assert forks == [stats["budget"], 3, 3, 1, stats["budget"]] and stats["budget_changes"] == 3
