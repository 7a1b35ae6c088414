"""Byte transports between the worker's client and the draft server.

- :class:`ZmqServerTransport` (ROUTER) / :class:`ZmqClientTransport` (DEALER) over ``ipc://`` (same
  host) or ``tcp://`` (loopback unless told otherwise; optional CURVE encryption and authentication).
- :class:`InProcClientTransport`: calls a server object directly in the same thread, for unit tests.

A transport moves lists of frames; it knows nothing about the protocol.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import zmq

Frames = list[bytes]


class FrameHandler(Protocol):
    """What an in-process client talks to: the draft server's message entry point."""

    def handle(self, peer: bytes, frames: Frames) -> Frames: ...

    def has_work(self) -> bool: ...

    def work_step(self) -> None: ...


def check_endpoint(endpoint: str, name: str = "endpoint") -> str:
    if not endpoint.startswith(("ipc://", "tcp://", "inproc://")):
        raise ValueError(f"{name} must start with ipc://, tcp:// or inproc://, got {endpoint!r}")
    return endpoint


def is_loopback(endpoint: str) -> bool:
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://") :].rsplit(":", 1)[0]
    return host in ("127.0.0.1", "localhost", "[::1]", "::1", "lo")


class ZmqServerTransport:
    """ROUTER socket bound to ``endpoint``. ``curve_secret_key`` (Z85, 40 bytes) turns on CURVE."""

    def __init__(
        self,
        endpoint: str,
        *,
        curve_secret_key: bytes | None = None,
        max_frame_bytes: int = 1 << 30,
        context: zmq.Context | None = None,
    ) -> None:
        check_endpoint(endpoint)
        self._own_ctx = context is None
        self.ctx = context or zmq.Context()
        s = self.ctx.socket(zmq.ROUTER)
        s.setsockopt(zmq.LINGER, 0)
        # A reply to a vanished client must fail loudly (and be dropped) rather than block or vanish.
        s.setsockopt(zmq.ROUTER_MANDATORY, 1)
        # Frames beyond this disconnect the peer inside libzmq, before any allocation on our side.
        s.setsockopt(zmq.MAXMSGSIZE, max_frame_bytes)
        if curve_secret_key is not None:
            s.curve_secretkey = curve_secret_key
            s.curve_publickey = zmq.curve_public(curve_secret_key)
            s.curve_server = True
        s.bind(endpoint)
        self.socket = s
        self.endpoint = s.getsockopt_string(zmq.LAST_ENDPOINT) if endpoint.startswith("tcp://") else endpoint
        self.dropped_replies = 0

    def recv(self, timeout_ms: int) -> tuple[bytes, Frames] | None:
        """Next message as (peer identity, frames), or None after ``timeout_ms``."""
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        parts = self.socket.recv_multipart()
        return parts[0], parts[1:]

    def send(self, peer: bytes, frames: Frames) -> bool:
        """False (and the reply dropped) when the peer is gone or its queue is full."""
        try:
            self.socket.send_multipart([peer, *frames], flags=zmq.NOBLOCK)
            return True
        except (zmq.Again, zmq.ZMQError):
            self.dropped_replies += 1
            return False

    def close(self) -> None:
        self.socket.close(linger=0)
        if self._own_ctx:
            self.ctx.term()


class ZmqClientTransport:
    """DEALER socket connected to ``endpoint``; ``reset()`` replaces it (dropping anything queued)."""

    def __init__(
        self,
        endpoint: str,
        *,
        curve_server_key: bytes | None = None,
        context: zmq.Context | None = None,
    ) -> None:
        self.endpoint = check_endpoint(endpoint)
        self.curve_server_key = curve_server_key
        self._own_ctx = context is None
        self.ctx = context or zmq.Context()
        self.socket: zmq.Socket | None = None
        self._connect()

    def _connect(self) -> None:
        s = self.ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        # Queue nothing for a server that is not there: a stale request must never arrive late.
        s.setsockopt(zmq.IMMEDIATE, 1)
        if self.curve_server_key is not None:
            public, secret = zmq.curve_keypair()
            s.curve_serverkey = self.curve_server_key
            s.curve_publickey = public
            s.curve_secretkey = secret
        s.connect(self.endpoint)
        self.socket = s

    def send(self, frames: Frames, timeout_ms: int) -> bool:
        """False when the message could not be handed to a connected server within ``timeout_ms``."""
        if not self.socket.poll(timeout_ms, zmq.POLLOUT):
            return False
        try:
            self.socket.send_multipart(frames, flags=zmq.NOBLOCK)
            return True
        except zmq.Again:
            return False

    def recv(self, timeout_ms: int) -> Frames | None:
        if not self.socket.poll(timeout_ms, zmq.POLLIN):
            return None
        return self.socket.recv_multipart()

    def reset(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=0)
        self._connect()

    def close(self) -> None:
        if self.socket is not None:
            self.socket.close(linger=0)
            self.socket = None
        if self._own_ctx:
            self.ctx.term()


class InProcClientTransport:
    """Same-thread transport for unit tests: ``send`` calls ``server.handle`` directly.

    ``drain``: after each reply run the server's pending pre-speculation to completion, as if the
    target took long enough to verify (the deterministic stand-in for the asynchronous overlap).
    """

    def __init__(self, server: FrameHandler, *, peer: bytes = b"inproc", drain: bool = True) -> None:
        self.server = server
        self.peer = peer
        self.drain = drain
        self._inbox: deque[Frames] = deque()
        self.endpoint = "inproc://draft-server"

    def send(self, frames: Frames, timeout_ms: int) -> bool:
        # Frames cross as bytes, exactly as they would through a socket.
        self._inbox.append(self.server.handle(self.peer, [bytes(f) for f in frames]))
        if self.drain:
            while self.server.has_work():
                self.server.work_step()
        return True

    def recv(self, timeout_ms: int) -> Frames | None:
        return self._inbox.popleft() if self._inbox else None

    def reset(self) -> None:
        self._inbox.clear()

    def close(self) -> None:
        self._inbox.clear()


def curve_available() -> bool:
    return bool(zmq.has("curve"))
