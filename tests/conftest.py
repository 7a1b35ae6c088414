"""Run order: every test without a real SGLang server first, then tests/e2e grouped by server.

The e2e servers are session fixtures (each kind starts once per run); tests/e2e/conftest.py stops each
one after the last test that uses it. Grouping the e2e tests by server keeps only `ar_server` and one
group's servers resident at a time, which on a 2-core, 24 GiB machine is the difference between tests
that time what they mean to and tests that wait on a starved or swapping draft server.
"""

from __future__ import annotations

import pytest

# setuptools swaps the standard library's distutils for its own the first time it is imported, and
# asserts the swap took. Imported first inside a run (by torch's inductor, compiling SGLang's penalty
# code in tests/algo after the whole tree was collected), it found the standard distutils already in
# place and failed three law cases; importing it here, before any test module, keeps the swap clean.
import setuptools  # noqa: F401,E402

# The heavy servers of tests/e2e, in the order their groups run. A test belongs to the group of the
# first of these it uses; tests using none of them (AR only) run before the groups.
SERVER_GROUPS = ("ngram_server", "sd_server", "ssd_server", "ssd3_server", "ssd_auto_server", "self_server",
                 "law_auto_server", "law_tp2_server", "law_dp2_server", "feature_ssd_server", "workers_server")


def _order_key(index: int, item: pytest.Item) -> tuple[int, int, int, int]:
    if "e2e" not in item.nodeid.split("::")[0].split("/"):
        return (0, 0, 0, index)
    names = set(getattr(item, "fixturenames", ()))
    group = next((i + 1 for i, name in enumerate(SERVER_GROUPS) if name in names), 0)
    # A test that reshapes a shared server's learned state (auto-K's estimates after a 64-client soak
    # park drafting for up to ~1000 rounds) goes after the tests that expect a fresh server.
    last = 1 if item.get_closest_marker("leaves_state") else 0
    return (1, group, last, index)


@pytest.hookimpl(trylast=True)  # after -m / -k deselection: only the tests that will run are ordered
def pytest_collection_modifyitems(session, config, items):
    keyed = sorted(enumerate(items), key=lambda pair: _order_key(*pair))
    items[:] = [item for _, item in keyed]
