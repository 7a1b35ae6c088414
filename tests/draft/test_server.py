"""The draft server behind the in-process transport: the client API end to end, and bad input."""

from __future__ import annotations

import msgspec
import pytest
import torch

from sglang_ssd.draft.engine import DraftEngine, EngineConfig
from sglang_ssd.draft.model import DraftModel
from sglang_ssd.draft.request import Stage
from sglang_ssd.draft.server import DraftServer
from sglang_ssd.wire import DraftClient, DraftParams, DraftServerError, Outcome
from sglang_ssd.wire.codec import Limits, decode_reply, encode_reply
from sglang_ssd.wire.messages import Alive
from sglang_ssd.wire.transport import InProcClientTransport

K = 4


def make(tiny_llama, drain=True, **cfg) -> tuple[DraftServer, DraftClient]:
    model = DraftModel(tiny_llama, kv_slots=8192)
    engine = DraftEngine(model, EngineConfig(k=K, fanout_list=[2, 2, 2, 2, 2], backup="neural", **cfg))
    server = DraftServer(engine, Limits(max_header_bytes=1 << 16, max_tensor_bytes=1 << 16, max_message_bytes=1 << 17))
    client = DraftClient("inproc://x", transport=InProcClientTransport(server, drain=drain))
    return server, client


def cached_bonus(server: DraftServer, rid: str, k: int) -> int:
    t = server.engine.requests[rid].tree
    return int(t.fork_tok[(t.fork_k == k).nonzero()[0, 0]])


def test_open_round_hit_close(tiny_llama):
    server, client = make(tiny_llama)
    assert client.ping()
    spec = client.open("a", [1, 2, 3, 4, 5], 6, DraftParams(temperature=0.0))
    assert not spec.hit and spec.tokens.shape == (K,) and spec.error is None
    # The pre-speculation ran (drain); a cached bonus is a hit, an uncached one a miss.
    bonus = cached_bonus(server, "a", 1)
    hit = client.round([Outcome("a", 1, bonus)])[0]
    assert hit.hit and hit.tokens.shape == (K,) and hit.q is not None
    req = server.engine.requests["a"]
    assert req.tokens[-2:] == [spec.tokens[0].item(), bonus]
    t = server.engine.requests["a"].tree
    uncached = next(x for x in range(256) if x not in t.fork_tok.tolist())
    miss = client.round([Outcome("a", 0, uncached)])[0]
    assert not miss.hit and miss.tokens.shape == (K,)
    stats = client.stats()
    assert stats["hits"] == 1 and stats["misses"] == 1 and stats["forced_miss"] == 1
    assert stats["requests_open"] == 1
    client.close("a")
    assert client.stats()["requests_open"] == 0
    assert server.engine.model.pool.used_slots == 0


def test_sync_mode_never_prespeculates(tiny_llama):
    server, client = make(tiny_llama, mode="sync")
    client.open("a", [1, 2, 3], 4, DraftParams(temperature=1.0, seed=1))
    assert not server.engine.has_work() and server.engine.requests["a"].stage is Stage.IDLE
    nxt = client.round([Outcome("a", 2, 17)])[0]
    assert not nxt.hit and nxt.tokens.shape == (K,) and isinstance(nxt.q, torch.Tensor)
    again = client.draft(["a"])[0]
    # Drafting twice from the same context with the same seed gives the same tokens.
    assert torch.equal(again.tokens, nxt.tokens)
    assert client.stats()["sync_drafts"] == 1


