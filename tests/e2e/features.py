"""The SGLang serving features checked under SSD against plain decoding (the feature matrix).

Each case sends the same requests to an AR server and an SSD server and reduces each answer to what
must agree: at T = 0 the tokens (and text), logprob values within a tolerance, otherwise the shape of
the answer. ``EXPECTED`` says what each case must show under SSD ("same" as AR, or "refused" with a
one-line error); the README's feature table is generated from it (``feature_table``), so the table and
the tests cannot drift apart.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

PROMPT = "The three most useful kitchen tools are"
PROMPTS = ["Name a primary colour:", "Water boils at", "A short poem about the sea:"]
NEW = 16


class Refused(Exception):
    """The server answered the request with an error status (the message is kept)."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message = status, message


def post(url: str, path: str, payload: dict, timeout: float = 300.0):
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(payload).encode(),
                                 headers={"content-type": "application/json"})  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return json.loads(r.read())
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace")
        try:
            message = json.loads(body).get("error", {}).get("message") or body
        except (ValueError, AttributeError):
            message = body
        raise Refused(e.code, str(message)) from None


def stream(url: str, path: str, payload: dict, timeout: float = 300.0, stop_after: int | None = None) -> list[dict]:
    """The JSON events of a server-sent-event stream (all, or the first ``stop_after``; the connection
    is then closed, which aborts the request)."""
    req = urllib.request.Request(f"{url}{path}", data=json.dumps({**payload, "stream": True}).encode(),
                                 headers={"content-type": "application/json"})  # fmt: skip
    events = []
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            for raw in r:
                line = raw.decode().strip()
                if not line.startswith("data:") or line == "data: [DONE]":
                    continue
                events.append(json.loads(line[5:]))
                if stop_after is not None and len(events) >= stop_after:
                    break
    except urllib.error.HTTPError as e:
        raise Refused(e.code, e.read().decode(errors="replace")) from None
    return events


def greedy(extra: dict | None = None, n: int = NEW) -> dict:
    return {"temperature": 0, "max_new_tokens": n, **(extra or {})}


def gen(url: str, sampling: dict, text=PROMPT, **extra) -> dict | list:
    return post(url, "/generate", {"text": text, "sampling_params": sampling, **extra})


def finish(out: dict) -> tuple:
    reason = out["meta_info"]["finish_reason"]
    return out["text"], reason.get("type"), reason.get("matched")


# ---- cases: each returns what must agree between AR and SSD ----------------------------------------
def case_greedy(url, ctx):
    return finish(gen(url, greedy()))


def case_logprobs(url, ctx):
    out = gen(url, greedy(), return_logprob=True, top_logprobs_num=3)
    meta = out["meta_info"]
    tokens = [(round(lp, 3), tid) for lp, tid, _ in meta["output_token_logprobs"]]
    top = [[(round(lp, 3), tid) for lp, tid, _ in row] for row in meta["output_top_logprobs"]]
    return {"text": out["text"], "tokens": tokens, "top": top}


def case_n2(url, ctx):
    outs = gen(url, greedy({"n": 2}))
    return [o["text"] for o in outs]


def case_stop_string(url, ctx):
    return finish(gen(url, greedy({"stop": [" and", ","]}, n=32)))


def case_stop_token_ids(url, ctx):
    stop_id = ctx["stop_id"]
    return finish(gen(url, greedy({"stop_token_ids": [stop_id]}, n=32)))


def case_json_schema(url, ctx):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}  # fmt: skip
    return finish(gen(url, greedy({"json_schema": json.dumps(schema)}, n=24), text="A person as JSON:"))


def case_regex(url, ctx):
    return finish(gen(url, greedy({"regex": r"(Paris|London|Rome)\. [A-Z][a-z]+"}), text="The capital of France is"))


def case_ebnf(url, ctx):
    grammar = 'root ::= "The answer is " ("yes" | "no") "."'
    return finish(gen(url, greedy({"ebnf": grammar}), text="Is the sky blue?"))


def case_frequency_penalty(url, ctx):
    return finish(gen(url, greedy({"frequency_penalty": 2.0}, n=24)))


def case_presence_penalty(url, ctx):
    return finish(gen(url, greedy({"presence_penalty": -2.0}, n=24)))


def case_repetition_penalty(url, ctx):
    return finish(gen(url, greedy({"repetition_penalty": 1.3}, n=24)))


def case_min_new_tokens(url, ctx):
    return finish(gen(url, greedy({"min_new_tokens": 20}, n=24)))


def case_logit_bias(url, ctx):
    return finish(gen(url, greedy({"logit_bias": {str(ctx["stop_id"]): -100.0}}, n=24)))


def case_custom_logit_processor(url, ctx):
    from sglang.srt.sampling.custom_logit_processor import DisallowedTokensLogitsProcessor

    params = greedy({"custom_params": {"token_ids": ctx["first_ids"]}})
    return finish(gen(url, params, custom_logit_processor=DisallowedTokensLogitsProcessor.to_str()))


def case_abort_mid_stream(url, ctx):
    events = stream(url, "/generate", {"text": PROMPT, "sampling_params": greedy(n=400)}, stop_after=2)
    # The stream was cut: the server must drop that request and serve the next one as before.
    return len(events), finish(gen(url, greedy()))


