"""Messages and tensor frames: round trips, and strict refusal of anything off-protocol."""

from __future__ import annotations

import msgspec
import pytest
import torch

from sglang_ssd.algo.probs import SparseProbs
from sglang_ssd.wire.codec import Limits, decode_reply, decode_request, encode_reply, encode_request
from sglang_ssd.wire.messages import (
    PROTOCOL_VERSION,
    Close,
    CloseAll,
    Draft,
    DraftParams,
    ErrorReply,
    Heartbeat,
    Open,
    OpenMany,
    OutcomeMsg,
    Round,
    Speculations,
    StatsQuery,
)
from sglang_ssd.wire.speculation import Speculation, compact_q, msg_to_spec, spec_to_msg
from sglang_ssd.wire.tensors import FrameReader, FrameWriter, WireError

BODIES = [
    Open(rid="a", prompt_tokens=[1, 2, 3], first_token=4, params=DraftParams(temperature=0.7, top_k=20, seed=5)),
    OpenMany(opens=[Open(rid="a", prompt_tokens=[1, 2], first_token=4),
                    Open(rid="b", prompt_tokens=[5], first_token=6, params=DraftParams(seed=2))]),  # fmt: skip
    Round(outcomes=[OutcomeMsg(rid="a", accepted=2, bonus=9, spec_id=3), OutcomeMsg(rid="b", accepted=0, bonus=1)]),
    Draft(rids=["a", "b"]),
    Close(rids=["a"], abort=True),
    CloseAll(),
    Heartbeat(),
    StatsQuery(reset=True),
]


@pytest.mark.parametrize("body", BODIES, ids=lambda b: type(b).__name__)
def test_request_round_trip(body):
    env, reader = decode_request(encode_request(7, "client-1", body), Limits())
    assert env.seq == 7 and env.client == "client-1" and env.v == PROTOCOL_VERSION
    assert env.body == body


def _raw(body: dict, v: int = PROTOCOL_VERSION) -> list[bytes]:
    return [msgspec.msgpack.encode({"v": v, "seq": 3, "client": "c", "body": body})]


@pytest.mark.parametrize(
    "body,fragment",
    [
        ({"type": "open", "rid": "a", "prompt_tokens": [1], "first_token": 2, "extra": 1}, "unknown field"),
        ({"type": "open", "rid": "a", "prompt_tokens": "abc", "first_token": 2}, "Expected `array`"),
        ({"type": "open", "rid": "a", "prompt_tokens": [-1], "first_token": 2}, ">= 0"),
        ({"type": "open", "rid": "", "prompt_tokens": [1], "first_token": 2}, "length >= 1"),
        ({"type": "open", "rid": "a", "prompt_tokens": [], "first_token": 2}, "length >= 1"),
        ({"type": "round", "outcomes": [{"rid": "a", "accepted": -1, "bonus": 0}]}, ">= 0"),
        ({"type": "round", "outcomes": [{"rid": "a", "accepted": 1}]}, "missing required field"),
        ({"type": "launch_missiles"}, "Invalid value"),
        ({"type": "open_many", "opens": []}, "length >= 1"),
        ({"type": "open_many", "opens": [{"type": "open", "rid": "a", "prompt_tokens": [1], "first_token": 2,
                                          "x": 0}]}, "unknown field"),
        ({"type": "open", "rid": "a", "prompt_tokens": [1], "first_token": 2,
          "params": {"temperature": -1.0}}, ">= 0"),
        ({"type": "open", "rid": "a", "prompt_tokens": [1], "first_token": 2, "params": {"top_p": 0}}, "> 0"),
    ],
)
def test_strict_decoding_refuses(body, fragment):
    with pytest.raises(WireError) as e:
        decode_request(_raw(body), Limits())
    assert e.value.code == "bad_message"
    assert fragment in str(e.value)


def test_version_and_garbage():
    with pytest.raises(WireError) as e:
        decode_request(_raw({"type": "heartbeat"}, v=PROTOCOL_VERSION + 1), Limits())
    assert e.value.code == "version"
    for junk in (b"", b"\xc1", b"not msgpack at all", msgspec.msgpack.encode([1, 2, 3])):
        with pytest.raises(WireError):
            decode_request([junk], Limits())
    with pytest.raises(WireError):
        decode_request([], Limits())


