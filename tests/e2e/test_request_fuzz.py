"""Bad input never takes the SSD server down: malformed and extreme-but-valid requests on /generate and
the OpenAI routes (tests/e2e/fuzz_requests.py), then the server still answers and its greedy outputs
are what they were. Any status is accepted for a fuzzed request; a dead process or a changed answer is
not. Prints ``requests fuzzed: N, server alive: yes, outputs unchanged: yes``."""

from __future__ import annotations

import json
import random
import urllib.error
import urllib.request

import pytest

from tests.e2e import features as F
from tests.e2e import fuzz_requests as FZ

pytestmark = pytest.mark.server

RANDOM_CASES = 60


def send(url: str, route: str, body) -> int:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + route, data=data, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


def answers(url: str) -> list:
    return [F.finish(o) for o in F.gen(url, F.greedy(), text=F.PROMPTS)]


def test_request_fuzz_leaves_the_server_alive_and_unchanged(feature_ssd_server, feature_context):
    server, url = feature_ssd_server, feature_ssd_server.url
    before = answers(url)
    vocab, hidden = 49152, len(feature_context["embeds"][0])
    cases = FZ.fixed_cases(vocab, hidden) + FZ.random_cases(random.Random(0), RANDOM_CASES, vocab)
    statuses = {}
    for route, body in cases:
        status = send(url, route, body)
        statuses[status] = statuses.get(status, 0) + 1
        assert server.proc.poll() is None, f"the server died on {route} {str(body)[:200]}"
        assert status < 500 or status == 503, f"{route} {str(body)[:200]} -> HTTP {status}"
    for route, body in FZ.STREAMED:  # huge: cut after the first event (which aborts them), or refused
        try:
            F.stream(url, route, body, stop_after=1)
        except F.Refused as refused:
            assert refused.status < 500, f"{route} {body} -> HTTP {refused.status}"
        assert server.proc.poll() is None, f"the server died on {route} {body}"
    with urllib.request.urlopen(f"{url}/health_generate", timeout=120) as r:
        assert r.status == 200
    after = answers(url)
    n = len(cases) + len(FZ.STREAMED)
    print(f"\nrequests fuzzed: {n}, server alive: yes, outputs unchanged: {'yes' if after == before else 'no'} "
          f"(statuses {dict(sorted(statuses.items()))})")
    assert after == before
