"""DraftLink's opens: the new requests of a step go out in messages of bounded prompt size, one server's
requests never reach another, and a refused request stays unopened (the next step opens it again)."""

from __future__ import annotations

import torch

from sglang_ssd.target.draft_link import OPEN_TOKENS_PER_MESSAGE, DraftLink
from sglang_ssd.target.ssd_config import SSDConfig
from sglang_ssd.wire import DraftParams
from sglang_ssd.wire.speculation import Speculation


class FakeClient:
    def __init__(self, refuse: set[str] = frozenset()):
        self.messages: list[list[str]] = []
        self.refuse = refuse

    def open_many(self, opens):
        self.messages.append([o[0] for o in opens])
        return [Speculation(o[0], False, torch.empty(0, dtype=torch.int64), None, "full") if o[0] in self.refuse
                else Speculation(o[0], False, torch.tensor([1, 2]), None, None) for o in opens]  # fmt: skip


def _link(n: int, refuse: set[str] = frozenset()) -> DraftLink:
    link = DraftLink(SSDConfig(draft_endpoints=[f"ipc:///tmp/none-{i}.sock" for i in range(n)]))
    link.clients = [FakeClient(refuse) for _ in range(n)]
    return link


def test_opens_are_packed_into_messages_of_bounded_prompt_size():
    link = _link(1)
    sizes = [100, 300, 200, 600, 50, 10]
    opens = [(f"r{i}", [1] * n, 2, DraftParams()) for i, n in enumerate(sizes)]
    specs = link.open_many(opens)
    assert [s.rid for s in specs] == [o[0] for o in opens]
    messages = link.clients[0].messages
    assert [m for msg in messages for m in msg] == [o[0] for o in opens]  # order kept
    for msg in messages:
        total = sum(sizes[int(rid[1:])] for rid in msg)
        assert total <= OPEN_TOKENS_PER_MESSAGE or len(msg) == 1, (msg, total)
    assert messages == [["r0", "r1"], ["r2"], ["r3"], ["r4", "r5"]]
    assert all(link.is_open(o[0]) for o in opens)


def test_each_server_gets_only_its_requests_and_refusals_stay_unopened():
    link = _link(3, refuse={"r5"})
    opens = [(f"r{i}", [1, 2], 3, DraftParams()) for i in range(12)]
    specs = link.open_many(opens)
    for i, client in enumerate(link.clients):
        assert all(link.shard(rid) == i for msg in client.messages for rid in msg)
        assert len(client.messages) <= 1
    assert specs[5].error == "full" and not link.is_open("r5")
    assert all(link.is_open(o[0]) for o in opens if o[0] != "r5")
