"""`--ssd-k auto`: choose the number of draft tokens per round from live measurements.

Verifying fewer tokens than were drafted is exact (the chain is simply shorter; the draft server is
told k ≤ K' accepted), so the worker may cut every speculation to the K it predicts fastest:

    rate(K) = E(α, K) / (S(K + 1) + G)

with α the live per-token acceptance, S(n) the measured time of a whole worker step that verifies n
tokens per request at the current batch size (the link wait, the forward, the exact verification),
and G the measured gap between steps (the scheduler's own work, paid whatever K is). K = 0 is plain
decoding: one token verified, nothing drafted used. Measuring whole steps, not bare forwards, is what
makes the comparison with K = 0 honest on a CPU, where a forward over n tokens costs much more than
over one and the per-step overheads are large.

S(n) = S(1) · R(n) per batch-size bucket: S(1) the running mean of plain steps, R(n) the running
mean of n-token steps relative to the plain-step mean at the time (R(1) = 1). Plain steps are the
common case and keep S(1) current; drafted widths are measured rarely, and as ratios their old
samples still apply when the whole machine gets slower or faster (load, context length, a batch of
4 vs 7 in one bucket). R(n) is the width's own mean once it has `OWN_AFTER` samples; until then a
straight line through the measured widths' ratios (least squares, each weighted by its count, capped
so that thousands of plain steps do not drown the few drafted ones). A CPU's cost curve is not
straight (the jump from one token to two is the largest), hence the widths' own means once known.

Plain decoding (`PLAIN_FIRST` measured rounds) and a one-token draft are tried first in a new
bucket (a bucket larger than one where plain decoding already won starts parked). A random width
every `EXPLORE_EVERY` rounds afterwards keeps the estimates honest, so a changing workload (larger
batches, where verification grows costlier; text the draft predicts better) moves the choice. While
plain decoding wins the worker parks its requests on the draft server, and trying a draft costs
re-opening them: explorations are then 1–2 tokens for `PARKED_PROBE` rounds, every `EXPLORE_PARKED`
rounds (or, where plain decoding wins by `CLEAR_LOSS`, as many more as keep one exploration's measured
cost within `PROBE_SHARE` of the time between), doubling after each one that leaves plain decoding the
winner (up to `EXPLORE_PARKED_MAX` or the cost's interval); a draft winning again resets the interval.
A bucket the batch enters while it is parked starts parked. Switching between plain decoding and
drafting needs a predicted gain of `SWITCH_MARGIN`, since parking and re-opening cost more than the step rates show;
within drafting the best K is taken as is. A bucket parks only after `PARK_AFTER` drafted
request-rounds, unless plain decoding is predicted `CLEAR_LOSS` times faster: on fewer, a few bad
first drafts could park it for hundreds of rounds. Even a clear loss waits for `FIRST_DRAFTS` step
samples: one slow sample from a new draft server looked like one.

What a plain step costs is measured with the draft server quiet: a plain round right after a drafted one
overlaps the draft server's last tree steps (its requests are closed without waiting), so only a plain
round that follows another is a sample, and a plain exploration from drafting lasts two rounds. Sampled
beside a busy draft server, plain decoding read 86 ms at c = 8 where the AR server's median time per
output token was 72: parking looked worse than it is, and the default drafted at 0.81x AR. Nor is a
drafted round before the `WARM_AFTER`-th in a row a sample (the draft server is still re-opening the
batch and building its first trees), or a width's first drafted step on the server (cold): one such
sample decides a new ratio, and probes made of such rounds confirmed the parks they came from. What a
drafted round yields is measured too: a miss answered by the fast backup drafts fewer than K tokens, so
the tokens a warm round (one that opened no request) actually accepted, over what E(α, K) expects,
scale the drafted gain (at c = 4,
rounds of K = 3 accepted 0.53 tokens where E(α, K) − 1 was 0.82). Opening new requests on the draft
server is a cost only drafting pays; its running mean per drafted round is added to drafted steps.

Re-opening is priced where it is paid. Leaving plain decoding re-opens every request of the batch on
the draft server (a draft prefill of its context, waited for), so a parked batch's drafted rates carry
that cost, measured per request, spread over the rounds the batch is expected to stay in its bucket
(the geometric running mean of its visits). Without it two neighbouring buckets that disagree would flap: at
c = 8 the batch dips from 8 to 7 for a round whenever a request ends, and a drafting 4-7 bucket beside
a parked 8 bucket would re-open the whole batch at each dip.
"""

