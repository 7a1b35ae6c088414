"""Wire protocol between the SGLang worker and the draft server: msgspec messages, raw tensor frames,
ZeroMQ (ipc/tcp, optional CURVE) and in-process transports, the synchronous :class:`DraftClient`, and
the draft settings both processes share (``wire/settings.py``).

The names below load on first use: the launcher imports ``wire.settings`` before anything heavy, and
importing the package must not pull in torch and ZeroMQ for that.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "DraftClient": "client",
    "DraftServerError": "client",
    "DraftUnavailable": "client",
    "Limits": "codec",
    "PROTOCOL_VERSION": "messages",
    "DraftParams": "messages",
    "Outcome": "speculation",
    "Speculation": "speculation",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
