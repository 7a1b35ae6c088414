"""Faults: a dead, stalled or babbling draft server never costs output or availability, and speculation
comes back when the draft server does."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import pytest
import zmq

from sglang_ssd.target.draft_link import RETRY_S
from sglang_ssd.wire.client import DraftClient
from tests.e2e.conftest import greedy_tokens, rids_for

pytestmark = pytest.mark.server  # starts real SGLang servers

STREAM_TOKENS = 48


def _stream(server, ids, n, out, progress, i, rid=None):
    payload = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True},
               "stream": True}
    if rid is not None:
        payload["rid"] = rid
    req = urllib.request.Request(f"{server.url}/generate", data=json.dumps(payload).encode(),
                                 headers={"content-type": "application/json"})
    last = None
    with urllib.request.urlopen(req, timeout=900) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                last = json.loads(line[5:])
                progress[i] = len(last["output_ids"])
    out[i] = last["output_ids"]


def _streams_with_fault(server, prompts, n, fault, rids=None) -> tuple[list, list[int]]:
    """Stream ``prompts`` greedily; call ``fault()`` once every stream has produced a few tokens.
    Returns the outputs and each stream's length when the fault struck."""
    out, progress = [None] * len(prompts), [0] * len(prompts)
    threads = [threading.Thread(target=_stream, args=(server, ids, n, out, progress, i, rids[i] if rids else None))
               for i, ids in enumerate(prompts)]  # fmt: skip
    for t in threads:
        t.start()
    deadline = time.monotonic() + 600
    while min(progress) < 4 and time.monotonic() < deadline and any(t.is_alive() for t in threads):
        time.sleep(0.05)
    at_fault = list(progress)
    fault()
    for t in threads:
        t.join(timeout=900)
    return out, at_fault


def _state(server) -> dict:
    return server.get("/server_info")["internal_states"][0]


def _draft_hits(endpoint: str) -> int:
    with DraftClient(endpoint, timeout_s=30) as client:
        return client.stats().get("hits", 0)


@pytest.fixture(scope="module")
def ar_streamed(ar_server, equality_prompts) -> list[list[int]]:
    """AR greedy continuations of the first 8 prompts (the reference of every fault test here)."""
    return [greedy_tokens(ar_server, ids, STREAM_TOKENS)[0] for ids in equality_prompts[:8]]


def test_garbage_on_the_draft_endpoint_does_not_stop_serving(ssd_server, ssd_draft, equality_prompts, hf_greedy):
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(ssd_draft.endpoint)
    for junk in (b"\x00" * 10, b"not msgpack", b"\xff" * 4096, b""):
        sock.send_multipart([junk, b"\x01\x02"])
    sock.close()
    got, meta = greedy_tokens(ssd_server, equality_prompts[0])
    assert got == hf_greedy[0]
    assert ssd_draft.proc.poll() is None, "the draft server died on garbage"


def test_killing_the_draft_server_mid_stream_loses_nothing(ssd_server, ssd_draft, equality_prompts, ar_streamed):
    prompts = equality_prompts[:8]
    faults = _state(ssd_server)["ssd_faults"]
    out, at_kill = _streams_with_fault(ssd_server, prompts, STREAM_TOKENS, ssd_draft.kill)
    assert min(at_kill) < STREAM_TOKENS, f"every stream had finished before the kill: {at_kill}"
    assert out == ar_streamed, "outputs differ from AR after the draft server died"
    assert _state(ssd_server)["ssd_faults"] > faults, "the draft server's death was never noticed"

    # Back on the same endpoint: the link reconnects and speculation resumes with cache hits, which
    # the counters show as hits gained after the restart (not the total, which was already positive).
    ssd_draft.start()
    before = _state(ssd_server)
    for ids in prompts[:4]:
        greedy_tokens(ssd_server, ids, STREAM_TOKENS)
    after = _state(ssd_server)
    assert after["ssd_reconnects"] > before["ssd_reconnects"] or after["ssd_draft_servers_up"] == 1
    assert after["ssd_hits"] > before["ssd_hits"], "no cache hit after the draft server came back"
    assert _draft_hits(ssd_draft.endpoint) > 0, "the restarted draft server served no hit"


