"""The draft server: wire messages in, engine calls, wire replies out, pre-speculation in between.

The loop is single-threaded. Incoming messages always go first: every message waiting on the socket
is answered before the next tree step starts, so a lookup never waits for more than one batched tree
forward. While nothing is waiting the loop runs :meth:`DraftEngine.work_step` (glue, forks, branch
steps for all requests at once) — the pre-speculation that overlaps the target's verification.

Nothing a client sends can stop the loop: undecodable, oversized or inconsistent messages get an error
reply, unknown or out-of-sync requests a per-request error, and an internal failure an "internal" error
reply (logged with its traceback).
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import time
import traceback
from collections.abc import Callable

import torch

from ..wire.codec import Limits, decode_request, encode_reply, error_reply, probe_seq
from ..wire.messages import (
    PROTOCOL_VERSION,
    Ack,
    Alive,
    Close,
    CloseAll,
    Draft,
    Heartbeat,
    Open,
    OpenMany,
    Round,
    Speculations,
    StatsQuery,
    StatsReply,
)
from ..wire.speculation import Speculation, spec_to_msg
from ..wire.tensors import FrameWriter, WireError
from .engine import DraftEngine
from .lifetime import RequestError
from .stats import Timer

log = logging.getLogger("sglang_ssd.draft")

# Forwards of every size (tree steps, prefill chunks, both together) leave freed blocks that glibc
# keeps: without a periodic trim the server's resident memory creeps up under churn (measured +5 %
# in a minute of the e2e soak) although nothing is held.
TRIM_EVERY_S = 10.0


def release_free_heap() -> None:
    """Hand the heap's free memory back to the OS (glibc ``malloc_trim``; nothing elsewhere)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class DraftServer:
    def __init__(self, engine: DraftEngine, limits: Limits | None = None, *, idle_check_s: float = 1.0) -> None:
        self.engine = engine
        self.limits = limits or Limits()
        self.idle_check_s = idle_check_s
        self._last_idle_check = self._last_trim = time.monotonic()
        self.transport = None

    # ---- one message ------------------------------------------------------------------------------------
    def handle(self, peer: bytes, frames: list[bytes]) -> list[bytes]:
        """Reply frames for one request message; never raises."""
        stats = self.engine.stats
        _, seq = probe_seq(frames[0]) if frames else (-1, 0)
        t0 = time.perf_counter()
        try:
            env, _ = decode_request(frames, self.limits)
            if len(frames) > 1:
                raise WireError("bad_message", f"requests carry no tensor frames, got {len(frames) - 1}")
            body = env.body
            kind = type(body).__name__.lower()
            reply = self._dispatch(body, env.client, seq)
            ms = (time.perf_counter() - t0) * 1e3
            stats.record_ms(f"handle_{kind}", ms)
            return reply
        except WireError as e:
            stats.count(f"error_{e.code}")
            log.warning("refused message from %r: [%s] %s", peer, e.code, e)
            return error_reply(seq, e)
        except Exception as e:  # a bug must not take the server down; the client sees "internal"
            stats.count("error_internal")
            log.error("internal error on a message from %r:\n%s", peer, traceback.format_exc())
            return error_reply(seq, e)

    def _dispatch(self, body, client: str, seq: int) -> list[bytes]:
        eng = self.engine
        if isinstance(body, Round):
            with Timer(eng.stats, "round"):
                specs = eng.round(body.outcomes, body.depth, body.budget)
            return self._speculations(seq, specs)
        if isinstance(body, Open):
            try:
                spec = eng.open(body.rid, body.prompt_tokens, body.first_token, body.params, client)
            except RequestError as e:
                eng.stats.count("request_errors")
                spec = Speculation(body.rid, False, torch.empty(0, dtype=torch.int64), None, str(e))
            return self._speculations(seq, [spec])
        if isinstance(body, OpenMany):
            return self._speculations(seq, eng.open_many(body.opens, client))
        if isinstance(body, Draft):
            return self._speculations(seq, eng.draft(body.rids))
        if isinstance(body, Close):
            eng.stats.count("aborted" if body.abort else "close_messages")
            return encode_reply(seq, Ack(closed=eng.close(body.rids)))
        if isinstance(body, CloseAll):
            return encode_reply(seq, Ack(closed=eng.close_owner(client)))
        if isinstance(body, Heartbeat):
            return encode_reply(
                seq,
                Alive(server_time=time.time(), mode=eng.cfg.mode, k=eng.k, vocab_size=eng.model.vocab_size,
                      protocol=PROTOCOL_VERSION),  # fmt: skip
            )
        if isinstance(body, StatsQuery):
            snap = self.stats()
            if body.reset:
                eng.stats.reset()
            return encode_reply(seq, StatsReply(stats=snap))
        raise WireError("bad_message", f"unhandled message {type(body).__name__}")

    def _speculations(self, seq: int, specs: list[Speculation]) -> list[bytes]:
        writer = FrameWriter()
        msgs = [spec_to_msg(s, writer) for s in specs]
        return encode_reply(seq, Speculations(specs=msgs), writer.frames)

    def stats(self) -> dict[str, float | int | str]:
        eng = self.engine
        out: dict[str, float | int | str] = dict(eng.stats.snapshot())
        if eng.l0 is not None:
            out["l0_tau"] = eng.l0.tau
            out["l0_calibrating"] = int(eng.l0.calibrating)
            out |= {f"l0_alpha_tau{t}": round(a, 4) for t, a in eng.l0.measured().items()}
        if eng.tau1 is not None:
            out |= eng.tau1.snapshot()
        pool = eng.model.pool
        out.update(
            requests_open=len(eng.requests),
            kv_slots_used=pool.used_slots,
            kv_slots_total=pool.num_slots,
            kv_pool_bytes=pool.nbytes(),
            kv_pool_touched_bytes=pool.touched_bytes(),
            # the speculation cache is one table allocated at start, within --cache-mem-mb
            spec_cache_bytes=eng.store.nbytes(),
            spec_cache_cap_bytes=int(eng.cfg.cache_mem_mb * (1 << 20)),
            mode=eng.cfg.mode,
            k=eng.k,
            budget=eng.budget,
            forks=eng.forks,  # ΣF of the next trees: the budget, or less when a round asked for less
            fanout=",".join(map(str, eng.planner.plan(budget=eng.forks))),
            saguaro_c=eng.cfg.saguaro_c,
            backup=eng.backup.mode,
            device=str(eng.model.device),
            dropped_replies=getattr(self.transport, "dropped_replies", 0),
        )
        out.update(eng.planner.estimates())
        return out

    # ---- the loop ------------------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return self.engine.has_work()

    def work_step(self) -> None:
        try:
            self.engine.work_step()
        except Exception:
            # Drop all pre-speculation rather than loop on the same failure; rounds fall back to backups.
            log.error("tree step failed, pre-speculation dropped:\n%s", traceback.format_exc())
            self.engine.stats.count("error_tree_step")
            self.engine.cancel_prespeculation()

    def _wait_ms(self, poll_ms: int) -> int:
        """How long to wait for a message: ``poll_ms`` when idle, 0 when a tree step is ready to run, the
        time until the next round is due when that step would still be running then."""
        if not self.has_work():
            return poll_ms
        hold = self.engine.hold_s()
        if hold > 0.0:
            self.engine.stats.count("step_holds")
        return math.ceil(hold * 1000)

    def serve(self, transport, should_stop: Callable[[], bool], poll_ms: int = 50) -> None:
        """Answer messages and pre-speculate until ``should_stop()``."""
        self.transport = transport
        while not should_stop():
            msg = transport.recv(self._wait_ms(poll_ms))
            replied = False
            while msg is not None:
                peer, frames = msg
                transport.send(peer, self.handle(peer, frames))
                replied = True
                msg = transport.recv(0)
            if replied and self.has_work():
                # Let libzmq's I/O thread put the reply on the wire before a tree step takes the core.
                os.sched_yield()
            if self.has_work() and self.engine.hold_s() == 0.0:
                self.work_step()
            now = time.monotonic()
            if now - self._last_idle_check > self.idle_check_s:
                self._last_idle_check = now
                n = self.engine.expire_idle(now)
                if n:
                    log.info("freed %d idle requests", n)
                if now - self._last_trim > TRIM_EVERY_S:
                    self._last_trim = now
                    release_free_heap()
