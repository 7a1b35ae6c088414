"""Encoding and strict decoding of whole messages (header frame + tensor frames), with size limits.

Limits are checked before anything is decoded, so an oversized or malformed message costs the server
a length comparison, not an allocation. Every failure is a :class:`WireError` whose ``code`` goes back
in an :class:`ErrorReply`; the server keeps serving.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from .messages import PROTOCOL_VERSION, Envelope, ErrorReply, Probe, Reply, ReplyEnvelope, Request
from .tensors import FrameReader, WireError


@dataclass(frozen=True)
class Limits:
    """Per-message size limits (bytes / counts)."""

    max_header_bytes: int = 16 << 20
    max_tensor_bytes: int = 256 << 20
    max_message_bytes: int = 512 << 20
    max_frames: int = 4 * 4096 + 1

    def check(self, frames: list[bytes | memoryview]) -> None:
        if not frames:
            raise WireError("bad_message", "empty message")
        if len(frames) > self.max_frames:
            raise WireError("too_large", f"{len(frames)} frames exceeds the {self.max_frames} limit")
        if len(frames[0]) > self.max_header_bytes:
            raise WireError(
                "too_large", f"header of {len(frames[0])} bytes exceeds the {self.max_header_bytes} limit"
            )
        total = sum(len(f) for f in frames)
        if total > self.max_message_bytes:
            raise WireError("too_large", f"message of {total} bytes exceeds the {self.max_message_bytes} limit")


_request_decoder = msgspec.msgpack.Decoder(Envelope)
_reply_decoder = msgspec.msgpack.Decoder(ReplyEnvelope)
_probe_decoder = msgspec.msgpack.Decoder(Probe)
_encoder = msgspec.msgpack.Encoder()


def encode_request(seq: int, client: str, body: Request) -> list[bytes]:
    return [_encoder.encode(Envelope(v=PROTOCOL_VERSION, seq=seq, client=client, body=body))]


def probe_seq(header: bytes | memoryview) -> tuple[int, int]:
    """(version, seq) read leniently from a header; (-1, 0) when even that fails."""
    try:
        p = _probe_decoder.decode(header)
        return p.v, p.seq
    except (msgspec.DecodeError, msgspec.ValidationError):
        return -1, 0


def decode_request(frames: list[bytes | memoryview], limits: Limits) -> tuple[Envelope, FrameReader]:
    """Strictly decode a client message; raises :class:`WireError`."""
    limits.check(frames)
    version, _ = probe_seq(frames[0])
    if version < 0:
        raise WireError("bad_message", "header is not a msgpack map with a protocol version")
    if version != PROTOCOL_VERSION:
        raise WireError("version", f"protocol version {version}, this server speaks {PROTOCOL_VERSION}")
    try:
        env = _request_decoder.decode(frames[0])
    except msgspec.ValidationError as e:
        raise WireError("bad_message", f"invalid request: {e}") from None
    except msgspec.DecodeError as e:
        raise WireError("bad_message", f"undecodable request header: {e}") from None
    return env, FrameReader(frames[1:], limits.max_tensor_bytes)


def encode_reply(seq: int, body: Reply, tensor_frames: list[bytes] | None = None) -> list[bytes]:
    return [_encoder.encode(ReplyEnvelope(v=PROTOCOL_VERSION, seq=seq, body=body)), *(tensor_frames or [])]


def error_reply(seq: int, err: WireError | Exception) -> list[bytes]:
    code = err.code if isinstance(err, WireError) else "internal"
    return encode_reply(seq, ErrorReply(code=code, message=str(err)[:2000]))


def decode_reply(frames: list[bytes | memoryview], limits: Limits) -> tuple[ReplyEnvelope, FrameReader]:
    """Strictly decode a server reply; raises :class:`WireError`."""
    limits.check(frames)
    try:
        env = _reply_decoder.decode(frames[0])
    except (msgspec.ValidationError, msgspec.DecodeError) as e:
        raise WireError("bad_message", f"invalid reply: {e}") from None
    if env.v != PROTOCOL_VERSION:
        raise WireError("version", f"server speaks protocol {env.v}, this client {PROTOCOL_VERSION}")
    return env, FrameReader(frames[1:], limits.max_tensor_bytes)