def test_size_limits():
    small = Limits(max_header_bytes=100, max_tensor_bytes=64, max_message_bytes=1000, max_frames=3)
    big = encode_request(1, "c", Open(rid="a", prompt_tokens=list(range(200)), first_token=1))
    with pytest.raises(WireError) as e:
        decode_request(big, small)
    assert e.value.code == "too_large"
    hb = encode_request(1, "c", Heartbeat())
    with pytest.raises(WireError) as e:
        decode_request(hb + [b"x"] * 3, small)
    assert e.value.code == "too_large"
    with pytest.raises(WireError) as e:
        decode_request(hb + [b"x" * 999], small)
    assert e.value.code == "too_large"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.bool])
def test_tensor_frames_round_trip(dtype):
    t = (torch.randn(3, 5) * 10).to(dtype)
    w = FrameWriter()
    ref = w.add(t)
    back = FrameReader(w.frames, 1 << 20).get(ref, "t")
    assert back.dtype == dtype and torch.equal(back, t)


def test_tensor_frame_checks():
    w = FrameWriter()
    ref = w.add(torch.zeros(4, 4))
    with pytest.raises(WireError, match="bytes"):
        FrameReader([w.frames[0][:-4]], 1 << 20).get(ref, "t")
    with pytest.raises(WireError, match="missing"):
        FrameReader([], 1 << 20).get(ref, "t")
    with pytest.raises(WireError, match="limit"):
        FrameReader(w.frames, 16).get(ref, "t")
    bad = msgspec.structs.replace(ref, dtype="complex128")
    with pytest.raises(WireError, match="dtype"):
        FrameReader(w.frames, 1 << 20).get(bad, "t")
    reader = FrameReader(w.frames, 1 << 20)
    reader.get(ref, "t")
    with pytest.raises(WireError, match="twice"):
        reader.get(ref, "t")


def _round_trip(spec: Speculation) -> Speculation:
    w = FrameWriter()
    msg = spec_to_msg(spec, w)
    frames = encode_reply(5, Speculations(specs=[msg]), w.frames)
    env, reader = decode_reply(frames, Limits())
    return msg_to_spec(env.body.specs[0], reader)


def test_speculation_forms():
    v = 1000
    tokens = torch.tensor([5, 7, 9])
    dense = torch.softmax(torch.randn(3, v), -1)
    back = _round_trip(Speculation("a", True, tokens, dense, None, 4))
    assert back.hit and back.spec_id == 4 and torch.equal(back.tokens, tokens)
    assert isinstance(back.q, torch.Tensor) and torch.equal(back.q, dense)
    # A truncated dense q′ goes sparse on the wire and comes back as the same distribution.
    trunc = torch.zeros(3, v)
    trunc[:, :4] = torch.tensor([0.4, 0.3, 0.2, 0.1])
    back = _round_trip(Speculation("a", False, tokens, trunc))
    assert isinstance(back.q, SparseProbs) and back.q.support == 4
    assert torch.equal(back.q.to_dense(), trunc)
    sparse = SparseProbs(torch.tensor([[1], [2], [3]]), torch.ones(3, 1), v)
    back = _round_trip(Speculation("a", False, tokens, sparse))
    assert torch.equal(back.q.indices, sparse.indices) and back.q.vocab_size == v
    back = _round_trip(Speculation("a", False, tokens, None))
    assert back.q is None
    back = _round_trip(Speculation("a", False, torch.empty(0, dtype=torch.int64), None, "unknown request id"))
    assert back.error == "unknown request id" and back.tokens.numel() == 0


def test_compact_q_keeps_dense_when_wide():
    q = torch.softmax(torch.randn(2, 100), -1)
    assert compact_q(q) is q
    assert isinstance(compact_q(torch.eye(100)[:2]), SparseProbs)


def test_error_reply_decodes():
    env, _ = decode_reply(encode_reply(9, ErrorReply(code="too_large", message="x")), Limits())
    assert env.seq == 9 and env.body.code == "too_large"
