"""The synchronous client the SGLang worker uses to talk to the draft server.

Every call is one request/reply exchange with a sequence number; a reply whose number is not the one
awaited (a late answer to a call that already timed out) is dropped. On timeout or a dead server the
call raises :class:`DraftUnavailable` and the socket is replaced, so nothing queued for the old
connection can reach the server later; the next call reconnects on its own.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence

from .codec import Limits, decode_reply, encode_request
from .messages import (
    Ack,
    Alive,
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
    StatsReply,
)
from .speculation import Outcome, Speculation, msg_to_spec
from .tensors import FrameReader, WireError
from .transport import ZmqClientTransport


class DraftUnavailable(RuntimeError):
    """The draft server did not answer in time, is gone, or refused the call; continue without
    speculation and re-open requests once :meth:`DraftClient.ping` succeeds again."""


class DraftServerError(DraftUnavailable):
    """The server answered with an error reply (``code``: bad_message, version, too_large, ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"draft server error [{code}]: {message}")
        self.code = code


class DraftClient:
    """Client of one draft server.

    ``endpoint``: ``ipc://PATH`` or ``tcp://HOST:PORT``. ``timeout_s``: per-call limit.
    ``curve_server_key``: the server's Z85 CURVE public key (turns on encryption).
    ``transport``: an already built transport (in-process tests); replaces ``endpoint``.
    """

    def __init__(
        self,
        endpoint: str,
        timeout_s: float = 5.0,
        curve_server_key: bytes | None = None,
        *,
        transport=None,
        limits: Limits | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.transport = transport or ZmqClientTransport(endpoint, curve_server_key=curve_server_key)
        self.limits = limits or Limits()
        self.client_id = uuid.uuid4().hex
        self._seq = 0
        self._spec_ids: dict[str, int] = {}
        self.stale_replies = 0
        self._posted: dict[int, list[str]] = {}  # seq -> rids of a round sent but not yet collected
        self._early: dict[int, tuple] = {}  # replies to posted rounds that arrived during another call
        self._closed_while_posted: set[str] = set()

    # ---- exchange --------------------------------------------------------------------------------
    def _send(self, body, timeout_s: float) -> int:
        self._seq += 1
        if not self.transport.send(encode_request(self._seq, self.client_id, body), int(timeout_s * 1000)):
            self._reset()
            raise DraftUnavailable(f"draft server at {self.transport.endpoint} is not reachable")
        return self._seq

    def _reset(self) -> None:
        self.transport.reset()
        self._posted.clear()  # their replies can no longer arrive
        self._early.clear()
        self._closed_while_posted.clear()

    def _await(self, seq: int, timeout_s: float) -> tuple[object, FrameReader]:
        if seq in self._early:
            env, reader = self._early.pop(seq)
        else:
            deadline = time.monotonic() + timeout_s
            while True:
                remaining_ms = max(0, int((deadline - time.monotonic()) * 1000))
                frames = self.transport.recv(remaining_ms)
                if frames is None:
                    self._reset()
                    raise DraftUnavailable(
                        f"no reply from the draft server at {self.transport.endpoint} in {timeout_s:.3g} s"
                    )
                try:
                    env, reader = decode_reply(frames, self.limits)
                except WireError as e:
                    self._reset()
                    raise DraftServerError(e.code, f"undecodable reply: {e}") from None
                if env.seq == seq:
                    break
                if env.seq in self._posted:  # a posted call's reply, overtaken by this call: keep it
                    self._early[env.seq] = (env, reader)
                else:
                    self.stale_replies += 1
        if isinstance(env.body, ErrorReply):
            raise DraftServerError(env.body.code, env.body.message)
        return env.body, reader

    def _call(self, body, timeout_s: float | None = None) -> tuple[object, FrameReader]:
        timeout_s = self.timeout_s if timeout_s is None else timeout_s
        return self._await(self._send(body, timeout_s), timeout_s)

    def _speculations(self, body, rids: Sequence[str]) -> list[Speculation]:
        return self._read_specs(*self._call(body), rids)

    def _read_specs(self, reply, reader: FrameReader, rids: Sequence[str]) -> list[Speculation]:
        if not isinstance(reply, Speculations) or [m.rid for m in reply.specs] != list(rids):
            raise DraftServerError("bad_message", "reply does not match the requests sent")
        try:
            specs = [msg_to_spec(m, reader) for m in reply.specs]
        except WireError as e:
            raise DraftServerError(e.code, str(e)) from None
        for s in specs:
            if s.error is None:
                self._spec_ids[s.rid] = s.spec_id
            else:
                self._spec_ids.pop(s.rid, None)
        return specs

    # ---- the API the worker uses --------------------------------------------------------------------
    def open(self, rid: str, prompt_tokens: list[int], first_token: int, params: DraftParams) -> Speculation:
        """Start (or restart) ``rid``; returns the first round's speculation (a forced miss, from the
        backup). A request the server cannot take (full, KV pool exhausted, ids outside its vocabulary)
        comes back with ``error`` set and no tokens; the server itself stays usable."""
        body = Open(rid=rid, prompt_tokens=list(prompt_tokens), first_token=int(first_token), params=params)
        return self._speculations(body, [rid])[0]

    def open_many(self, opens: Sequence[tuple[str, list[int], int, DraftParams]]) -> list[Speculation]:
        """``open`` for several requests (rid, prompt tokens, first token, params) in one message, prefilled
        together on the server; the replies come in the same order, each with its own ``error``."""
        body = OpenMany(opens=[Open(rid=rid, prompt_tokens=list(prompt), first_token=int(first), params=params)
                               for rid, prompt, first, params in opens])  # fmt: skip
        return self._speculations(body, [o[0] for o in opens])

    def round(self, outcomes: list[Outcome], depth: int | None = None,
              budget: int | None = None) -> list[Speculation]:
        """Send round T's outcomes; returns round T+1's speculations in the order of ``outcomes``.
        ``depth`` / ``budget``: the K and ΣF of the next trees (None: the server's own)."""
        msg = Round(outcomes=self._outcome_msgs(outcomes), depth=depth, budget=budget)
        return self._speculations(msg, [o.rid for o in outcomes])

    def _outcome_msgs(self, outcomes: list[Outcome]) -> list[OutcomeMsg]:
        return [
            OutcomeMsg(rid=o.rid, accepted=int(o.accepted), bonus=int(o.bonus), spec_id=self._spec_ids.get(o.rid))
            for o in outcomes
        ]

    def post_round(self, outcomes: list[Outcome], depth: int | None = None, budget: int | None = None) -> int:
        """Send round T's outcomes without waiting; :meth:`collect_round` with the returned ticket
        gets the speculations later. Other calls may run in between (their replies are told apart)."""
        msg = Round(outcomes=self._outcome_msgs(outcomes), depth=depth, budget=budget)
        seq = self._send(msg, self.timeout_s)
        self._posted[seq] = [o.rid for o in outcomes]
        return seq

    def collect_round(self, ticket: int) -> list[Speculation]:
        """The speculations answering the round posted as ``ticket`` (waits up to ``timeout_s``)."""
        rids = self._posted.pop(ticket, None)
        if rids is None:
            raise DraftUnavailable("the posted round was lost (the connection was reset)")
        specs = self._read_specs(*self._await(ticket, self.timeout_s), rids)
        for rid in self._closed_while_posted.intersection(rids):
            self._spec_ids.pop(rid, None)  # closed meanwhile: forget it again
        self._closed_while_posted.difference_update(rids)
        return specs

    def draft(self, rids: list[str]) -> list[Speculation]:
        """Synchronous SD drafting: K tokens now from each request's committed context."""
        return self._speculations(Draft(rids=list(rids)), list(rids))

    def close(self, rid: str, *, abort: bool = False, wait: bool = True) -> None:
        """Free ``rid`` on the server. ``wait=False`` only sends the close (its acknowledgement is
        dropped when it arrives), for a caller that must not wait for the server to be free."""
        self._spec_ids.pop(rid, None)
        if any(rid in rids for rids in self._posted.values()):
            self._closed_while_posted.add(rid)
        if wait:
            self._call(Close(rids=[rid], abort=abort))
        else:
            self._send(Close(rids=[rid], abort=abort), self.timeout_s)

    def close_all(self) -> int:
        """Close every request this client opened; returns how many the server freed."""
        self._spec_ids.clear()
        reply, _ = self._call(CloseAll())
        return reply.closed if isinstance(reply, Ack) else 0

    def stats(self, *, reset: bool = False) -> dict:
        reply, _ = self._call(StatsQuery(reset=reset))
        if not isinstance(reply, StatsReply):
            raise DraftServerError("bad_message", "stats reply expected")
        return dict(reply.stats)

    def ping(self, timeout_s: float | None = None) -> bool:
        """True when the server answers a heartbeat in time (never raises)."""
        try:
            reply, _ = self._call(Heartbeat(), timeout_s)
        except DraftUnavailable:
            return False
        return isinstance(reply, Alive)

    def server_info(self) -> Alive:
        reply, _ = self._call(Heartbeat())
        if not isinstance(reply, Alive):
            raise DraftServerError("bad_message", "heartbeat reply expected")
        return reply

    # ---- lifetime -------------------------------------------------------------------------------------
    def disconnect(self) -> None:
        self.transport.close()

    def __enter__(self) -> DraftClient:
        return self

    def __exit__(self, *exc) -> None:
        self.disconnect()