from __future__ import annotations

import math
import random

from sglang_ssd.algo.policy import expected_tokens

EXPLORE_EVERY = 16
EXPLORE_PARKED = 128  # while plain decoding wins: trying a draft means re-opening every request
EXPLORE_PARKED_MAX = 1024  # the back-off's cap: a changed workload is still noticed within ~1000 rounds
# A parked bucket's explorations are spaced so that each (its re-open of the batch and its drafted
# rounds' extra time, both measured) costs at most this share of the plain rounds between them. At
# c = 8 one costs about 0.4 s against 50 ms plain steps: every 128-256 rounds that was 3-6 % of the
# time, and the parked default ran 6 % under AR (grid c8_sharegpt_2026-12-07f).
PROBE_SHARE = 0.01
EMA = 0.2  # weight of a new sample in a running mean (once its first samples are averaged)
# The widths' step ratios are relative, so old samples still apply: a long memory. A single step on
# this 2-core host varies by 15-30 %, and with EMA's 0.2 the batch-1 ratio of a 4-token verify read
# 1.04-1.41 over one grid's runs (defaults_2026-12-06g), a wider spread than the gains being weighed.
# bench/auto_k_noise.py: at 30 % step noise the realized rate rose from 0.87 to 0.96 of the best fixed
# K at batch 1 and from 0.92 to 0.95 at batch 4, with PLAIN_FIRST and the prior; 0.99 and 0.98 where
# plain decoding wins, as before.
RATIO_EMA = 0.05
# Plain rounds measured before a bucket drafts: every ratio is taken against the plain mean, and one
# lucky-fast first plain step made every draft look slow and parked the bucket for good (in the
# traces of bench/auto_k_noise.py's simulation).
PLAIN_FIRST = 3
# The draft shipped before f1fc32c had greedy per-token acceptance 0.45-0.51 on held-out text and
# served 0.46-0.50 (grid defaults_2026-12-06f); the current one reads 0.48-0.54 held out and served 0.51
# (grid h). auto-K starts from this value and the launch's planner prices K with it (defaults.py); it
# stays at the low end, since raising it moves the launch's ΣF table, which no grid has measured.
PRIOR_ALPHA = 0.47
# α's prior, worth this many judged positions: in the simulation a few unlucky first drafts (α read
# 0.24-0.36 where it was 0.47) parked a bucket that the rare, short parked explorations seldom freed.
PRIOR_TRIALS = 20
FIT_WEIGHT_CAP = 10  # a width's weight in the line: its count, up to this
# Drafted rounds an exploration from plain decoding lasts: its first round re-opens the batch and
# verifies the open's backup (teaching neither the yield nor the step time); the second verifies
# pre-drafted trees but still waits on the draft server's first trees; the third measures the step.
PARKED_PROBE = 3
# The first drafted round in a row whose step is a sample. Sampling from the second, a c = 2 run parked
# for 978 of 998 rounds with width 2 at 2.14 plain steps where a drafting run read 1.26 (grid
# c24_coldfix_2026-12-07j): the probes' own slow rounds kept it parked.
WARM_AFTER = 3
OWN_AFTER = 3
SWITCH_MARGIN = 0.05  # predicted gain needed to switch between plain decoding and drafting
# Drafted request-rounds (a round at batch b counts b) a bucket must have measured before it may park
# on a near thing: the first drafts give few, noisy α samples and step times, and a parked bucket
# re-learns only from rare explorations. Counting request-rounds, batch 1 waits 24 rounds and batch 8
# three: each of its rounds gives one α sample per request, and 24 rounds there, each return to
# drafting re-opening the whole batch, cost c = 8 7-17 %.
# Where plain decoding is predicted CLEAR_LOSS times faster than any draft, a bucket parks at once.
PARK_AFTER = 24
CLEAR_LOSS = 1.5
# Drafted step samples (in request-rounds, like PARK_AFTER) a drafting bucket takes at K = 1 before its
# first decision. A new draft server can run slow past the skipped warm-up rounds: a c = 1 run decided on
# one sample at 3.0 plain steps, parked on a clear loss for 2010 of 2016 rounds (grid c1_ab_2026-12-07q).
FIRST_DRAFTS = 4
MAX_GAP_S = 1.0  # a longer pause between steps is idleness, not scheduler work
YIELD_DECAY = 0.99  # per drafted round, for the tokens drafted rounds accepted against the expected
YIELD_PRIOR = 4.0  # the yield share's prior (1), worth a few rounds of a small batch
VISIT_PRIOR = 16.0  # rounds a bucket is expected to hold the batch before one of its visits ended
# A deeper K is weighed only while the token it adds, α^(K+1), is at least this share of E(α, K). Below
# it the gain is inside the noise of the step estimates (one c = 2 run measured width ratios 1.19,
# 1.68, 1.40, 1.46, 1.51 for widths 4-8) and a deeper tree costs the draft server time the rates do
# not see; that run chose K = 5-7 in a third of its rounds, and changed the draft depth 114 times in
# 700. At α = 0.5 the ceiling is K = 3, at 0.6 K = 4, at 0.8 K = 7.
DEPTH_GAIN_MIN = 0.04


