"""`--speculative-algorithm SSD` as an SGLang plugin algorithm.

The target side of SSD is a chain verify of K+1 tokens per request with no draft model and no draft
KV in the target process — the shape of SGLang's NGRAM path. Answering `is_ngram()` reuses every
scheduler branch NGRAM has (verify KV allocation, result relay, memory sizing) while the worker
(`sglang_ssd.target.worker.SSDWorker`) does its own drafting link and exact verification.
"""

from __future__ import annotations

from sglang.srt.speculative.spec_registry import CustomSpecAlgo

from sglang_ssd.target.ssd_config import SSDConfig

DEFAULT_MAX_RUNNING_REQUESTS = 48


class SSDSpecAlgo(CustomSpecAlgo):
    def is_ngram(self) -> bool:
        return True

    def has_draft_kv(self) -> bool:
        return False

    def carries_draft_hidden_states(self) -> bool:
        return False

    def need_topk(self) -> bool:
        return False

    def create_future_map(self, device, req_to_token_pool, needs_cpu_seq_lens=True, needs_confidence_relay=False):
        from sglang.srt.managers.overlap_utils import FutureMap

        return FutureMap(device, self, req_to_token_pool, needs_cpu_seq_lens, needs_confidence_relay)

    def handle_server_args(self, server_args) -> None:
        width = SSDConfig.from_env().verify_width
        # The verify path is synchronous: the draft server overlaps with it instead.
        server_args.disable_overlap_schedule = True
        server_args.enable_mixed_chunk = False
        server_args.speculative_num_draft_tokens = width
        server_args.speculative_eagle_topk = 1
        server_args.speculative_num_steps = width - 1
        if server_args.max_running_requests is None:
            server_args.max_running_requests = DEFAULT_MAX_RUNNING_REQUESTS


def worker_factory(server_args):
    from sglang_ssd.target.worker import SSDWorker

    return SSDWorker


def validate_server_args(server_args) -> None:
    SSDConfig.from_env()  # raises a one-line ConfigError on a bad setting
