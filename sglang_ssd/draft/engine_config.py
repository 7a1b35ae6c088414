"""``EngineConfig``: what the draft engine (``draft/engine.py``) and its request table
(``draft/lifetime.py``) are configured with; its own module so that both import it and neither imports
the other."""

from __future__ import annotations

from dataclasses import dataclass

from ..wire.settings import DraftSettings


@dataclass
class EngineConfig(DraftSettings):
    """The draft settings (wire/settings.py: K, fan-out, budget, Saguaro C, backup, mode, q-support, the
    temperatures) plus limits only this server has. The engine drafts ``draft_k`` tokens per round (K,
    AUTO_K_MAX under ``k="auto"``, at least 1). ``fanout_list``: a fixed F_0..F_K that replaces
    ``fanout``/``budget``. ``sparse_top_k``: a request whose own top-k is at most this keeps q′ sparse
    even with ``q_support`` 0."""

    fanout_list: list[int] | None = None
    sparse_top_k: int = 1024
    max_requests: int = 1024
    idle_timeout_s: float = 600.0
    prefill_chunk: int = 512
    max_open_tokens: int = 4096  # prompt tokens one open message may make this server prefill
    # Prompt tokens an open message prefills before its reply (async mode); the prompts past this are
    # prefilled in the background, at most ``prefill_chunk`` tokens per work step, between messages.
    inline_prefill_tokens: int = 64
    max_step_tokens: int = 4096
    # Wait for a round that is due before the next tree step would finish (draft/deadline.py).
    step_deadline: bool = True
    cache_mem_mb: float = 256.0
