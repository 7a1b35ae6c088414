"""Per-request state of the draft server: committed context, KV extent, pending speculation, tree.

Invariants (extent-relative slots):
- ``tokens`` is the committed context; its last entry (the latest bonus) never has KV yet, so
  ``kv_len ≤ len(tokens) − 1`` and every glue chain starts by (re)feeding it;
- ``spec`` is the speculation the target is verifying now (full-vocabulary ids), ``spec_id`` its id;
- the glue of a round is ``tokens[kv_len:] + spec`` at slots/positions ``kv_len …``; its row ``r0``
  holds the last committed token, so row ``r0 + k`` is the fork point after k accepted tokens.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from ..algo.probs import SparseProbs
from .ngram_backup import ContextLookup
from .sampler import RowParams


class Stage(enum.Enum):
    IDLE = "idle"  # nothing scheduled (sync mode, or the speculation is empty)
    GLUE = "glue"  # glue forward pending
    TREE = "tree"  # branches being decoded
    READY = "ready"  # speculation cache filled for the outcome to come
    PREFILL = "prefill"  # context KV being written in the background, one chunk per work step


@dataclass
class Tree:
    """Branches of one round, laid out step-major after the glue: the step-s token of branch b sits at
    extent slot ``base + s·stride + cols[b]``.

    ``fork_k``: int64 ``[nb]`` accepted count each branch assumes; ``fork_tok``: int64 ``[nb]`` its bonus
    (full ids); ``tokens``: int64 ``[nb, K]`` sampled draft tokens (full ids, first ``steps_done`` valid);
    ``q``: per finished step, q′ of the ``nb`` rows (head vocabulary); ``positions0``: int64 ``[nb]``
    absolute position of each fork token. ``sample_plan``: the fan-out a branch's tokens will be forked
    with when they are verified (a hit's plan), which sets Saguaro's top set while sampling them.
    """

    glue_start: int
    r0: int
    glue_len: int
    base: int
    stride: int
    cols: torch.Tensor
    fork_k: torch.Tensor
    fork_tok: torch.Tensor
    positions0: torch.Tensor
    tokens: torch.Tensor
    q: list[torch.Tensor | SparseProbs] = field(default_factory=list)
    steps_done: int = 0
    sample_plan: list[int] = field(default_factory=list)  # fan-out the branches' own rounds will use
    # Recursive drafting (draft/recursive.py): branches advance unevenly. ``done`` int64 [nb] tokens each
    # has; ``qb`` its q′ rows; ``steps_done`` is then the depth every branch has reached.
    done: torch.Tensor | None = None
    qb: list[list] | None = None
    pending: dict = field(default_factory=dict)

    @property
    def num_branches(self) -> int:
        return self.fork_k.shape[0]

    def find(self, accepted: int, bonus: int) -> int | None:
        """Index of the branch for outcome (accepted, bonus), or None (a miss)."""
        hit = ((self.fork_k == accepted) & (self.fork_tok == bonus)).nonzero()
        return int(hit[0, 0]) if hit.numel() else None

    def only(self, b: int) -> Tree:
        """The same tree reduced to branch ``b`` (its slots stay where they are)."""
        sel = slice(b, b + 1)
        if self.done is not None:  # recursive: the branch may be ahead of the published depth
            d = int(self.done[b])
            return Tree(
                self.glue_start, self.r0, self.glue_len, self.base, self.stride, self.cols[sel],
                self.fork_k[sel], self.fork_tok[sel], self.positions0[sel], self.tokens[sel].clone(),
                list(self.qb[b][:d]), d, self.sample_plan, self.done[sel].clone(), [list(self.qb[b])],
            )  # fmt: skip
        return Tree(
            self.glue_start, self.r0, self.glue_len, self.base, self.stride, self.cols[sel],
            self.fork_k[sel], self.fork_tok[sel], self.positions0[sel], self.tokens[sel].clone(),
            [q[sel] for q in self.q], self.steps_done, self.sample_plan,
        )  # fmt: skip


@dataclass
class RequestState:
    rid: str
    owner: str
    slot: int
    params: RowParams
    seed: int
    tokens: list[int]
    extent: tuple[int, int]
    kv_len: int = 0
    spec: list[int] = field(default_factory=list)
    spec_id: int = 0
    stage: Stage = Stage.IDLE
    tree: Tree | None = None
    plan: list[int] = field(default_factory=list)  # fan-out used for the current tree
    after_miss: bool = True  # the pending speculation was drafted by a backup
    spec_origin: str = "neural"  # "hit", "neural" or "fast"
    replied_at: float | None = None  # when the pending speculation was sent
    ready_at: float | None = None  # when its tree finished
    lookup: ContextLookup = field(default_factory=ContextLookup)
    draft_params: object = None  # the client's DraftParams (to re-derive ``params`` at another τ₁)
    tau1_mult: float | None = None  # draft temperature multiplier in force for new drafts
    spec_tau1: float | None = None  # ... and the one the pending speculation was drafted with
    spec_params: RowParams | None = None  # how the pending speculation was sampled
    last_active: float = field(default_factory=time.monotonic)

    def touch(self) -> None:
        self.last_active = time.monotonic()

    def commit(self, accepted: int, bonus: int) -> None:
        """The target accepted ``accepted`` tokens of the pending speculation, then emitted ``bonus``."""
        glued = self.stage in (Stage.TREE, Stage.READY)
        self.tokens += self.spec[:accepted] + [bonus]
        if glued:
            # Glue rows up to r0 + k (last token, s_1..s_k) hold exactly the committed context's KV.
            self.kv_len = len(self.tokens) - 1
        self.lookup.update(self.tokens)

    @property
    def last_position(self) -> int:
        """Absolute position of the last committed token."""
        return len(self.tokens) - 1
