"""The served target runs its linears and logits head on the CPU linear route the tests expect."""

from __future__ import annotations

import pytest

from sglang_ssd.cpu import linear as cpu_linear
from tests.e2e.conftest import greedy_tokens

pytestmark = pytest.mark.server


def test_the_scheduler_runs_the_expected_linear_route(ar_server, equality_prompts):
    # The route is decided at the first linear call, so its line proves the hooks ran in the server.
    greedy_tokens(ar_server, equality_prompts[0], 4)
    log = ar_server.log_path.read_text(errors="replace")
    assert f"sglang_ssd: CPU linear route: {cpu_linear.route()} " in log, log[-2000:]
