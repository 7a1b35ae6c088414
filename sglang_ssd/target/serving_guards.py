"""Request-path guards every SGLang process gets from the plugin (with or without SSD).

- ``input_embeds`` rows reach the model in the model's own dtype: SGLang 0.5.23 hands them on as
  bfloat16 whatever the model's dtype (``ModelRunner._extend_forward_kwargs``), and an fp32 model's
  first linear then fails on mixed dtypes inside the scheduler, which takes the whole server down.
- Requests are checked where they enter (``TokenizerManager._validate_one_request``): a prompt of at
  least one token, token ids inside the vocabulary, at most ``MAX_TOP_LOGPROBS`` top logprobs, a
  custom logit processor that loads; ``input_embeds`` rows of the model's hidden size, finite
  numbers, at most the context length. A bad request is refused with a one-line error (HTTP 400) instead of reaching a
  forward that would fail and take the scheduler (the whole server) down with it.
- One request fans out to at most ``MAX_SEQUENCES_PER_REQUEST`` sequences (prompts in the batch
  times ``n``): SGLang expands ``n`` into that many requests before any check, so a single
  ``n = 1000000`` left the server unanswering for minutes.
- Processes SGLang starts for ``--tokenizer-worker-num > 1`` import the HTTP app by its dotted path
  and never run ``load_plugins()``: the plugin points that path at ``sglang_ssd.target.http_app``,
  which loads the plugins first, so those workers know ``--speculative-algorithm SSD`` too.
"""

from __future__ import annotations

import math
import os

from sglang_ssd.hooks import register_once

EMBEDS_TARGET = "sglang.srt.model_executor.model_runner.ModelRunner._extend_forward_kwargs"
VALIDATE_TARGET = "sglang.srt.managers.tokenizer_manager.TokenizerManager._validate_one_request"
SHAPE_TARGET = "sglang.srt.managers.io_struct.GenerateReqInput._determine_batch_size"
FANOUT_TARGET = "sglang.srt.managers.io_struct.GenerateReqInput._handle_parallel_sampling"
MAX_SEQUENCES_PER_REQUEST = 16384  # the sampling-law tests send 12,600 in one batch
MAX_TOP_LOGPROBS = 256  # alternatives returned per token: each costs a row of the answer
APP_PATH_ENV = "SGLANG_HTTP_SERVER_APP_PATH"
SGLANG_APP = "sglang.srt.entrypoints.http_server:app"
PLUGIN_APP = "sglang_ssd.target.http_app:app"


def embeds_in_model_dtype(original, runner, forward_batch, *args, **kwargs):
    out = original(runner, forward_batch, *args, **kwargs)
    embeds = out.get("input_embeds")
    if embeds is None or forward_batch.input_embeds is None:
        return out
    dtype = runner.model.get_input_embeddings().weight.dtype
    if embeds.dtype != dtype:
        replaced = forward_batch.replace_embeds is not None and forward_batch.replace_positions is not None
        # Without replacements the request's own rows are taken again: casting SGLang's bf16 copy
        # would keep its rounding.
        out["input_embeds"] = (embeds if replaced else forward_batch.input_embeds).to(dtype)
    return out


def embeds_problem(embeds, hidden_size: int, max_rows: int) -> str | None:
    """Why ``embeds`` (one request's ``input_embeds``) cannot be served, or None."""
    if not isinstance(embeds, list) or not embeds:
        return "input_embeds must be a non-empty list of rows"
    if len(embeds) > max_rows:
        return f"input_embeds has {len(embeds)} rows, more than the {max_rows} this server's context allows"
    for i, row in enumerate(embeds):
        if not isinstance(row, list) or len(row) != hidden_size:
            return f"input_embeds row {i} must be a list of {hidden_size} numbers (the model's hidden size)"
        for v in row:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                return f"input_embeds row {i} holds {v!r}: every value must be a finite number"
    return None


def validate_request(manager, obj, input_ids, *args, **kwargs):
    """Refuse, before it is queued, what would fail inside a forward (and take the scheduler down)."""
    embeds = getattr(obj, "input_embeds", None)
    vocab = manager.model_config.vocab_size
    if embeds is None:
        if input_ids is not None and len(input_ids) == 0:
            raise ValueError("the prompt is empty: send at least one token")
        if input_ids is not None and not all(type(t) is int and 0 <= t < vocab for t in input_ids):
            raise ValueError(f"input_ids must be token ids in [0, {vocab})")
    top = getattr(obj, "top_logprobs_num", None)
    for n in top if isinstance(top, list) else [top]:
        if n is not None and not 0 <= n <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs_num must be in [0, {MAX_TOP_LOGPROBS}], got {n}")
    processor = getattr(obj, "custom_logit_processor", None)
    # The scheduler loads it too: one that cannot load would fail there, for the whole server. Loaded
    # here only where the server enables the feature (loading one runs the client's code).
    if processor and custom_processors_enabled():
        from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor

        try:
            CustomLogitProcessor.from_str(processor)
        except Exception as exc:
            raise ValueError(f"custom_logit_processor cannot be loaded: {type(exc).__name__}: {exc}") from None
    if embeds is None:
        return None
    max_rows = max(1, manager.context_len - getattr(manager, "num_reserved_tokens", 0) - 1)
    problem = embeds_problem(embeds, manager.model_config.hidden_size, max_rows)
    if problem is not None:
        raise ValueError(problem)
    return None


def custom_processors_enabled() -> bool:
    from sglang.srt.runtime_context import get_exec

    return bool(get_exec().features.enable_custom_logit_processor)


def embeds_not_empty(obj, *args, **kwargs):
    """SGLang reads ``input_embeds[0][0]`` to tell one request from a batch: an empty list (or first
    row) failed there with an IndexError, a 500 instead of a 400."""
    embeds = obj.input_embeds
    if obj.text is None and obj.input_ids is None and embeds is not None:
        if not isinstance(embeds, list) or not embeds or not isinstance(embeds[0], list) or not embeds[0]:
            raise ValueError("input_embeds must be a non-empty list of rows (or a list of such lists)")
    return None


def bounded_fanout(_result, obj, *args, **kwargs):
    n = obj.parallel_sample_num
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if obj.batch_size * n > MAX_SEQUENCES_PER_REQUEST:
        raise ValueError(f"one request may ask for at most {MAX_SEQUENCES_PER_REQUEST} sequences "
                         f"(prompts x n); this one asks for {obj.batch_size} x {n}")
    return None


def point_workers_at_plugin_app() -> None:
    """Let tokenizer worker processes load the plugins (an app path the user set is left alone)."""
    if os.environ.get(APP_PATH_ENV, SGLANG_APP) == SGLANG_APP:
        os.environ[APP_PATH_ENV] = PLUGIN_APP


def register() -> None:
    register_once(EMBEDS_TARGET, embeds_in_model_dtype)
    register_once(VALIDATE_TARGET, validate_request, "BEFORE")
    register_once(SHAPE_TARGET, embeds_not_empty, "BEFORE")
    register_once(FANOUT_TARGET, bounded_fanout, "AFTER")
    point_workers_at_plugin_app()
