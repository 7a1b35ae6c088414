"""The draft-server protocol: msgspec structs carried as one msgpack header frame per ZeroMQ message.

A message is a multipart ZeroMQ message ``[header, tensor frame 0, tensor frame 1, ...]``. The header
is an :class:`Envelope` (client → server) or a :class:`ReplyEnvelope` (server → client), msgpack-encoded
and decoded strictly: unknown fields, wrong types or out-of-range values are errors, never guesses.
Tensors never travel inside the header; a :class:`TensorRef` names the frame holding the raw
little-endian bytes plus its dtype and shape (see ``wire/tensors.py``).

Every request carries the protocol version ``v`` and a sequence number ``seq`` that the reply echoes,
so a client can drop a late reply to a request it already gave up on.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

#: Bumped on any incompatible change of the structs below.
PROTOCOL_VERSION = 1

#: Semantic limits enforced at decode time (the byte-size limits live in ``wire/codec.py``).
MAX_RID_CHARS = 256
MAX_PROMPT_TOKENS = 1 << 20
MAX_BATCH = 4096
MAX_TOKEN_ID = (1 << 31) - 1

Rid = Annotated[str, Meta(min_length=1, max_length=MAX_RID_CHARS)]
TokenId = Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]
Seed = Annotated[int, Meta(ge=0, le=(1 << 63) - 1)]
Temperature = Annotated[float, Meta(ge=0.0, le=1e4)]


class _Strict(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Base of every wire struct: an unknown field is a decode error, not silently dropped."""


class TensorRef(_Strict, frozen=True):
    """Where a tensor lives: ``frame`` indexes the frames after the header; dtype name and shape."""

    frame: Annotated[int, Meta(ge=0)]
    dtype: str
    shape: list[Annotated[int, Meta(ge=0)]]


class DraftParams(_Strict):
    """A request's sampling settings, as the target samples (the draft mirrors them).

    ``temperature`` 0 ⇒ greedy; ``top_k`` ≤ 0 ⇒ off; ``top_p`` 1 ⇒ off; ``min_p`` 0 ⇒ off.
    ``seed``: the draft's sampling seed (None ⇒ the server picks one); drafted tokens are a
    deterministic function of (seed, absolute position, context).
    ``draft_temperature``: the draft's own temperature (None ⇒ ``temperature``).
    """

    temperature: Temperature = 0.0
    top_k: int = 0
    top_p: Annotated[float, Meta(gt=0.0, le=1.0)] = 1.0
    seed: Seed | None = None
    draft_temperature: Temperature | None = None
    min_p: Annotated[float, Meta(ge=0.0, le=1.0)] = 0.0


# ---- client → server bodies -----------------------------------------------------------------------
class Open(_Strict, tag="open"):
    """Start (or restart) request ``rid``: prompt plus the first token the target sampled at prefill."""

    rid: Rid
    prompt_tokens: Annotated[list[TokenId], Meta(min_length=1, max_length=MAX_PROMPT_TOKENS)]
    first_token: TokenId
    params: DraftParams = msgspec.field(default_factory=DraftParams)


class OpenMany(_Strict, tag="open_many"):
    """Start several requests in one message (the new requests of one scheduler step). The server
    prefills them together and answers in this order; a request it cannot take gets its own error."""

    opens: Annotated[list[Open], Meta(min_length=1, max_length=MAX_BATCH)]


class OutcomeMsg(_Strict):
    """Round T's verification outcome v = (k accepted, bonus t*) for one request.

    ``spec_id`` echoes the id of the speculation that was verified (from its reply); a mismatch means
    client and server disagree about the request's state and the server answers with a per-request error.
    """

    rid: Rid
    accepted: Annotated[int, Meta(ge=0, le=1024)]
    bonus: TokenId
    spec_id: Annotated[int, Meta(ge=0)] | None = None


class Round(_Strict, tag="round"):
    """``depth``: how many tokens to draft from the next trees on (the target's auto-K choice; the
    server keeps it within its own K); None keeps the server's depth. ``budget``: the branches (ΣF) of
    each next tree, kept within the server's own ΣF; None keeps the server's."""

    outcomes: Annotated[list[OutcomeMsg], Meta(max_length=MAX_BATCH)]
    depth: Annotated[int, Meta(ge=1, le=1024)] | None = None
    budget: Annotated[int, Meta(ge=1, le=1024)] | None = None


class Draft(_Strict, tag="draft"):
    """Synchronous drafting: K tokens now from each request's committed context (SD baseline)."""

    rids: Annotated[list[Rid], Meta(max_length=MAX_BATCH)]


class Close(_Strict, tag="close"):
    rids: Annotated[list[Rid], Meta(max_length=MAX_BATCH)]
    abort: bool = False


class CloseAll(_Strict, tag="close_all"):
    """Close every request this client opened."""


class Heartbeat(_Strict, tag="heartbeat"):
    pass


class StatsQuery(_Strict, tag="stats"):
    reset: bool = False


Request = Open | OpenMany | Round | Draft | Close | CloseAll | Heartbeat | StatsQuery


class Envelope(_Strict):
    """Client → server header. ``client`` names the client instance (stable across reconnects)."""

    v: int
    seq: Annotated[int, Meta(ge=0)]
    client: Annotated[str, Meta(max_length=MAX_RID_CHARS)]
    body: Request


# ---- server → client bodies -----------------------------------------------------------------------
QKind = Literal["none", "dense", "sparse"]


class SpecMsg(_Strict):
    """One request's speculation for the next round.

    ``tokens``: int ``[K']``. ``q_kind``: "none" ⇒ deterministic tokens (fast backup, point mass);
    "dense" ⇒ ``q_probs`` float ``[K', V]``; "sparse" ⇒ ``q_indices`` int ``[K', S]`` + ``q_probs`` float
    ``[K', S]`` (exact: the draft's q′ had at most S tokens of support). ``error`` set ⇒ no speculation
    (K' = 0) and the reason (unknown request, out of sync, bad outcome): re-open the request.
    """

    rid: str
    hit: bool
    spec_id: int
    tokens: TensorRef | None = None
    q_kind: QKind = "none"
    q_probs: TensorRef | None = None
    q_indices: TensorRef | None = None
    vocab_size: int = 0
    error: str | None = None


class Speculations(_Strict, tag="speculations"):
    specs: list[SpecMsg]


class Ack(_Strict, tag="ack"):
    closed: int = 0


class Alive(_Strict, tag="alive"):
    server_time: float
    mode: str
    k: int
    vocab_size: int
    protocol: int = PROTOCOL_VERSION


class StatsReply(_Strict, tag="stats_reply"):
    stats: dict[str, float | int | str]


class ErrorReply(_Strict, tag="error"):
    """The whole message was refused (``code``: bad_message, version, too_large, internal, ...)."""

    code: str
    message: str


Reply = Speculations | Ack | Alive | StatsReply | ErrorReply


class ReplyEnvelope(_Strict):
    v: int
    seq: int
    body: Reply


class Probe(Struct):
    """Lenient view of any header: read ``v`` and ``seq`` before strict decoding so a version mismatch
    or malformed body still gets an error reply that the client can match to its request."""

    v: int = -1
    seq: int = 0
