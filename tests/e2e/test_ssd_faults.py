"""Faults: a dead or babbling draft server never costs output or availability."""

from __future__ import annotations

import json
import threading
import time
import urllib.request

import zmq

from tests.e2e.conftest import greedy_tokens


def _stream(server, ids, n, out, i):
    payload = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True},
               "stream": True}
    req = urllib.request.Request(f"{server.url}/generate", data=json.dumps(payload).encode(),
                                 headers={"content-type": "application/json"})
    last = None
    with urllib.request.urlopen(req, timeout=900) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                last = json.loads(line[5:])
    out[i] = last["output_ids"]


def _hit_rate(server):
    return server.get("/server_info")["internal_states"][0]["ssd_hit_rate"]


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


def test_killing_the_draft_server_mid_stream_loses_nothing(ssd_server, ssd_draft, ar_server, equality_prompts):
    prompts = equality_prompts[:8]
    n = 48
    ar = [greedy_tokens(ar_server, ids, n)[0] for ids in prompts]
    out = [None] * len(prompts)
    threads = [threading.Thread(target=_stream, args=(ssd_server, ids, n, out, i)) for i, ids in enumerate(prompts)]
    for t in threads:
        t.start()
    time.sleep(3.0)
    ssd_draft.kill()
    for t in threads:
        t.join(timeout=900)
    assert out == ar, "outputs differ from AR after the draft server died"
    faults = ssd_server.get("/server_info")["internal_states"][0]["ssd_faults"]
    assert faults > 0, "the draft server's death was never noticed (it should have been)"

    # Back on the same endpoint: the link reconnects and speculation resumes with cache hits.
    ssd_draft.start()
    before = ssd_server.get("/server_info")["internal_states"][0]
    for ids in prompts[:4]:
        greedy_tokens(ssd_server, ids, 48)
    after = ssd_server.get("/server_info")["internal_states"][0]
    assert after["ssd_reconnects"] > before["ssd_reconnects"] or after["ssd_draft_servers_up"] == 1
    assert after["ssd_rounds"] > before["ssd_rounds"]
    assert _hit_rate(ssd_server) > 0.0
