"""Shared real-server fixtures: each kind of server starts once per test session."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_ssd.prompts import load_prompts
from sglang_ssd.sglang.server_process import CPU_SERVER_ARGS, SGLangServer

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "models" / "target"
NEW_TOKENS = 32


def require_model(path: Path) -> Path:
    if not (path / "config.json").is_file():
        pytest.fail(f"{path} is missing: run `make models` first (make test does it)")
    return path


@pytest.fixture(scope="session")
def target_path() -> Path:
    return require_model(TARGET)


@pytest.fixture(scope="session")
def tokenizer(target_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(target_path))


def chat_ids(tokenizer, prompt: str) -> list[int]:
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True
    )
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


@pytest.fixture(scope="session")
def equality_prompts(tokenizer) -> list[list[int]]:
    """20 prompts, 5 of each kind, as chat-templated token ids."""
    prompts = []
    for kind in ("chat", "math", "code", "feedback"):
        prompts += [chat_ids(tokenizer, p.prompt) for p in load_prompts(kind, limit=5)]
    return prompts


@pytest.fixture(scope="session")
def hf_greedy(target_path, equality_prompts) -> list[list[int]]:
    """Greedy continuations from Hugging Face transformers, fp32 (the reference).

    An explicit argmax loop over the model's logits with its KV cache: `generate()` in
    transformers 5.19 does not return the plain argmax chain for this model (seen on prompt
    chat-003, position 9: logits 18.31 vs 17.89, generate picks the second), so it is not used.
    """
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(str(target_path), dtype=torch.float32).eval()
    outs = []
    with torch.inference_mode():
        for ids in equality_prompts:
            out = model(torch.tensor([ids]), use_cache=True)
            tokens = [int(out.logits[0, -1].argmax())]
            while len(tokens) < NEW_TOKENS:
                out = model(torch.tensor([tokens[-1:]]), past_key_values=out.past_key_values, use_cache=True)
                tokens.append(int(out.logits[0, -1].argmax()))
            outs.append(tokens)
    return outs


def start_server(target_path: Path, *extra: str, log_name: str, **kw) -> SGLangServer:
    argv = ["--model-path", str(target_path), *CPU_SERVER_ARGS, *extra]
    return SGLangServer(argv, log_path=Path("/tmp") / f"sglang_ssd_{log_name}.log", **kw).start()


@pytest.fixture(scope="session")
def ar_server(target_path):
    server = start_server(target_path, log_name="ar")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ngram_server(target_path):
    server = start_server(
        target_path, "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4", log_name="ngram"
    )
    yield server
    server.stop()


def greedy_tokens(server: SGLangServer, ids: list[int], n: int = NEW_TOKENS) -> tuple[list[int], dict]:
    out = server.generate(ids, {"temperature": 0, "max_new_tokens": n, "ignore_eos": True})
    return out["output_ids"], out["meta_info"]


# ---- SSD ----------------------------------------------------------------------------------------
DRAFT = Path(os.environ.get("SSD_TEST_DRAFT", ROOT / "models" / "draft"))  # override: any draft folder
SSD_K = 4
SSD_FLAGS = ("--ssd-k", str(SSD_K), "--ssd-budget", "12", "--ssd-backup", "neural")


@pytest.fixture(scope="session")
def draft_path() -> Path:
    return require_model(DRAFT)


class DraftProcess:
    """A draft server the test owns (so it can kill and restart it under a running SGLang server)."""

    def __init__(self, draft: Path, mode: str = "async", **config_extra):
        import tempfile

        from sglang_ssd.sglang.config import SSDConfig

        self.endpoint = f"ipc://{tempfile.mkdtemp(prefix='ssd-test-')}/draft.sock"
        config = SSDConfig(k=SSD_K, budget=12, backup="neural", mode=mode, draft_model_path=str(draft), **config_extra)
        self.log = f"/tmp/sglang_ssd_test_draft{'_chain' if config_extra.get('draft_chain') else ''}.log"
        from sglang_ssd.sglang.draft_fleet import draft_server_command

        self.command = draft_server_command(config, self.endpoint)
        self.proc = None

    def start(self) -> DraftProcess:
        from sglang_ssd.sglang.draft_fleet import spawn_draft_server

        self.proc = spawn_draft_server(self.command, self.log)
        return self

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        from sglang_ssd.sglang.draft_fleet import stop_process

        if self.proc is not None:
            stop_process(self.proc)


@pytest.fixture(scope="session")
def ssd_draft(draft_path):
    proc = DraftProcess(draft_path).start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def ssd_server(target_path, ssd_draft):
    """SSD (async) with a draft server the tests own, reached through --ssd-draft-endpoint."""
    server = start_server(
        target_path, "--speculative-algorithm", "SSD", "--ssd-draft-endpoint", ssd_draft.endpoint,
        "--ssd-draft-timeout", "3", *SSD_FLAGS, "--enable-metrics", log_name="ssd",
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sd_server(target_path, draft_path):
    """SD baseline: same draft, synchronous mode; the launcher starts and stops its draft server."""
    server = start_server(
        target_path, "--speculative-algorithm", "SSD", "--speculative-draft-model-path", str(draft_path),
        "--ssd-mode", "sync", *SSD_FLAGS, log_name="sd",
    )
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ssd_auto_server(target_path, draft_path):
    """SSD with --ssd-k auto: the worker picks K (0 = plain decoding) per round from live timings."""
    server = start_server(
        target_path, "--speculative-algorithm", "SSD", "--speculative-draft-model-path", str(draft_path),
        "--ssd-k", "auto", "--ssd-budget", "12", "--ssd-backup", "neural", log_name="ssd_auto",
    )
    yield server
    server.stop()


# ---- recursive SSD: L0 (n-gram) → L1 (draft) → target -------------------------------------------------
NGRAM = ROOT / "models" / "ngram.json"


@pytest.fixture(scope="session")
def ssd3_draft(draft_path):
    """A three-level draft server (L0 proposes for L1), with both level temperatures calibrated live."""
    if not NGRAM.is_file():
        pytest.fail(f"{NGRAM} is missing: run `make models` first (make test does it)")
    proc = DraftProcess(draft_path, draft_chain=[str(NGRAM), str(draft_path)],
                        l0_temperature="auto", draft_temperature="auto").start()  # fmt: skip
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def ssd3_server(target_path, ssd3_draft):
    server = start_server(
        target_path, "--speculative-algorithm", "SSD", "--ssd-draft-endpoint", ssd3_draft.endpoint,
        *SSD_FLAGS, log_name="ssd3",
    )  # fmt: skip
    yield server
    server.stop()
