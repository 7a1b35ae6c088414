"""Tensor and data parallel through whole SGLang servers on this CPU, on the law model
(tests/e2e/law_model.py): greedy output equal to plain decoding, 16 prompts, 8 at a time.

- ``--tp-size 2`` (one rank per core, gloo; SGLANG_CPU_OMP_THREADS_BIND="0|1", which SGLang's CPU
  engine needs for more ranks than NUMA nodes) with a draft server the test owns: it is killed while
  the first 8 streams run, then restarted; the next 8 are served with speculation again.
- ``--dp-size 2``: two replicas, one draft server started by the launcher, serving both.
"""

from __future__ import annotations

import time

import pytest

from tests.e2e.conftest import LAW_SERVER_ARGS, DraftProcess, held, start_server
from tests.e2e.law_model import clear_greedy
from tests.e2e.test_ssd_faults import _state, _streams_with_fault

pytestmark = pytest.mark.server

NEW_TOKENS = 24
TWO_RANKS = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}


@pytest.fixture(scope="module")
def scale_prompts(law_model) -> list[tuple[list[int], list[int]]]:
    return clear_greedy(law_model, 16, 20, NEW_TOKENS, seed=23)


@pytest.fixture(scope="module")
def tp2_draft(law_path):
    proc = DraftProcess(law_path, name="tp2", k=2, budget=4).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def law_tp2_server(law_path, tp2_draft):
    server = start_server(
        law_path, "--speculative-algorithm", "SSD", "--ssd-draft-endpoint", tp2_draft.endpoint, "--ssd-k", "2",
        "--tp-size", "2", *LAW_SERVER_ARGS, log_name="law_tp2", env=TWO_RANKS,
    )  # fmt: skip
    held("law_tp2_server", server.stop)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def law_dp2_server(law_path):
    server = start_server(
        law_path, "--speculative-algorithm", "SSD", "--speculative-draft-model-path", str(law_path), "--ssd-k", "2",
        "--ssd-budget", "4", "--dp-size", "2", *LAW_SERVER_ARGS, log_name="law_dp2", env=TWO_RANKS,
    )  # fmt: skip
    held("law_dp2_server", server.stop)
    yield server
    server.stop()


def test_tp2_matches_greedy_through_a_draft_server_restart(law_tp2_server, tp2_draft, scale_prompts):
    prompts = [p for p, _ in scale_prompts]
    want = [w for _, w in scale_prompts]
    before = _state(law_tp2_server)
    first, at_kill = _streams_with_fault(law_tp2_server, prompts[:8], NEW_TOKENS, tp2_draft.kill)
    killed = _state(law_tp2_server)
    assert min(at_kill) < NEW_TOKENS, f"every stream had finished before the kill: {at_kill}"
    assert first == want[:8], "TP = 2 output differs from greedy decoding around the draft server's death"
    assert killed["ssd_faults"] > before["ssd_faults"], "the death was never noticed"
    assert killed["ssd_hits"] > before["ssd_hits"], "no speculation before the kill"

    tp2_draft.start()
    _wait_for_reconnect(law_tp2_server, killed["ssd_reconnects"], prompts[8])
    second, _ = _streams_with_fault(law_tp2_server, prompts[8:], NEW_TOKENS, lambda: None)
    after = _state(law_tp2_server)
    assert second == want[8:], "TP = 2 output differs from greedy decoding after the restart"
    assert after["ssd_hits"] > killed["ssd_hits"], "no cache hit after the draft server came back"


def _wait_for_reconnect(server, reconnects: int, prompt: list[int], timeout_s: float = 60.0) -> None:
    """Short requests until the target's link has found the restarted draft server (it retries a
    down server every couple of seconds): otherwise a fast batch can finish before the link looks."""
    deadline = time.monotonic() + timeout_s
    while _state(server)["ssd_reconnects"] <= reconnects:
        assert time.monotonic() < deadline, f"the link did not find the restarted draft server in {timeout_s:.0f} s"
        server.generate(prompt, {"max_new_tokens": 4, "temperature": 0})
        time.sleep(0.5)


def test_dp2_matches_greedy_and_both_replicas_speculate(law_dp2_server, scale_prompts):
    prompts = [p for p, _ in scale_prompts]
    before = law_dp2_server.get("/server_info")["internal_states"]
    out, _ = _streams_with_fault(law_dp2_server, prompts[:8], NEW_TOKENS, lambda: None)
    out2, _ = _streams_with_fault(law_dp2_server, prompts[8:], NEW_TOKENS, lambda: None)
    assert out + out2 == [w for _, w in scale_prompts], "DP = 2 output differs from greedy decoding"
    after = law_dp2_server.get("/server_info")["internal_states"]
    assert len(after) == 2, f"expected two replicas' states, got {len(after)}"
    gained = [a.get("ssd_hits", 0) - b.get("ssd_hits", 0) for a, b in zip(after, before)]
    assert sum(gained) > 0, f"no cache hit on either replica: {gained}"
