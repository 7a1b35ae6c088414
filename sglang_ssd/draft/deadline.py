"""When to hold a tree step back: the next round is due before it would finish.

A tree step is one batched forward the server cannot interrupt. A round message that arrives during
it waits for its end, and that wait is part of the target's step (the link time of a hit round). On
one CPU core a tree of K steps fills the whole verify window, so the round usually lands mid-step:
at c = 1 and K = 4 a hit round waited 3.5 ms for its reply, in a 37 ms round.

`RoundDeadline` predicts the round's arrival (the last reply plus the usual gap from a reply to the
next round) and the step's duration (by its number of rows). When the step would end after the round
is due, the server waits for the message instead. The tree in progress then answers its outcome
as a partial hit with the steps already done (`DraftEngine._serve_partial`), a shorter draft and
exact like any other. A round later than predicted ends the hold after a grace period, and the
step runs.
"""

from __future__ import annotations

from ..algo.policy import Ewma

# How long past its predicted arrival a round is still waited for (seconds, and a fraction of the gap).
GRACE_S, GRACE_FRACTION = 0.002, 0.1
# A gap longer than this many times the usual one (a request ending, an idle spell) counts as this.
GAP_CLIP = 2.0


class RoundDeadline:
    """Live estimates of the reply-to-round gap and of a tree step's duration by its row count."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self.gap: Ewma | None = None
        self._step: dict[int, Ewma] = {}  # row-count bucket (a power of 2) -> seconds

    @staticmethod
    def _bucket(rows: int) -> int:
        return 1 << max(0, int(rows) - 1).bit_length()

    def observe_gap(self, seconds: float) -> None:
        """The time from the previous round's reply to this round's arrival."""
        if self.gap is None:
            self.gap = Ewma(seconds, self.decay)
        else:
            self.gap.update(min(seconds, GAP_CLIP * self.gap.value))

    def observe_step(self, rows: int, seconds: float) -> None:
        b = self._bucket(rows)
        if b in self._step:
            self._step[b].update(seconds)
        else:
            self._step[b] = Ewma(seconds, self.decay)

    def step_estimate(self, rows: int) -> float | None:
        est = self._step.get(self._bucket(rows))
        return None if est is None else est.value

    def hold_s(self, now: float, last_reply: float | None, rows: int) -> float:
        """Seconds to wait for the next round before a step of ``rows`` rows; 0: step now."""
        step = self.step_estimate(rows)
        if self.gap is None or last_reply is None or step is None:
            return 0.0
        due = last_reply + self.gap.value
        if now + step <= due:
            return 0.0
        return max(0.0, due + max(GRACE_S, GRACE_FRACTION * self.gap.value) - now)
