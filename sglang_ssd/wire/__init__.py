"""Wire protocol between the SGLang worker and the draft server: msgspec messages, raw tensor frames,
ZeroMQ (ipc/tcp, optional CURVE) and in-process transports, and the synchronous :class:`DraftClient`."""

from .client import DraftClient, DraftServerError, DraftUnavailable
from .codec import Limits
from .messages import PROTOCOL_VERSION, DraftParams
from .speculation import Outcome, Speculation

__all__ = [
    "PROTOCOL_VERSION",
    "DraftClient",
    "DraftParams",
    "DraftServerError",
    "DraftUnavailable",
    "Limits",
    "Outcome",
    "Speculation",
]
