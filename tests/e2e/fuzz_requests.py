"""Malformed and extreme-but-valid requests for the request fuzz (tests/e2e/test_request_fuzz.py).

Each entry is (route, body): body is a dict sent as JSON, or bytes sent as they are. Streams are cut
after their first event (which aborts the request), so a valid request that asks for a great deal of
work costs the server little; what is checked is that no request can take the server down.
"""

from __future__ import annotations

import json
import math
import random

GOOD = {"text": "Hello", "sampling_params": {"temperature": 0, "max_new_tokens": 4}}


def _sp(**kw) -> dict:
    return {"text": "Hello", "sampling_params": {"temperature": 0, "max_new_tokens": 4, **kw}}


def fixed_cases(vocab: int, hidden: int) -> list[tuple[str, object]]:
    row = [0.01] * hidden
    nan = json.dumps({"input_embeds": [[math.nan] * hidden], "sampling_params": {"max_new_tokens": 2}})
    inf = json.dumps({"input_embeds": [[math.inf] * hidden], "sampling_params": {"max_new_tokens": 2}})
    return [
        ("/generate", b"{not json"),
        ("/generate", b""),
        ("/generate", b"[]"),
        ("/generate", {}),
        ("/generate", {"text": ""}),
        ("/generate", {"input_ids": []}),
        ("/generate", {"text": "Hello", "input_ids": [1, 2]}),
        ("/generate", {"input_ids": [vocab + 5, 1]}),
        ("/generate", {"input_ids": [-1, 2]}),
        ("/generate", {"input_ids": [[1, 2], []]}),
        ("/generate", {"input_ids": ["a", "b"]}),
        ("/generate", {"input_ids": [1] * 5000}),  # longer than the context
        ("/generate", _sp(max_new_tokens=10**12)),
        ("/generate", _sp(max_new_tokens=-3)),
        ("/generate", _sp(max_new_tokens="many")),
        ("/generate", _sp(temperature=-1)),
        ("/generate", _sp(temperature=1e30)),
        ("/generate", _sp(top_p=0)),
        ("/generate", _sp(top_p=2)),
        ("/generate", _sp(top_k=0)),
        ("/generate", _sp(min_p=5)),
        ("/generate", _sp(n=0)),
        ("/generate", _sp(n=10**6)),
        ("/generate", _sp(stop=5)),
        ("/generate", _sp(stop=["x"] * 2000)),
        ("/generate", _sp(stop_token_ids=[vocab + 10])),
        ("/generate", _sp(logit_bias={"99999999": 5})),
        ("/generate", _sp(logit_bias={"1": "inf"})),
        ("/generate", _sp(frequency_penalty=50)),
        ("/generate", _sp(repetition_penalty=0)),
        ("/generate", _sp(json_schema="{not a schema")),
        ("/generate", _sp(json_schema='{"type": "object"}', regex="a+")),
        ("/generate", _sp(regex="(unclosed")),
        ("/generate", _sp(ebnf="root ::= ")),
        ("/generate", {**GOOD, "return_logprob": True, "top_logprobs_num": 10**7}),
        ("/generate", {**GOOD, "return_logprob": True, "logprob_start_len": 10**6}),
        ("/generate", {**GOOD, "custom_logit_processor": "{\"callable\": \"00ff\"}"}),
        ("/generate", {"input_embeds": [], "sampling_params": {"max_new_tokens": 2}}),
        ("/generate", {"input_embeds": [[0.1, 0.2]], "sampling_params": {"max_new_tokens": 2}}),
        ("/generate", {"input_embeds": [row[:-1] + ["x"]], "sampling_params": {"max_new_tokens": 2}}),
        ("/generate", {"input_embeds": [row] * 5000, "sampling_params": {"max_new_tokens": 2}}),
        ("/generate", nan.encode()),
        ("/generate", inf.encode()),
        ("/generate", {"input_embeds": [[1e30] * hidden], "sampling_params": {"max_new_tokens": 2}}),
        ("/v1/completions", {"model": "default", "prompt": "", "max_tokens": 4}),
        ("/v1/completions", {"model": "default", "prompt": "Hi", "max_tokens": -1}),
        ("/v1/completions", {"model": "default", "prompt": [vocab + 7], "max_tokens": 4}),
        ("/v1/completions", {"model": "default", "prompt": "Hi", "max_tokens": 4, "logprobs": 10**6}),
        ("/v1/chat/completions", {"model": "default", "messages": []}),
        ("/v1/chat/completions", {"model": "default", "messages": [{"role": "wizard", "content": "hi"}]}),
        ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user"}]}),
        ("/v1/chat/completions", {"model": "default", "messages": "hello"}),
        ("/v1/chat/completions", {"model": "default", "max_tokens": 4, "temperature": 0,
                                  "messages": [{"role": "user", "content": "hi"}],
                                  "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 7}}}),
        ("/v1/chat/completions", {"model": "default", "max_tokens": 4, "n": 0,
                                  "messages": [{"role": "user", "content": "hi"}]}),
    ]


STREAMED = [
    ("/generate", _sp(max_new_tokens=10**6, ignore_eos=True)),
    ("/v1/completions", {"model": "default", "prompt": "Hi", "max_tokens": 10**6, "temperature": 0}),
]


def random_cases(rng: random.Random, count: int, vocab: int) -> list[tuple[str, object]]:
    """Sampling parameters drawn at random from valid and invalid ranges, on short prompts."""
    keys = {
        "temperature": lambda: rng.choice([0, 0.5, 1.0, -0.5, 1e9, float("nan")]),
        "top_p": lambda: rng.choice([0.0, 0.1, 1.0, 1.5]),
        "top_k": lambda: rng.choice([-1, 0, 1, 5, 10**9]),
        "min_p": lambda: rng.choice([0.0, 0.5, 1.0, -1.0]),
        "max_new_tokens": lambda: rng.choice([0, 1, 3, -1]),
        "frequency_penalty": lambda: rng.choice([0.0, 1.0, -2.0, 3.0]),
        "repetition_penalty": lambda: rng.choice([1.0, 0.5, 2.0, 0.0]),
        "min_new_tokens": lambda: rng.choice([0, 2, 10**6]),
        "stop_token_ids": lambda: [rng.randrange(-5, vocab + 5)],
        "ignore_eos": lambda: rng.choice([True, False]),
    }
    out = []
    for _ in range(count):
        sp = {k: f() for k, f in rng.sample(sorted(keys.items()), rng.randint(1, 4))}
        sp.setdefault("max_new_tokens", 3)
        prompt = {"input_ids": [rng.randrange(0, vocab) for _ in range(rng.randint(1, 6))]}
        body = json.dumps({**prompt, "sampling_params": sp}, allow_nan=True).encode()
        out.append(("/generate", body))
    return out