def test_per_request_errors_do_not_spoil_the_batch(tiny_llama):
    server, client = make(tiny_llama)
    client.open("a", [1, 2, 3], 4, DraftParams())
    client.open("b", [5, 6, 7], 8, DraftParams())
    specs = client.round([Outcome("a", 0, 3), Outcome("ghost", 0, 3), Outcome("b", 9, 3)])
    assert specs[0].ok and specs[0].tokens.numel() == K
    assert "unknown request id" in specs[1].error and specs[1].tokens.numel() == 0
    assert "exceeds" in specs[2].error
    # "b" is still usable after its bad outcome.
    assert client.round([Outcome("b", 1, 3)])[0].ok
    bad_bonus = client.round([Outcome("a", 0, 10_000)])[0]
    assert "vocabulary" in bad_bonus.error
    assert client.draft(["nope"])[0].error is not None
    refused = client.open("c", [1, 999], 2, DraftParams())
    assert "vocabulary" in refused.error and refused.tokens.numel() == 0 and "c" not in server.engine.requests


def test_out_of_sync_outcome_is_refused(tiny_llama):
    server, client = make(tiny_llama)
    client.open("a", [1, 2, 3], 4, DraftParams())
    client.round([Outcome("a", 0, 5)])
    # Replay an outcome for an old speculation, as a client that lost a reply would.
    client._spec_ids["a"] = 1
    spec = client.round([Outcome("a", 0, 5)])[0]
    assert "out of sync" in spec.error
    # Re-opening recovers the request.
    assert client.open("a", [1, 2, 3], 4, DraftParams()).ok
    assert client.round([Outcome("a", 0, 5)])[0].ok


def test_malformed_messages_get_error_replies(tiny_llama):
    server, client = make(tiny_llama)
    junk = [
        [b"\x00\x01garbage"],
        [msgspec.msgpack.encode({"v": 1, "seq": 1, "client": "c", "body": {"type": "open", "rid": 5}})],
        [msgspec.msgpack.encode({"v": 99, "seq": 2, "client": "c", "body": {"type": "heartbeat"}})],
        [msgspec.msgpack.encode({"v": 1, "seq": 3, "client": "c", "body": {"type": "heartbeat"}}), b"extra"],
        [b"\x00" * (1 << 17)],
    ]
    codes = []
    for frames in junk:
        env, _ = decode_reply(server.handle(b"peer", frames), Limits())
        codes.append(env.body.code)
    assert codes == ["bad_message", "bad_message", "version", "bad_message", "too_large"]
    assert client.ping()
    assert client.stats()["error_bad_message"] == 3


def test_internal_error_is_contained(tiny_llama, monkeypatch):
    server, client = make(tiny_llama)
    client.open("a", [1, 2, 3], 4, DraftParams())

    def boom(*a, **k):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(server.engine, "round", boom)
    with pytest.raises(DraftServerError, match="internal"):
        client.round([Outcome("a", 0, 1)])
    monkeypatch.undo()
    assert client.ping() and client.round([Outcome("a", 0, 1)])[0].ok


def test_late_reply_is_dropped(tiny_llama):
    server, client = make(tiny_llama)
    # A reply to an earlier (timed-out) call sits in front of the real one.
    client.transport._inbox.append(encode_reply(0, Alive(server_time=0.0, mode="x", k=1, vocab_size=1)))
    assert client.ping()
    assert client.stale_replies == 1


def test_close_all_and_idle_expiry(tiny_llama):
    server, client = make(tiny_llama, idle_timeout_s=0.0)
    for rid in "abc":
        client.open(rid, [1, 2, 3], 4, DraftParams())
    other = DraftClient("inproc://x", transport=InProcClientTransport(server))
    other.open("d", [1, 2], 3, DraftParams())
    assert client.close_all() == 3
    assert list(server.engine.requests) == ["d"]
    import time

    assert server.engine.expire_idle(time.monotonic() + 1) == 1
    assert server.engine.model.pool.used_slots == 0


