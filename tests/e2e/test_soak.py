"""A small soak through a real SSD server with `--ssd-k auto`: 64 concurrent streaming clients in a
closed loop for SOAK_S seconds, prompts of three lengths (one open message, several packed in one,
and longer than one message's prompt-token pack), arriving in one burst at the start.

Checks: every request completes with greedy output equal to the law model's own greedy decoding; the
scheduler's and the draft server's resident memory after warm-up grows by less than 5 %; afterwards the
draft server holds no request and no KV slot. The draft's KV pool is reserved untouched and its pages
become resident as extents are first handed out: that part grows toward the pool's fixed size as
fragmentation and new tree shapes (auto-K's explorations) reach further into it, so the draft server's
growth is measured outside the pool's touched bytes (which its stats report). The target is the law model (tests/e2e/law_model.py),
so the soak's cost is the serving path's, not the model's. The full-size soak (the real target, 5
minutes, AR/SD/SSD latency percentiles) is bench/soak.py.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.server

CLIENTS = 64
SOAK_S = 60.0
WARMUP_S = 15.0
NEW_TOKENS = 24
PROMPT_LENGTHS = (12, 160, 700)  # 700 > the 512 prompt tokens one open message packs
MAX_RSS_GROWTH = 0.05


@pytest.fixture(scope="module")
def soak_prompts(law_model) -> list[tuple[list[int], list[int]]]:
    """(prompt, greedy continuation) pairs, 8 per length, each with a clear winner at every step (top-2
    logit gap > 1e-3) so a rounding difference cannot flip a token."""
    g = torch.Generator().manual_seed(17)
    out: list[tuple[list[int], list[int]]] = []
    for length in PROMPT_LENGTHS:
        kept = 0
        while kept < 8:
            ids = torch.randint(0, law_model.config.vocab_size, (length,), generator=g).tolist()
            x, ok = torch.tensor([ids]), True
            with torch.inference_mode():
                for _ in range(NEW_TOKENS):
                    logits = law_model(x).logits[0, -1]
                    top = torch.topk(logits, 2)
                    ok &= float(top.values[0] - top.values[1]) > 1e-3
                    x = torch.cat([x, top.indices[:1][None]], 1)
            if ok:
                out.append((ids, x[0, length:].tolist()))
                kept += 1
    return out


def _stream(url: str, ids: list[int]) -> list[int]:
    payload = {"input_ids": ids, "stream": True,
               "sampling_params": {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}}
    req = urllib.request.Request(f"{url}/generate", data=json.dumps(payload).encode(),
                                 headers={"content-type": "application/json"})  # fmt: skip
    last = None
    with urllib.request.urlopen(req, timeout=300) as r:
        for line in r:
            line = line.decode().strip()
            if line.startswith("data:") and line != "data: [DONE]":
                last = json.loads(line[5:])
    return last["output_ids"]


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _pool_touched_kb(server) -> int:
    return server.get("/server_info")["internal_states"][0]["ssd_draft_server"]["kv_pool_touched_bytes"] // 1024


def _processes(root: int) -> dict[str, int]:
    """The scheduler and the draft server among the launcher's descendants: name -> pid."""
    import psutil

    found = {}
    for p in psutil.Process(root).children(recursive=True):
        cmd = " ".join(p.cmdline())
        if "scheduler" in p.name() or "scheduler" in cmd:
            found["scheduler"] = p.pid
        elif "sglang_ssd.draft_server" in cmd:
            found["draft server"] = p.pid
    return found


@pytest.mark.leaves_state  # its batch-64 rounds teach auto-K that plain decoding wins there
def test_soak_64_clients_auto_k(law_auto_server, soak_prompts):
    procs = _processes(law_auto_server.proc.pid)
    before = law_auto_server.get("/server_info")["internal_states"][0]
    assert set(procs) == {"scheduler", "draft server"}, procs
    stop_at = time.monotonic() + SOAK_S
    done, wrong, errors, lock = [0], [], [], threading.Lock()

    def client(i: int) -> None:
        n = i
        while time.monotonic() < stop_at:
            ids, want = soak_prompts[n % len(soak_prompts)]
            n += CLIENTS
            try:
                got = _stream(law_auto_server.url, ids)
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                with lock:
                    errors.append(repr(e))
                return
            with lock:
                done[0] += 1
                if got != want:
                    wrong.append((len(ids), got, want))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for t in threads:  # all at once: a burst of arrivals
        t.start()
    time.sleep(WARMUP_S)
    rss_warm = {name: _rss_kb(pid) for name, pid in procs.items()}
    pool_warm = _pool_touched_kb(law_auto_server)
    rss_warm["draft server"] -= pool_warm
    for t in threads:
        t.join(timeout=SOAK_S + 300)
    rss_end = {name: _rss_kb(pid) for name, pid in procs.items()}
    pool_end = _pool_touched_kb(law_auto_server)
    rss_end["draft server"] -= pool_end

    growth = {name: rss_end[name] / rss_warm[name] - 1 for name in procs}
    after = law_auto_server.get("/server_info")["internal_states"][0]
    chosen = [a - b for a, b in zip(after["ssd_auto_k_chosen"], before["ssd_auto_k_chosen"])]
    print(f"soak: {done[0]} requests in {SOAK_S:.0f} s at concurrency {CLIENTS}, {len(errors)} failed, "
          f"RSS growth " + ", ".join(f"{k} {100 * v:.1f} %" for k, v in growth.items())
          + f" (outside its KV pool, whose touched part went {pool_warm / 1024:.0f} -> {pool_end / 1024:.0f} MB)"
          + f"; auto-K rounds by K {chosen}, cache hits {after['ssd_hits'] - before['ssd_hits']}")  # fmt: skip
    assert not errors, f"{len(errors)} requests failed: {errors[:3]}"
    assert not any(t.is_alive() for t in threads), "a client never finished"
    assert done[0] >= CLIENTS, f"only {done[0]} requests completed"
    assert not wrong, f"{len(wrong)} of {done[0]} outputs differ from greedy decoding, e.g. {wrong[0]}"
    assert all(g < MAX_RSS_GROWTH for g in growth.values()), f"resident memory grew: {growth}"
    state = law_auto_server.get("/server_info")["internal_states"][0]
    deadline = time.monotonic() + 30
    while state["ssd_draft_server"].get("requests_open", 0) and time.monotonic() < deadline:
        time.sleep(1)  # closes travel with the worker's next messages
        state = law_auto_server.get("/server_info")["internal_states"][0]
    assert state["ssd_draft_server"]["requests_open"] == 0, state["ssd_draft_server"]
    assert state["ssd_draft_server"]["kv_slots_used"] == 0, state["ssd_draft_server"]
    # the 160- and 700-token prompts went through the background prefill, exactly all the same
    assert state["ssd_draft_server"].get("background_prefills", 0) > 0, state["ssd_draft_server"]
