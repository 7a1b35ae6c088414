"""SSDWorker: SGLang's speculative worker for `--speculative-algorithm SSD`.

One decode step = one SSD round (docs/ALGORITHM.md §2) seen from the target, in four phases:
1. propose: take each request's pending speculation (K tokens + the q′ they were drawn from) that the
   draft server sent after the previous round; a request without one is opened on the draft server
   now (first round, after a fault, after an out-of-sync reply) — a forced miss;
2. verify: one TARGET_VERIFY forward over the chain [last, s_1..s_K] of every request (NGRAM's verify
   shape), then exact rejection sampling with the q′ received (`sglang_ssd.algo.verify_chain`) on the
   request's own processed distribution — never SGLang's greedy-only CPU verify;
3. commit KV: keep the KV of accepted tokens and hand `accept_lens` (bonus included) to the scheduler;
4. report: post the outcomes (k, bonus) to the draft server; its reply, the next round's speculation,
   is collected at the start of the next step, so the round trip overlaps the scheduler's own work.
While the target verifies, the draft server pre-speculates the likely outcomes, so step 4's reply is
usually a cache hit answered at once. Prefill batches are a plain target forward. The conversions
between SGLang's objects and the project's types live in `target_logits.py`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_func
from sglang.srt.layers.logprob_processor import compute_spec_logprobs
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.ngram_info import NgramVerifyInput

from sglang_ssd.target import metrics, module_timers
from sglang_ssd.target.auto_k import AutoK
from sglang_ssd.target.draft_link import DraftLink
from sglang_ssd.target.proposals import BatchProposal, chain_tree, stack_proposals
from sglang_ssd.target.ssd_config import SSDConfig
from sglang_ssd.target.target_logits import (
    AcceptLayout,
    accept_layout,
    draft_params,
    drafts_allowed,
    processed_logits,
    request_generators,
    sampled_outcome,
    sampling_batch,
    verify_chain_ids,
)
from sglang_ssd.target.tp_sync import TPSync
from sglang_ssd.wire.speculation import Outcome, Speculation

logger = logging.getLogger(__name__)


class SSDWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id=None, nccl_port=None, target_worker=None, **kwargs):
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self.model_runner = target_worker.model_runner
        self.device = self.model_runner.device
        self.config = SSDConfig.from_env()
        self.width = self.config.verify_width  # root + K drafts (K's ceiling under auto)
        self.k = self.width - 1
        self.speculative_num_draft_tokens = self.width
        # Tensor parallel: only the TP group's source rank talks to the draft server (tp_sync.py).
        self.tp = TPSync.from_sglang(server_args)
        self.link = DraftLink(self.config) if self.tp is None or self.tp.is_source else None
        self.pending: dict[str, Speculation] = {}
        self.auto_k = AutoK(self.k, budgets=self.config.tree_budgets) if self.config.k == "auto" else None
        self._last_step_end = 0.0
        self._open_s = 0.0
        self._opened = 0
        self.stats = metrics.SSDStats()
        self.enable_metrics = bool(getattr(server_args, "enable_metrics", False))
        # the diagnostic per-part timers (module_timers.py), only when asked for
        self.module_timers = module_timers.ModuleTimers(self.model_runner.model) if module_timers.enabled() else None
        metrics.register_worker(self)
        logger.info("SSD worker: K=%d, draft servers %s, mode %s", self.k, self.config.draft_endpoints,
                    self.config.mode)

    @property
    def draft_worker(self):
        return None  # the draft runs in its own server, not in this process

    def alloc_memory_pool(self, **kwargs):
        self.req_to_token_pool, self.token_to_kv_pool_allocator = self._target_worker.get_memory_pool()

    def clear_cache_pool(self):
        if self.link is not None:
            for rid in list(self.pending):
                self.link.close(rid)
        self.pending.clear()

    def note_request_finished(self, *, rid: str, natural_stop: bool) -> None:
        self.pending.pop(rid, None)
        if self.link is not None:
            self.link.close(rid)

    # ---- one step ----------------------------------------------------------------------------------
    def forward_batch_generation(self, batch, on_publish=None, pp_proxy_tensors=None, **kwargs):
        if not batch.forward_mode.is_decode():
            return self._forward_prefill(batch, on_publish, pp_proxy_tensors)
        return self._forward_round(batch, on_publish, pp_proxy_tensors)

    def _forward_prefill(self, batch, on_publish, pp_proxy_tensors):
        self._last_step_end = 0.0  # the next decode step's gap would count this prefill
        if self.module_timers is not None:
            self.module_timers.width = 0
        result = self.target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors)
        bs = len(batch.reqs)
        predict = result.next_token_ids
        accept_tokens = torch.zeros(bs, self.width, dtype=torch.int32, device=self.device)
        accept_tokens[:, 0] = predict
        accept_lens = torch.ones(bs, dtype=torch.int32, device=self.device)
        new_seq_lens = batch.seq_lens.clone()
        if on_publish is not None:
            on_publish(new_seq_lens)
        return self._result(result.logits_output, predict, accept_tokens.flatten(), accept_lens, new_seq_lens,
                            result.can_run_cuda_graph)

    # ---- one decode round: propose → verify → commit KV → report -------------------------------------
    def _forward_round(self, batch, on_publish, pp_proxy_tensors):
        clock = RoundClock()
        self._open_s = 0.0  # opening new requests on the draft server: once per request, not per round
        self._opened = 0
        specs, proposal, hits = self._propose(batch, clock)
        chain = verify_chain_ids(batch, proposal.tokens).to(self.device)  # [bs, d]
        d = chain.shape[1]
        result, outcome = self._verify(batch, chain, proposal, pp_proxy_tensors, clock)
        accepted = self._accept_layout(batch, result.logits_output, outcome, d)
        if on_publish is not None:
            on_publish(accepted.new_seq_lens)
        batch.forward_mode = ForwardMode.DECODE
        # Per-request, per-round SSD facts; SGLang accumulates them into the request's meta_info.
        result.logits_output.customized_info = {"ssd_hit": hits, "ssd_drafted": proposal.num_draft.tolist()}
        self._report(batch, specs, proposal, outcome, d, clock)
        return self._result(result.logits_output, accepted.tokens, accepted.tokens, accepted.lens,
                            accepted.new_seq_lens, result.can_run_cuda_graph)

    def _propose(self, batch, clock):
        """The round's K and each request's speculation, stacked into one proposal on every TP rank.
        ⇒ (specs, proposal, hits); specs is None on a rank without a draft link."""
        specs = proposal = hits = None
        if self.link is not None:
            k_round = self.auto_k.choose(len(batch.reqs)) if self.auto_k else self.k
            self.pending.update(self.link.collect())  # the round posted at the end of the previous step
            # Auto-K chose plain decoding: park the batch's requests on the draft server (closed, so
            # it stops speculating for them and leaves the machine to the target); they are
            # re-opened with their committed context when a later round drafts again.
            specs = self._park(batch) if self.auto_k and k_round == 0 else self._speculations(batch)
            proposal = self._stack(specs, k_round)
            hits = [int(s.hit) if s is not None and len(s.tokens) else -1 for s in specs]
            clock.collected = time.perf_counter()  # SSD's own pre-work: collect, opens, stacking
        if self.tp is not None:  # the source's proposal (and its K) on every rank
            proposal, hits = self.tp.proposal(proposal, hits)
        return specs, proposal, hits

    def _speculations(self, batch) -> list[Speculation | None]:
        """The pending speculation of every request; opens requests the draft server does not know."""
        specs = [self.pending.pop(req.rid, None) if self.link.is_open(req.rid) else None for req in batch.reqs]
        new = [i for i, spec in enumerate(specs) if spec is None and drafts_allowed(batch.reqs[i])]
        if new:  # every request the draft server does not know yet, in one message per server
            opens = []
            for i in new:
                req = batch.reqs[i]
                committed = list(req.origin_input_ids) + list(req.output_ids)
                opens.append((req.rid, committed[:-1], committed[-1], draft_params(req)))
            t = time.perf_counter()
            for i, spec in zip(new, self.link.open_many(opens)):
                specs[i] = spec
            self._open_s += time.perf_counter() - t
            self._opened += len(new)
        return specs

    def _park(self, batch) -> list[None]:
        for req in batch.reqs:
            self.pending.pop(req.rid, None)
            if self.link.is_open(req.rid):
                self.link.close(req.rid, wait=False)
        return [None] * len(batch.reqs)

    def _stack(self, specs, k: int) -> BatchProposal:
        vocab = self.model_runner.model_config.vocab_size
        proposal = stack_proposals(specs, k, vocab)  # a shorter chain than drafted stays exact
        if k and int(proposal.num_draft.max()) == 0:  # nothing to verify (draft server down)
            proposal = stack_proposals(specs, 0, vocab)
        return proposal

    def _verify(self, batch, chain, proposal, pp_proxy_tensors, clock):
        """One target forward over the chains, then exact rejection sampling with the q′ received, on
        each request's own processed distribution. ⇒ (SGLang's forward result, the outcome, the same on
        every TP rank)."""
        d = chain.shape[1]
        clock.forward, clock.forward_cpu = time.perf_counter(), time.thread_time()
        if self.module_timers is not None:
            self.module_timers.width = d
        plain = d == 1 and not batch.return_logprob and not batch.has_grammar
        if plain:
            result = self._decode_forward(batch, chain, pp_proxy_tensors)
        else:
            result = self._verify_forward(batch, chain, d, pp_proxy_tensors)
        clock.verified, clock.verified_cpu = time.perf_counter(), time.thread_time()
        if plain:  # nothing drafted: SGLang's own sampler drew the token, exactly as in an AR step
            outcome = sampled_outcome(result.next_token_ids)
        else:
            logits, allowed = processed_logits(batch, result.logits_output.next_token_logits, chain, d)
            outcome = proposal.verify(logits.view(len(batch.reqs), d, -1), sampling_batch(batch),
                                      allowed_mask=allowed, generator=request_generators(batch))
        if self.tp is not None:
            outcome = self.tp.outcome(outcome)  # one set of coins for the whole TP group
        return result, outcome

    def _accept_layout(self, batch, logits_output, outcome, d) -> AcceptLayout:
        """The accepted tokens in SGLang's accept layout (and their logprobs). Their KV needs no move:
        a chain's accepted tokens are the front of its verify window, where the forward wrote them
        (SGLang's move_accept_tokens_to_target_kvcache copies each slot onto itself here, every layer:
        2.4 % of the scheduler's time in a parked c = 8 run)."""
        accepted = accept_layout(outcome, batch.seq_lens, d, self.width, self.device)
        if batch.return_logprob:
            compute_spec_logprobs(batch, logits_output, accepted.predict, accept_index=accepted.index)
        return accepted

    def _report(self, batch, specs, proposal, outcome, d, clock):
        """Post the outcomes to the draft server, then record the round."""
        k_list, bonus_list = outcome.accept_len.tolist(), outcome.bonus.tolist()
        clock.posted = time.perf_counter()
        link_s = 0.0
        if self.link is not None:
            self._post(batch, specs, k_list, bonus_list)
            link_s = (clock.collected - clock.start - self._open_s) + (time.perf_counter() - clock.posted)
        clock.end = time.perf_counter()
        self._record(len(batch.reqs), d, specs, proposal, k_list, link_s, clock)

    def _record(self, bs, d, specs, proposal, k_list, link_s, clock) -> None:
        """The round's counters and, under auto-K, the step's measured time at this width."""
        used = [s for s in specs or [] if s is not None and len(s.tokens)]
        self.stats.record_round(
            num_draft=proposal.num_draft.tolist(), accepted=k_list, verify_s=clock.verified - clock.forward,
            link_s=link_s, width=d, total_s=clock.end - clock.start, open_s=self._open_s,
            math_s=clock.posted - clock.verified,
            all_hits=bool(used) and all(s.hit for s in used) and not self._open_s,
            verify_cpu_s=clock.verified_cpu - clock.forward_cpu,
        )
        if self.auto_k:
            gap_ms = 1000 * (clock.start - self._last_step_end) if self._last_step_end else None
            step_ms = 1000 * (clock.end - clock.start - self._open_s)
            self.auto_k.observe(bs, d, step_ms, gap_ms, k_list, proposal.num_draft.tolist(),
                                opened=self._opened, open_ms=1000 * self._open_s)
        self._last_step_end = clock.end
        if self.enable_metrics and self.stats.rounds % 16 == 0:
            metrics.export_prometheus()

    def _post(self, batch, specs, k_list, bonus_list) -> None:
        """Tell the draft server what happened; its reply is the next round's speculation. SSD posts it
        now and collects it at the start of the next step (the round trip overlaps the scheduler's work
        in between); the SD baseline (sync) waits for its draft here."""
        outcomes = [
            Outcome(req.rid, k_list[i], bonus_list[i])
            for i, req in enumerate(batch.reqs)
            if specs[i] is not None and self.link.is_open(req.rid)
        ]
        # auto-K steers the draft server's depth to the K it verifies, and its trees' ΣF to the batch
        # (None: the server keeps its own)
        depth = budget = None
        if self.auto_k and outcomes:
            depth, budget = self.auto_k.depth(len(batch.reqs)), self.auto_k.budget(len(batch.reqs))
        self.link.post(outcomes, depth, budget)
        if self.config.mode == "sync":
            self.pending.update(self.link.collect())

    def _verify_forward(self, batch, chain, d, pp_proxy_tensors):
        """One TARGET_VERIFY forward over every request's chain [last, s_1..s_K] (NGRAM's shape)."""
        bs = chain.shape[0]
        mask = torch.ones(d, d, dtype=torch.bool, device=self.device).tril().repeat(bs, 1, 1).flatten()
        positions, retrieve_index, retrieve_next_token, retrieve_next_sibling = chain_tree(batch.seq_lens, d)
        batch.forward_mode = ForwardMode.TARGET_VERIFY
        batch.input_ids = chain.flatten()
        batch.out_cache_loc = self._cache_locs(batch, d)
        batch.spec_info = NgramVerifyInput(
            draft_token=batch.input_ids,
            custom_mask=mask,
            positions=positions,
            retrieve_index=retrieve_index,
            retrieve_next_token=retrieve_next_token,
            retrieve_next_sibling=retrieve_next_sibling,
            draft_token_num=d,
        )
        return self.target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors, is_verify=True)

    def _decode_forward(self, batch, chain, pp_proxy_tensors):
        """K = 0 (auto-K chose plain decoding, or nothing was drafted): an ordinary DECODE forward of
        the last token, sampled by SGLang's own sampler, so such a round is an AR step."""
        bs = chain.shape[0]
        saved = (batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum, batch.spec_info)
        batch.out_cache_loc = self._cache_locs(batch, 1)
        batch.forward_mode = ForwardMode.DECODE
        batch.input_ids = chain[:, 0].contiguous()
        # A DECODE batch counts the token being decoded in its lengths (SGLang's prepare_for_decode).
        batch.seq_lens = batch.seq_lens + 1
        if batch.seq_lens_cpu is not None:
            batch.seq_lens_cpu = batch.seq_lens_cpu + 1
        if batch.seq_lens_sum is not None:
            batch.seq_lens_sum = batch.seq_lens_sum + bs
        batch.spec_info = None
        try:
            return self.target_worker.forward_batch_generation(batch, pp_proxy_tensors=pp_proxy_tensors)
        finally:
            batch.seq_lens, batch.seq_lens_cpu, batch.seq_lens_sum, batch.spec_info = saved

    def _cache_locs(self, batch, d):
        return assign_extend_cache_locs_func(
            req_pool_indices=batch.req_pool_indices,
            req_to_token=batch.req_to_token_pool.req_to_token,
            start_offset=batch.seq_lens,
            end_offset=batch.seq_lens + d,
            batch_size=len(batch.reqs),
            draft_token_num=d,
            device=self.device,
        )

    def _result(self, logits_output, next_token_ids, accept_tokens, accept_lens, new_seq_lens, graph):
        next_draft_input = NgramVerifyInput(
            draft_token_num=self.width,
            new_seq_lens=new_seq_lens,
            accept_tokens=accept_tokens,
            accept_lens=accept_lens,
        )
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=next_token_ids,
            can_run_cuda_graph=graph,
            accept_lens=accept_lens,
            new_seq_lens=new_seq_lens,
            next_draft_input=next_draft_input,
            speculative_num_draft_tokens=self.width,
        )



@dataclass
class RoundClock:
    """The round's timestamps (perf_counter seconds); ``collected`` stays ``start`` without a link.
    ``*_cpu``: the forward's ends in this thread's CPU time (``time.thread_time``)."""

    start: float = field(default_factory=time.perf_counter)
    collected: float = 0.0
    forward: float = 0.0
    verified: float = 0.0
    posted: float = 0.0
    end: float = 0.0
    forward_cpu: float = 0.0
    verified_cpu: float = 0.0

    def __post_init__(self) -> None:
        self.collected = self.start