def test_partial_hit_matches_full_hit(tiny_llama):
    """An outcome that arrives while its branch is half decoded gets the same tokens as a finished one."""
    results = []
    for steps in (None, 2):
        server, client = make(tiny_llama, drain=False)
        client.open("a", [1, 2, 3, 4], 5, DraftParams(temperature=1.0, seed=7))
        eng = server.engine
        eng.work_step()  # glue + forks
        bonus = cached_bonus(server, "a", 2)
        n = K if steps is None else steps
        for _ in range(n):
            eng.work_step()
        assert eng.requests["a"].stage is (Stage.READY if steps is None else Stage.TREE)
        spec = client.round([Outcome("a", 2, bonus)])[0]
        assert spec.hit
        results.append(spec)
    assert torch.equal(results[0].tokens, results[1].tokens)
    torch.testing.assert_close(results[0].q, results[1].q)


def test_fast_partial_hit_sends_the_done_prefix_of_the_branch(tiny_llama):
    """The step deadline makes this path common: a round that finds its tree mid-way under the fast
    backup is answered with the steps already done, which must be the finished branch's first tokens
    and q′ rows (the finished branch equals plain decoding: test_exactness.py)."""
    results = []
    for steps in (None, 2):
        server, client = make(tiny_llama, drain=False)
        client.open("a", [1, 2, 3, 4], 5, DraftParams(temperature=1.0, seed=7))  # a neural K-token draft
        eng = server.engine
        eng.backup.mode = "fast"  # the round's partial hit: the done steps, nothing decoded for it
        eng.work_step()  # glue + forks
        bonus = cached_bonus(server, "a", 2)
        for _ in range(K if steps is None else steps):
            eng.work_step()
        spec = client.round([Outcome("a", 2, bonus)])[0]
        assert spec.hit
        results.append(spec)
    full, part = results
    assert part.tokens.shape == (2,) and torch.equal(part.tokens, full.tokens[:2])
    torch.testing.assert_close(part.q, full.q[:2])


def test_a_short_speculation_gets_the_whole_budget_over_its_own_outcomes(tiny_llama):
    """An empty or short speculation (a fast backup's) has fewer outcomes than K: its tree puts all
    ΣF forks on them. An empty one can only end in k = 0, so every fork is a candidate bonus there."""
    budget = sum([2, 2, 2, 2, 2])
    for prompt, n_spec in (([1, 2, 3, 4], 0), ([7, 8, 9, 7, 8, 9, 7, 8], K)):
        server, client = make(tiny_llama, drain=False)
        server.engine.backup.mode = "fast"
        spec = client.open("a", prompt[:-1], prompt[-1], DraftParams(temperature=0.0))
        assert len(spec.tokens) == n_spec
        server.engine.work_step()  # glue + forks
        tree = server.engine.requests["a"].tree
        assert tree.num_branches == budget
        if n_spec == 0:
            assert set(tree.fork_k.tolist()) == {0}
        else:  # a full-length one keeps the configured plan
            assert torch.bincount(tree.fork_k, minlength=K + 1).tolist() == [2] * (K + 1)


def test_fast_backup_is_point_mass(tiny_llama):
    server, client = make(tiny_llama, drain=False)
    server.engine.backup.mode = "fast"
    # A repeating prompt: the context lookup proposes its continuation.
    spec = client.open("a", [7, 8, 9, 7, 8, 9, 7, 8], 9, DraftParams(temperature=1.0))
    assert spec.q is None and spec.tokens.tolist() == [7, 8, 9, 7]
    assert client.stats()["backup_fast"] == 1


def test_auto_backup_follows_the_policy(tiny_llama):
    """--backup auto: the algorithm core's policy picks per round and is fed every round's outcome."""
    server, client = make(tiny_llama, drain=False)
    eng = server.engine
    eng.backup = type(eng.backup)("auto", K)
    assert eng.backup.policy is not None
    specs = [client.open(rid, [1, 2, 3, 4], 5, DraftParams()) for rid in "abcd"]
    for _ in range(3):
        while eng.has_work():
            eng.work_step()
        # A fast backup may propose fewer than K tokens (even none).
        specs = client.round([Outcome(s.rid, min(1, len(s.tokens)), 7) for s in specs])
        assert all(s.ok for s in specs)
    policy = eng.backup.policy
    assert policy.choose(4) in ("neural", "fast")
    st = client.stats()
    assert st["backup_neural"] + st.get("backup_fast", 0) >= 4
    # The policy saw the rounds: its hit-rate estimates moved off their prior.
    assert any(e.value != 0.6 for e in policy.p_next.values())


