"""SGLang frontend programs give the same results on the SSD server as on the AR server (T = 0)."""

from __future__ import annotations

import json
import re

import pytest

from tests.e2e.frontend_programs import run_all

pytestmark = pytest.mark.server  # starts real SGLang servers


def test_frontend_programs_equal_ar(ssd_server, ar_server):
    ar = run_all(ar_server.url)
    ssd = run_all(ssd_server.url)
    assert ssd == ar
    # The constrained outputs really follow their grammars (regex / JSON via xgrammar).
    assert re.fullmatch(r"[0-9]{3}-[0-9]{3}-[0-9]{4}", ssd["regex"]), ssd["regex"]
    assert isinstance(json.loads(ssd["json"])["population"], int)
    assert ssd["select"][0] in ("True", "False")
    assert len(ssd["stream"]) > 0