def test_stalled_draft_server_mid_stream_loses_nothing_and_speculation_resumes(
    ssd_server, ssd_draft, equality_prompts, ar_streamed
):
    """SIGSTOP: the process lives but answers nothing, past --ssd-draft-timeout (3 s); SIGCONT brings
    it back with the requests it held, which the link re-opens."""
    prompts = equality_prompts[:8]
    faults = _state(ssd_server)["ssd_faults"]
    try:
        out, at_stop = _streams_with_fault(ssd_server, prompts, STREAM_TOKENS, ssd_draft.pause)
        stalled = _state(ssd_server)
    finally:
        ssd_draft.resume()
    assert min(at_stop) < STREAM_TOKENS, f"every stream had finished before the stop: {at_stop}"
    assert out == ar_streamed, "outputs differ from AR while the draft server was stopped"
    assert stalled["ssd_faults"] > faults, "the stall was never noticed"

    for ids in prompts[:4]:
        greedy_tokens(ssd_server, ids, STREAM_TOKENS)
    after = _state(ssd_server)
    assert after["ssd_hits"] > stalled["ssd_hits"], "no cache hit after SIGCONT"
    assert after["ssd_draft_servers_up"] == 1


@pytest.fixture(scope="module")
def law_prompts_and_greedy(law_model) -> tuple[list[list[int]], list[list[int]]]:
    """8 prompts of the law model and their greedy continuations (transformers, fp32). A prompt is
    kept only if every step of its continuation has a clear winner (top-2 logit gap > 1e-3), so a
    rounding difference between SGLang's forward and this one cannot flip a token."""
    import torch

    g = torch.Generator().manual_seed(5)
    prompts, refs = [], []
    while len(prompts) < 8:
        ids = torch.randint(0, law_model.config.vocab_size, (12,), generator=g).tolist()
        x, gaps = list(ids), []
        with torch.inference_mode():
            for _ in range(STREAM_TOKENS):
                logits = law_model(torch.tensor([x])).logits[0, -1]
                top = torch.topk(logits, 2)
                gaps.append(float(top.values[0] - top.values[1]))
                x.append(int(top.indices[0]))
        if min(gaps) > 1e-3:
            prompts.append(ids)
            refs.append(x[len(ids):])
    return prompts, refs


def test_one_of_several_draft_servers_killed_mid_stream(self_server, self_drafts, law_prompts_and_greedy):
    """Requests spread by hash over several draft endpoints (--ssd-draft-endpoint per server); one
    is killed mid-stream: output stays equal to greedy decoding, and the survivor keeps serving hits."""
    prompts, reference = law_prompts_and_greedy
    # Half the requests hash to the draft server that dies, half to one that survives.
    dying, survivor = self_drafts["fast"], self_drafts["neural"]
    rids = [r for pair in zip(rids_for(self_drafts, "fast", 4, "kill"), rids_for(self_drafts, "neural", 4, "kill"))
            for r in pair]  # fmt: skip
    faults = _state(self_server)["ssd_faults"]
    hits_at_kill = []

    def kill():
        hits_at_kill.append(_draft_hits(survivor.endpoint))
        dying.kill()

    try:
        out, at_kill = _streams_with_fault(self_server, prompts, STREAM_TOKENS, kill, rids)
        after = _state(self_server)
        assert min(at_kill) < STREAM_TOKENS, f"every stream had finished before the kill: {at_kill}"
        assert out == reference, "outputs differ from greedy decoding after one draft server died"
        assert after["ssd_faults"] > faults, "the death was never noticed"
        assert after["ssd_draft_servers_up"] == len(self_drafts) - 1
        assert _draft_hits(survivor.endpoint) > hits_at_kill[0], "the surviving draft server stopped hitting"
    finally:
        dying.start()  # the sampling tests use it later
    # The restarted one is used again for the requests that hash to it (the link pings a server it
    # marked down at most every RETRY_S seconds, when a request needs it).
    time.sleep(RETRY_S + 0.5)
    out = self_server.generate(prompts[0], {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True},
                               rid=rids_for(self_drafts, "fast", 1, "back")[0])
    assert out["output_ids"] == reference[0][:16]
    assert any(d > 0 for d in out["meta_info"]["ssd_drafted"]), "the restarted draft server was not used again"