def test_kv_pool_exhaustion_refuses_one_request_only(tiny_llama):
    model = DraftModel(tiny_llama, kv_slots=1024)
    engine = DraftEngine(model, EngineConfig(k=K, fanout_list=[2, 2, 2, 2, 2], backup="neural"))
    client = DraftClient("inproc://x", transport=InProcClientTransport(DraftServer(engine)))
    assert client.open("small", [1, 2, 3], 4, DraftParams()).ok
    assert "KV pool" in client.open("huge", list(range(200)) * 6, 4, DraftParams()).error
    assert "huge" not in engine.requests and engine.model.pool.used_slots > 0
    assert client.round([Outcome("small", 0, 5)])[0].ok


def test_step_token_cap_bounds_each_forward(tiny_llama):
    """With many requests, no pre-speculation forward exceeds --max-step-tokens (after the first span),
    so a lookup waits at most one small step; every tree still completes."""
    server, client = make(tiny_llama, drain=False, max_step_tokens=24)
    eng = server.engine
    sizes = []
    forward = eng.model.forward

    def spy(spans):
        sizes.append(sum(s.n for s in spans))
        return forward(spans)

    eng.model.forward = spy
    for i in range(6):
        client.open(f"r{i}", [1, 2, 3, i], 5, DraftParams())
    sizes.clear()
    while eng.has_work():
        eng.work_step()
    assert max(sizes) <= 24
    assert all(r.stage is Stage.READY for r in eng.requests.values())


def test_open_many_prefills_together_and_equals_one_by_one(tiny_llama):
    """One message opens several requests (prompts longer than a prefill chunk, so several waves):
    greedy drafts and the KV each request holds match opening them one at a time."""
    prompts = {"a": list(range(1, 40)), "b": [7, 3] * 9, "c": [5]}
    params = DraftParams(temperature=0.0)
    server, client = make(tiny_llama, prefill_chunk=16)
    specs = client.open_many([(rid, p, 9, params) for rid, p in prompts.items()])
    assert [s.rid for s in specs] == list(prompts) and all(s.error is None for s in specs)
    alone_server, alone = make(tiny_llama, prefill_chunk=16)
    for rid, p in prompts.items():
        one = alone.open(rid, p, 9, params)
        assert torch.equal(one.tokens, specs[list(prompts).index(rid)].tokens), rid
        ours, theirs = server.engine.requests[rid], alone_server.engine.requests[rid]
        assert ours.kv_len == theirs.kv_len and ours.tokens == theirs.tokens
    assert client.stats()["forced_miss"] == 3
    # The opened requests go on like any other: a round answers all three.
    outs = client.round([Outcome(s.rid, 0, 1) for s in specs])
    assert [o.rid for o in outs] == list(prompts) and all(o.error is None for o in outs)


def test_open_many_bounds_the_prefill_one_message_causes(tiny_llama):
    server, client = make(tiny_llama, max_open_tokens=50)
    specs = client.open_many([("a", [1] * 30, 2, DraftParams()), ("b", [2] * 30, 3, DraftParams()),
                              ("c", [3] * 10, 4, DraftParams())])  # fmt: skip
    assert specs[0].error is None and specs[2].error is None
    assert "max_open_tokens" in specs[1].error and len(specs[1].tokens) == 0
    assert sorted(server.engine.requests) == ["a", "c"]
    assert client.open_many([("b", [2] * 30, 3, DraftParams())])[0].error is None  # the next message takes it
    assert client.open_many([("d", [4] * 80, 5, DraftParams())])[0].error is None  # alone, bounded by the context