def case_batch_generate(url, ctx):
    return [finish(o) for o in gen(url, greedy(), text=PROMPTS)]


def case_input_embeds(url, ctx):
    out = post(url, "/generate", {"input_embeds": ctx["embeds"], "sampling_params": greedy()})
    return out["output_ids"] if "output_ids" in out else out["text"]


def case_chat(url, ctx):
    out = post(url, "/v1/chat/completions", {"model": "default", "temperature": 0, "max_tokens": NEW,
                                             "messages": [{"role": "user", "content": "Say hello."}]})  # fmt: skip
    return out["choices"][0]["message"]["content"], out["choices"][0]["finish_reason"]


def case_chat_stream(url, ctx):
    events = stream(url, "/v1/chat/completions", {"model": "default", "temperature": 0, "max_tokens": NEW,
                                                  "messages": [{"role": "user", "content": "Say hello."}]})  # fmt: skip
    return "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))


def case_completions_stream(url, ctx):
    events = stream(url, "/v1/completions", {"model": "default", "temperature": 0, "max_tokens": NEW,
                                             "prompt": PROMPT})  # fmt: skip
    return "".join(c.get("text") or "" for e in events for c in e.get("choices", []))


def case_score(url, ctx):
    out = post(url, "/v1/score", {"query": "Is Paris in France? Answer:", "items": [" yes", " no"],
                                  "label_token_ids": ctx["label_ids"], "apply_softmax": True})  # fmt: skip
    return [[round(v, 3) for v in row] for row in out["scores"]]


@dataclass(frozen=True)
class Feature:
    name: str
    run: Callable
    expected: str  # "same", or "refused: <why>"
    changes_greedy: bool = False  # AR's answer must differ from plain greedy's, or the case tests nothing
    note: str = ""


PENALTY_NOTE = "requests with penalties or min_new_tokens draft nothing (one token a round), which keeps them exactly AR's"

FEATURES = [
    Feature("greedy /generate", case_greedy, "same"),
    Feature("logprobs + top_logprobs", case_logprobs, "same"),
    Feature("n > 1", case_n2, "same"),
    Feature("stop strings (matched_stop)", case_stop_string, "same", changes_greedy=True),
    Feature("stop token ids (matched_stop)", case_stop_token_ids, "same", changes_greedy=True),
    Feature("JSON schema", case_json_schema, "same"),
    Feature("regex", case_regex, "same"),
    Feature("EBNF", case_ebnf, "same"),
    Feature("frequency penalty", note=PENALTY_NOTE, run=case_frequency_penalty, expected="same", changes_greedy=True),
    Feature("presence penalty", note=PENALTY_NOTE, run=case_presence_penalty, expected="same", changes_greedy=True),
    Feature("repetition penalty", note=PENALTY_NOTE, run=case_repetition_penalty, expected="same", changes_greedy=True),
    Feature("min_new_tokens", note=PENALTY_NOTE, run=case_min_new_tokens, expected="same", changes_greedy=True),
    Feature("logit bias", case_logit_bias, "same", changes_greedy=True),
    Feature("custom logit processor", case_custom_logit_processor, "same", changes_greedy=True),
    Feature("abort mid-stream", case_abort_mid_stream, "same"),
    Feature("batch /generate (list of prompts)", case_batch_generate, "same"),
    Feature("input_embeds", case_input_embeds, "same"),
    Feature("OpenAI chat", case_chat, "same"),
    Feature("OpenAI chat streaming", case_chat_stream, "same"),
    Feature("OpenAI completions streaming", case_completions_stream, "same"),
    Feature("/v1/score", case_score, "same"),
]


# Checked on a server of their own (tests/e2e/test_features.py::test_tokenizer_workers_and_skip_tokenizer_init).
OWN_SERVER = ["--skip-tokenizer-init (token ids in and out)", "--tokenizer-worker-num > 1"]


def context(tokenizer, embeddings) -> dict:
    """Inputs some cases need: token ids from the target's tokenizer, embedding rows of a prompt."""
    ids = tokenizer.encode(PROMPT, add_special_tokens=False)
    return {
        "stop_id": tokenizer.encode(",", add_special_tokens=False)[0],
        "first_ids": tokenizer.encode(" a", add_special_tokens=False),  # the greedy answer's first token
        "label_ids": [tokenizer.encode(" yes", add_special_tokens=False)[0], tokenizer.encode(" no", add_special_tokens=False)[0]],
        "embeds": [[round(float(v), 6) for v in embeddings[i]] for i in ids],
    }


def run_case(feature: Feature, url: str, ctx: dict):
    """("ok", value) or ("refused", message)."""
    try:
        return "ok", feature.run(url, ctx)
    except Refused as e:
        return "refused", e.message.splitlines()[0] if e.message else f"HTTP {e.status}"


def feature_table() -> str:
    """The README's markdown table of ``FEATURES`` (supported / refused with reason)."""
    rows = ["| feature | under SSD (each checked against AR in `make test`) |", "|---|---|"]
    for f in FEATURES:
        said = "same as AR" if f.expected == "same" else f.expected
        rows.append(f"| {f.name} | {said}{'; ' + f.note if f.note else ''} |")
    rows += [f"| {name} | same as AR |" for name in OWN_SERVER]
    return "\n".join(rows)