BUCKETS = 6  # batch-size buckets: 1, 2-3, 4-7, 8-15, 16-31, 32 and more


def bucket_batches() -> list[int]:
    """The smallest batch size of each bucket, in bucket order."""
    return [1 << (b - 1) for b in range(1, BUCKETS + 1)]


def running_mean(m: list[float], x: float, ema: float = EMA) -> None:
    """``m`` = [mean, samples]: the mean of the samples so far until a new one's share falls to ``ema``,
    then each new sample moves it by ``ema``."""
    w = max(1.0 / (m[1] + 1), ema)
    m[0] = (1 - w) * m[0] + w * x
    m[1] += 1


class AutoK:
    """``budgets``: ΣF per batch-size bucket (rows) and K (entries), what :meth:`budget` asks of the
    draft server (``SSDConfig.tree_budgets``); empty, the draft server keeps its own."""

    def __init__(self, k_max: int, seed: int = 0, budgets: list[list[int]] | None = None):
        if k_max < 1:
            raise ValueError(f"auto-K needs a drafted length ≥ 1, got {k_max}")
        self.k_max = k_max
        self.budgets = budgets or []
        self.asked_budget: int | None = None  # the ΣF last asked of the draft server
        self.seen: dict[int, set[int]] = {}  # bucket -> widths measured
        self.plain: dict[int, list[float]] = {}  # bucket -> [running mean of plain steps (ms), count]
        self.ratios: dict[tuple[int, int], list[float]] = {}  # (bucket, width) -> [EMA of S(w)/S(1), count]
        self.gap_ms = 0.0
        self.accepted = PRIOR_ALPHA * PRIOR_TRIALS  # α's prior
        self.judged = float(PRIOR_TRIALS)
        self.best: dict[int, int] = {}  # bucket -> the last K the model chose (not an exploration)
        self.until_explore: dict[int, int] = {}  # bucket -> rounds left before its next exploration
        self.parked_every: dict[int, int] = {}  # bucket -> its current parked exploration interval
        self.chosen_in: dict[int, list[int]] = {}  # bucket -> rounds by the K chosen
        self.asked: int | None = None  # the depth last asked of the draft server
        self.reopen = [0.0, 0]  # running mean of the wait for opening one request on the draft server
        self.visits: dict[int, list[float]] = {}  # bucket -> [running mean of log(its visits' rounds), count]
        self.visit = (0, 0)  # (bucket, rounds so far) of the visit in progress
        self.last_k: int | None = None  # 0: the batch is parked (its requests closed on the draft server)
        self.switches = 0  # rounds that switched between plain decoding and drafting
        self.prev_width: int | None = None  # the last observed round's verified width
        self.stepped: set[int] = set()  # drafted widths stepped at least once on this server
        self.drafted_run = 0  # rounds in a row chosen to draft (K > 0), the current one included
        # (K, rounds still owed) of an exploration that crossed between plain decoding and drafting:
        # its first round pays the switch, so the owed ones are the rounds that measure K.
        self.probe: tuple[int, int] = (0, 0)
        self.evidence: dict[int, int] = {}  # bucket -> drafted request-rounds measured
        self.open_ms = 0.0  # running mean of the opens waited for in a drafted round (new requests)
        self.yielded: dict[int, list[float]] = {}  # bucket -> decayed [tokens accepted, E(α, K) − 1 expected]
        self.rng = random.Random(seed)

    @staticmethod
    def bucket(batch: int) -> int:
        return min(batch.bit_length(), BUCKETS)  # 1, 2-3, 4-7, ... batch sizes share estimates

    @property
    def chosen(self) -> list[int]:
        """Rounds by the K chosen, over all buckets."""
        return [sum(n) for n in zip(*self.chosen_in.values())] or [0] * (self.k_max + 1)

    @property
    def alpha(self) -> float:
        return min(max(self.accepted / self.judged, 0.0), 0.999)

    def step_ms(self, batch: int, width: int) -> float | None:
        """The expected whole-step time at ``width``; None until plain decoding and one other width
        were measured in the batch's bucket."""
        b = self.bucket(batch)
        plain = self.plain.get(b)
        if plain is None:
            return None
        if width == 1:
            return plain[0]
        own = self.ratios.get((b, width))
        if own is not None and own[1] >= OWN_AFTER:
            return plain[0] * own[0]
        pts = [(0.0, 1.0, plain[1])] + [(w - 1.0, *r) for (bb, w), r in self.ratios.items() if bb == b]
        if len(pts) < 2:
            return None
        sw = sx = sy = sxx = sxy = 0.0
        for x, y, n in pts:
            w = min(n, FIT_WEIGHT_CAP)
            sw, sx, sy, sxx, sxy = sw + w, sx + w * x, sy + w * y, sxx + w * x * x, sxy + w * x * y
        var = sw * sxx - sx * sx
        slope = max(0.0, (sw * sxy - sx * sy) / var) if var > 1e-9 else 0.0
        return plain[0] * max((sy - slope * sx) / sw + slope * (width - 1), 1e-3)

    def ceiling(self) -> int:
        """The deepest K worth weighing at the live α (``DEPTH_GAIN_MIN``), at most ``k_max``."""
        a, k = self.alpha, 1
        while k < self.k_max and a ** (k + 1) >= DEPTH_GAIN_MIN * expected_tokens(a, k):
            k += 1
        return k

    def expected_visit(self, b: int) -> float:
        """Rounds the batch is expected to stay in bucket ``b``: the geometric running mean of its past
        visits, or the visit in progress once it is longer (a batch size that holds stops paying for
        re-opens). Geometric, so one long visit does not outweigh the short ones that follow: after a
        1,000-round c = 2 run the arithmetic mean took a dozen one-round dips from c = 4 to batch 3 to fall
        below the re-open's break-even, each dip re-opening the batch (34 switches, grid
        c248_s20_2026-12-07o); the geometric one takes two."""
        v = self.visits.get(b)
        now = self.visit[1] if self.visit[0] == b else 0
        return max(VISIT_PRIOR if v is None else math.exp(v[0]), now, 1.0)

    def is_parked(self, b: int) -> bool:
        """Whether bucket ``b`` explores as a parked one (rarely and short, since each try re-opens the
        batch on the draft server): plain decoding won there, or, for a bucket not yet decided, at a
        smaller batch size (verification only grows costlier with the batch), or the batch enters it
        parked (at c = 8 each dip from 8 requests to 7 re-opened seven for a one-round visit)."""
        if b in self.best:
            return self.best[b] == 0
        return any(self.best.get(x) == 0 for x in range(b)) or (self.last_k == 0 and 0 in self.best.values())

    def drafted_samples(self, b: int) -> int:
        """Drafted step samples measured in bucket ``b`` (over all widths)."""
        return sum(int(n) for (bb, _), (_, n) in self.ratios.items() if bb == b)

    def parked_interval(self, batch: int) -> int:
        """Rounds between a parked bucket's explorations: ``EXPLORE_PARKED``, or, where plain decoding
        is predicted ``CLEAR_LOSS`` times faster than the drafts an exploration tries, as many more as
        keep one exploration (re-opening ``batch`` requests, then ``PARKED_PROBE`` drafted rounds at
        its widest width) within ``PROBE_SHARE`` of the plain rounds between. A near thing keeps the
        short interval: a bucket parked by a few noisy steps must be able to leave soon."""
        widest = min(2, self.k_max)
        drafts = [self.predicted_rate(batch, k) for k in range(1, widest + 1)]
        if None in drafts or self.predicted_rate(batch, 0) < CLEAR_LOSS * max(drafts):
            return EXPLORE_PARKED
        plain = self.step_ms(batch, 1)
        cost = self.reopen_ms * batch + PARKED_PROBE * max(self.step_ms(batch, widest + 1) - plain, 0.0)
        return max(EXPLORE_PARKED, math.ceil(cost / (PROBE_SHARE * (plain + self.gap_ms))))

    def yield_share(self, b: int) -> float:
        """Tokens drafted rounds of bucket ``b`` accepted over what E(α, K) expected of them (1 before
        any were measured)."""
        acc, exp = self.yielded.get(b, (YIELD_PRIOR, YIELD_PRIOR))
        return acc / exp

    def predicted_rate(self, batch: int, k: int) -> float | None:
        """Tokens per ms per request at ``k`` drafted tokens; None before the bucket is measured. A
        draft pays the opens of new requests, and from a parked batch its re-opens, spread over the
        bucket's expected visit; its gain is scaled by what drafted rounds yielded."""
        t = self.step_ms(batch, k + 1)
        if t is None:
            return None
        if k == 0:
            return 1.0 / (t + self.gap_ms)
        b = self.bucket(batch)
        t += self.open_ms
        if self.last_k == 0:
            t += self.reopen_ms * batch / self.expected_visit(b)
        return (1.0 + self.yield_share(b) * (expected_tokens(self.alpha, k) - 1.0)) / (t + self.gap_ms)

    @property
    def reopen_ms(self) -> float:
        return self.reopen[0]

    def _count_visit(self, b: int) -> None:
        """One more round in bucket ``b``; a change of bucket ends the previous visit."""
        last, n = self.visit
        if b != last and n:
            running_mean(self.visits.setdefault(last, [0.0, 0]), math.log(n))
            n = 0
        self.visit = (b, n + 1)

    def choose(self, batch: int) -> int:
        b, top = self.bucket(batch), self.ceiling()
        self._count_visit(b)
        seen = self.seen.get(b, set())
        parked = self.is_parked(b)
        every = (self.parked_every.get(b) or self.parked_interval(batch)) if parked else EXPLORE_EVERY
        left = min(self.until_explore.get(b, every), every) - 1
        explore = left <= 0
        self.until_explore[b] = every if explore else left
        if explore and parked and len(seen) >= 2:  # back off; a draft winning again resets it below
            self.parked_every[b] = min(2 * every, max(EXPLORE_PARKED_MAX, self.parked_interval(batch)))
        if self.probe[1] and (parked or self.probe[0] == 0):  # an exploration's owed rounds
            k, n = self.probe
            self.probe = (k, n - 1)
        elif self.plain.get(b, (0.0, 0))[1] < PLAIN_FIRST:
            k = 0
        elif len(seen) < 2 or (not parked and self.drafted_samples(b) * batch < FIRST_DRAFTS):
            k = 1 if explore or not parked else 0
        elif explore:
            # (a draw past the ceiling explores the ceiling: plain decoding keeps its share of the draws)
            k = self.rng.randint(1, min(2, top)) if parked else min(self.rng.randint(0, self.k_max), top)
            self.probe = (k, PARKED_PROBE - 1 if parked else int(k == 0 and bool(self.last_k)))
        else:
            rates = [self.predicted_rate(batch, k) for k in range(top + 1)]
            k = max(range(top + 1), key=rates.__getitem__)
            drafting = max(range(1, top + 1), key=rates.__getitem__)
            # Parking and un-parking cost re-opens and draft prefills that the step rates do not
            # see: a near-tie keeps the bucket on its side instead of flapping.
            if self.best.get(b) == 0 and k and rates[k] < (1 + SWITCH_MARGIN) * rates[0]:
                k = 0
            elif self.best.get(b, 0) > 0 and k == 0 and rates[0] < (1 + SWITCH_MARGIN) * rates[drafting]:
                k = drafting
            elif (k == 0 and self.best.get(b) != 0 and self.evidence.get(b, 0) < PARK_AFTER
                  and rates[0] < CLEAR_LOSS * rates[drafting]):
                k = drafting  # too little evidence to park on a near thing yet
            self.best[b] = k
            if k:
                self.parked_every.pop(b, None)
        self.chosen_in.setdefault(b, [0] * (self.k_max + 1))[k] += 1
        if self.last_k is not None and (k == 0) != (self.last_k == 0):
            self.switches += 1
        self.last_k = k
        self.drafted_run = self.drafted_run + 1 if k else 0
        return k

    def depth(self, batch: int) -> int:
        """The K the draft server should draft (it applies from its next trees, the round after next):
        the model's last choice for the batch's bucket, the ceiling before there is one, and the 1–2
        tokens of the explorations while plain decoding wins. A draft server that drafts what will be
        verified spends its verify window on that depth only; verification never needs more, and an
        exploration of a larger K verifies what was drafted."""
        best = self.best.get(self.bucket(batch))
        self.asked = self.ceiling() if best is None else best if best > 0 else min(2, self.k_max)
        return self.asked

    def budget(self, batch: int) -> int | None:
        """The ΣF per request the draft server should fork for the depth last asked (:meth:`depth`) at
        this batch size: the batch's trees share one draft core and one memory bus with the verify
        step, so larger batches get smaller trees. None without a table (the server keeps its ΣF)."""
        if not self.budgets or self.asked is None:
            return None
        row = self.budgets[min(self.bucket(batch), len(self.budgets)) - 1]
        self.asked_budget = row[min(self.asked, len(row)) - 1]
        return self.asked_budget

    def observe(self, batch: int, width: int, step_ms: float, gap_ms: float | None, accepted: list[int],
                drafted: list[int], opened: int = 0, open_ms: float = 0.0) -> None:
        """One round: ``step_ms`` the worker's whole step at ``width``, without opening requests;
        ``gap_ms`` the time since the previous step ended (None for the first); the accepted and
        drafted counts per request; ``opened`` requests opened on the draft server in ``open_ms``."""
        b, after = self.bucket(batch), self.prev_width
        self.prev_width = width
        self._observe_opens(width, after, opened, open_ms)
        if gap_ms is not None and gap_ms < 1000 * MAX_GAP_S:
            self.gap_ms = (1 - EMA) * self.gap_ms + EMA * gap_ms
        self._observe_acceptance(b, width, accepted, drafted, warm=not opened)
        cold = width > 1 and width not in self.stepped
        self.stepped.add(width)
        if self._is_step_sample(width, after, cold, self.drafted_run):
            self._observe_step(b, width, step_ms)

    @staticmethod
    def _is_step_sample(width: int, after: int | None, cold: bool, drafted_run: int) -> bool:
        """Whether a round's step time is what a step at ``width`` costs. Not a plain round right after a
        drafted one (it ran beside a draft server still finishing its trees), nor a drafted round before
        the ``WARM_AFTER``-th in a row (``drafted_run``: the draft server is still re-opening the batch and
        building its first trees), nor a ``cold`` one, a width's first drafted step on this server (its
        kernels' first call). One such sample decides a ratio's mean at first: a c = 1 run whose first
        drafted steps read 3.1 and 1.8 times a plain step parked on a clear loss and never left (grid
        c1_draft_2026-12-07h)."""
        if width == 1:
            return after in (None, 1)
        return not cold and drafted_run >= WARM_AFTER

    def _observe_opens(self, width: int, after: int | None, opened: int, open_ms: float) -> None:
        """The wait per opened request (what a re-open costs), and the opens a drafting round pays."""
        if opened:
            running_mean(self.reopen, open_ms / opened)
        if width > 1 and after not in (None, 1):  # (a re-opening round's opens are priced as re-opens)
            self.open_ms = (1 - EMA) * self.open_ms + EMA * open_ms

    def _observe_acceptance(self, b: int, width: int, accepted: list[int], drafted: list[int],
                            warm: bool = True) -> None:
        """Per-token α over positions judged (accepted + the rejection), and the bucket's yield share
        from ``warm`` rounds only: a request opened this round drafted from the open's backup, not a
        pre-drafted tree. Every return from plain decoding re-opens the batch, so its cold first round
        taught a parked bucket that drafts yield little, over and over (grid h, c = 4: yield 0.43 from
        16 such rounds, then parked for 934 of 950)."""
        for a, d in zip(accepted, drafted):
            if d > 0:
                self.accepted += a
                self.judged += a + (1 if a < d else 0)
        if width > 1:
            self.evidence[b] = self.evidence.get(b, 0) + len(accepted)
        if width > 1 and warm:
            acc, exp = self.yielded.setdefault(b, [YIELD_PRIOR, YIELD_PRIOR])
            expected = len(accepted) * (expected_tokens(self.alpha, width - 1) - 1.0)
            self.yielded[b] = [YIELD_DECAY * acc + sum(accepted), YIELD_DECAY * exp + expected]

    def _observe_step(self, b: int, width: int, step_ms: float) -> None:
        """The step's time: the plain mean at width 1, else its ratio to the plain mean."""
        self.seen.setdefault(b, set()).add(width)
        plain = self.plain.get(b)
        if width == 1:
            running_mean(self.plain.setdefault(b, [0.0, 0]), step_ms)
        elif plain is not None:  # (choose starts every bucket with a plain step)
            running_mean(self.ratios.setdefault((b, width), [0.0, 0]), step_ms / plain[0], RATIO_EMA)

    def snapshot(self) -> dict:
        return {
            "ssd_auto_k_alpha": self.alpha,
            "ssd_auto_k_gap_ms": self.gap_ms,
            "ssd_auto_k_chosen": self.chosen,
            "ssd_auto_k_chosen_by_bucket": {f"bucket{b}": list(n) for b, n in sorted(self.chosen_in.items())},
            "ssd_auto_k_depth": self.asked,
            "ssd_auto_k_budget": self.asked_budget,
            "ssd_auto_k_switches": self.switches,
            "ssd_auto_k_open_ms": self.open_ms,
            "ssd_auto_k_yield_share": {f"bucket{b}": round(self.yield_share(b), 3) for b in sorted(self.yielded)},
            "ssd_auto_k_reopen_ms": self.reopen_ms,
            "ssd_auto_k_visit_rounds": {f"bucket{b}": round(math.exp(v[0]), 2) for b, v in sorted(self.visits.items())},
            # Expected step ms per batch-size bucket (1 = batch 1, 2 = 2-3, 3 = 4-7, ...) at plain
            # decoding and at the full draft; None where not yet estimable (a parked bucket).
            "ssd_auto_k_step_ms": {
                f"bucket{b}": [None if (t := self.step_ms(1 << (b - 1), w)) is None else round(t, 2)
                               for w in (1, self.k_max + 1)]
                for b in sorted(self.seen)
            },
            # per bucket and drafted width: [step over the plain one's, rounds measured] (what the cost
            # line is fitted to)
            "ssd_auto_k_ratios": {f"bucket{b}/w{w}": [round(r, 3), int(n)] for (b, w), (r, n) in sorted(self.ratios.items())},
        }