def test_a_prompt_past_the_drafts_context_is_refused_alone(tiny_llama):
    server, client = make(tiny_llama)
    limit = server.engine.model.cfg.max_position
    specs = client.open_many([("long", [1] * limit, 2, DraftParams()), ("ok", [1, 2, 3], 4, DraftParams())])
    assert "does not fit the draft's context" in specs[0].error
    assert specs[1].error is None and list(server.engine.requests) == ["ok"]
    assert "does not fit" in client.open("long2", [1] * limit, 2, DraftParams()).error


def _prefill_sizes(engine) -> list[int]:
    """Spy: tokens of background prefill (spans that want no logits) in each forward."""
    sizes, forward = [], engine.model.forward

    def spy(spans):
        sizes.append(sum(s.n for s in spans if s.out_rows is not None and s.out_rows.numel() == 0))
        return forward(spans)

    engine.model.forward = spy
    return sizes


def test_a_long_prompt_is_prefilled_in_the_background_one_chunk_per_step(tiny_llama):
    """A prompt past inline_prefill_tokens is answered at once (fast backup) and prefilled between
    messages, at most one chunk per work step, next to the pre-speculation of the requests already
    running; rounds in the meantime are answered and their tokens join the context; once the context
    is ready the request drafts exactly as if it had been prefilled inline."""
    chunk, params = 16, DraftParams(temperature=0.0)
    server, client = make(tiny_llama, drain=False, prefill_chunk=chunk, inline_prefill_tokens=8)
    eng = server.engine
    client.open("short", [1, 2, 3], 4, params)
    prompt = [(7 * i) % 250 + 1 for i in range(100)]
    sizes = _prefill_sizes(eng)
    spec = client.open("long", prompt, 9, params)
    assert spec.error is None and not spec.hit and sizes == []  # answered without prefilling
    req = eng.requests["long"]
    assert req.stage is Stage.PREFILL and req.kv_len == 0
    eng.work_step()
    assert req.kv_len == chunk and eng.requests["short"].stage is not Stage.IDLE
    # A round while it prefills: committed, answered from the fast backup, prefill goes on.
    got = client.round([Outcome("long", 0, 11)])[0]
    assert got.error is None and req.tokens[-1] == 11 and req.stage is Stage.PREFILL
    while req.stage is Stage.PREFILL:
        eng.work_step()
    assert max(sizes) <= chunk and sum(sizes) == len(prompt) + 1  # the prompt, then the first token
    assert req.kv_len == len(req.tokens) - 1
    while eng.has_work():
        eng.work_step()
    assert req.stage is Stage.READY
    assert client.stats()["background_prefills"] == 1 and client.stats()["prefilling_rounds"] == 1

    # The same context prefilled inline drafts the same greedy tokens after the same miss.
    twin_server, twin = make(tiny_llama, drain=True, prefill_chunk=chunk, inline_prefill_tokens=4096)
    twin.open("long", prompt, 9, params)
    twin.round([Outcome("long", 0, 11)])
    ours, theirs = req, twin_server.engine.requests["long"]
    assert ours.tokens == theirs.tokens
    fork = set(ours.tree.fork_tok.tolist()) | set(theirs.tree.fork_tok.tolist())
    miss = next(x for x in range(1, 256) if x not in fork)
    a = client.round([Outcome("long", 0, miss)])[0]
    b = twin.round([Outcome("long", 0, miss)])[0]
    assert not a.hit and not b.hit and torch.equal(a.tokens, b.tokens)


def test_sync_mode_prefills_inline_whatever_the_prompt(tiny_llama):
    server, client = make(tiny_llama, mode="sync", inline_prefill_tokens=4)
    spec = client.open("a", list(range(1, 60)), 4, DraftParams())
    req = server.engine.requests["a"]
    assert spec.tokens.shape == (K,) and req.kv_len == 59 and req.stage is Stage.IDLE
