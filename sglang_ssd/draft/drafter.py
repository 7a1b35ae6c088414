"""How the draft server drafts K tokens: the draft model alone, or an L0 proposing for it (L0 → L1).

Both strategies answer the same three calls — a tree step's span, applying its logits to the tree, and
K-token backup chains — so the engine picks one when it starts and never asks which it has. The glue
and the forks are the same for both (``draft/tree.py``).
"""

from __future__ import annotations

import torch

from .backup import Draft, neural_draft
from .l0 import L0Level
from .model import DraftModel, Span
from .recursive import l0_advance_tree, l0_neural_draft, l0_tree_span
from .request import RequestState
from .stats import EngineStats
from .tree import advance_tree, tree_span


class PlainDrafter:
    """The draft model samples every token itself: one tree step is one token per branch."""

    def __init__(self, model: DraftModel, k: int, saguaro_c: float) -> None:
        self.model, self.k, self.c = model, k, saguaro_c

    def tree_span(self, req: RequestState) -> Span:
        return tree_span(req)

    def advance_tree(self, req: RequestState, logits: torch.Tensor) -> None:
        advance_tree(req, logits, self.model, self.c)

    def chains(self, reqs: list[RequestState], plan: list[int]) -> list[Draft]:
        """K tokens per request from its committed context (the neural backup)."""
        return neural_draft(self.model, reqs, self.k, plan, self.c)


class TwoLevelDrafter(PlainDrafter):
    """L0 proposes, the draft model (L1) verifies (``draft/recursive.py``): every K-token draft — tree
    branches and neural backups alike — keeps L1's law while a step may yield several tokens."""

    def __init__(self, model: DraftModel, k: int, saguaro_c: float, l0: L0Level, stats: EngineStats) -> None:
        super().__init__(model, k, saguaro_c)
        self.l0, self.stats = l0, stats

    def tree_span(self, req: RequestState) -> Span:
        return l0_tree_span(req, self.l0, self.model, self.k)

    def advance_tree(self, req: RequestState, logits: torch.Tensor) -> None:
        l0_advance_tree(req, logits, self.model, self.l0, self.k, self.c, self.stats)

    def chains(self, reqs: list[RequestState], plan: list[int]) -> list[Draft]:
        return l0_neural_draft(self.model, reqs, self.k, plan, self.c, self.l0, self.stats)


def make_drafter(model: DraftModel, k: int, saguaro_c: float, l0: L0Level | None,
                 stats: EngineStats) -> PlainDrafter:  # fmt: skip
    if l0 is None:
        return PlainDrafter(model, k, saguaro_c)
    return TwoLevelDrafter(model, k, saguaro_c, l0, stats)
