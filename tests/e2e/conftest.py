"""Shared real-server fixtures: each kind of server starts once per test session, and stops after the
last test that uses it (tests/conftest.py runs the e2e tests grouped by server)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from sglang_ssd.tools.server_process import CPU_SERVER_ARGS, SGLangServer
from tests.e2e.references import NEW_TOKENS, equality_prompt_ids, hf_greedy_reference

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "models" / "target"


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


@pytest.fixture(scope="session")
def equality_prompts(target_path) -> list[list[int]]:
    """20 prompts, 5 of each kind, as chat-templated token ids."""
    return equality_prompt_ids(target_path)


_BACKGROUND: dict = {}


def pytest_collection_finish(session) -> None:
    """Start the transformers reference in its own process if a selected test needs it (it runs
    while the server-free tests keep the other core busy; ``hf_greedy`` collects it)."""
    if session.config.option.collectonly or not any("hf_greedy" in getattr(it, "fixturenames", ()) for it in session.items):
        return
    if not (TARGET / "config.json").is_file():
        return  # the fixture reports the missing model
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    _BACKGROUND["hf_greedy"] = pool.submit(hf_greedy_reference, str(TARGET))
    pool.shutdown(wait=False)


@pytest.fixture(scope="session")
def hf_greedy(target_path) -> list[list[int]]:
    """Greedy continuations from Hugging Face transformers, fp32 (the reference; tests/e2e/references.py)."""
    future = _BACKGROUND.pop("hf_greedy", None)
    return future.result() if future is not None else hf_greedy_reference(str(target_path))


# ---- release after last use ----------------------------------------------------------------------
_STOPS: dict[str, object] = {}  # fixture name -> how to stop what it started
_LAST_USER: dict[str, pytest.Item] = {}


def held(name: str, stop) -> None:
    """A session fixture's resource, stopped after the last test of the run that uses ``name``."""
    _STOPS[name] = stop


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    result = yield
    if not _LAST_USER:  # the final order is known once the run has started
        for it in item.session.items:
            for name in getattr(it, "fixturenames", ()):
                _LAST_USER[name] = it
    for name in [n for n in reversed(_STOPS) if _LAST_USER.get(n) is item]:  # servers before their drafts
        _STOPS.pop(name)()  # the fixture's own teardown stops it again: a no-op
    return result


def start_server(target_path: Path, *extra: str, log_name: str, **kw) -> SGLangServer:
    argv = ["--model-path", str(target_path), *CPU_SERVER_ARGS, *extra]
    return SGLangServer(argv, log_path=Path("/tmp") / f"sglang_ssd_{log_name}.log", **kw).start()


@pytest.fixture(scope="session")
def ar_server(target_path):
    server = start_server(target_path, log_name="ar")
    held("ar_server", server.stop)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ngram_server(target_path):
    server = start_server(
        target_path, "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4", log_name="ngram"
    )
    held("ngram_server", server.stop)
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
    """A draft server the test owns (so it can kill, stop and restart it under a running SGLang server).

    ``config_extra``: SSDConfig fields (k, budget, backup, saguaro_c, q_support, draft_chain, ...);
    ``extra_args``: more draft-server flags; ``script``: a file run instead of `-m sglang_ssd.draft_server`
    with the same flags (the planted-bug server, tests/e2e/planted_draft_server.py)."""

    def __init__(self, draft: Path, mode: str = "async", *, name: str | None = None, extra_args: tuple = (),
                 script: Path | None = None, **config_extra):
        import tempfile

        from sglang_ssd.target.ssd_config import SSDConfig

        self.endpoint = f"ipc://{tempfile.mkdtemp(prefix='ssd-test-')}/draft.sock"
        fields = {"k": SSD_K, "budget": 12, "backup": "neural", **config_extra}
        config = SSDConfig(mode=mode, draft_model_path=str(draft), **fields)
        self.log = f"/tmp/sglang_ssd_test_draft{'_chain' if config_extra.get('draft_chain') else ''}.log"
        if name is not None:
            self.log = f"/tmp/sglang_ssd_test_draft_{name}.log"
        from sglang_ssd.target.draft_fleet import draft_server_command

        self.command = draft_server_command(config, self.endpoint) + list(extra_args)
        if script is not None:
            self.command[1:3] = [str(script)]  # [python, -m, module, flags...] -> [python, script, flags...]
        self.proc = None

    def start(self) -> DraftProcess:
        from sglang_ssd.target.draft_fleet import spawn_draft_server

        self.proc = spawn_draft_server(self.command, self.log)
        return self

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP: alive but silent, the way a stalled (swapping, hung) draft server looks to the link."""
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def stop(self) -> None:
        from sglang_ssd.target.draft_fleet import stop_process

        if self.proc is not None:
            stop_process(self.proc)


@pytest.fixture(scope="session")
def ssd_draft(draft_path):
    proc = DraftProcess(draft_path).start()
    held("ssd_draft", proc.stop)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def ssd_server(target_path, ssd_draft):
    """SSD (async) with a draft server the tests own, reached through --ssd-draft-endpoint."""
    server = start_server(
        target_path, "--speculative-algorithm", "SSD", "--ssd-draft-endpoint", ssd_draft.endpoint,
        "--ssd-draft-timeout", "3", *SSD_FLAGS, "--enable-metrics", log_name="ssd",
    )
    held("ssd_server", server.stop)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def sd_server(target_path, draft_path):
    """SD baseline: same draft, synchronous mode; the launcher starts and stops its draft server."""
    server = start_server(
        target_path, "--speculative-algorithm", "SSD", "--speculative-draft-model-path", str(draft_path),
        "--ssd-mode", "sync", *SSD_FLAGS, log_name="sd",
    )
    held("sd_server", server.stop)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def ssd_auto_server(target_path):
    """SSD with --ssd-k auto: the worker picks K (0 = plain decoding) per round from live timings. The
    target is its own draft (α ≈ 1), so drafting pays and auto-K drafts (the sampling test checks)."""
    server = start_server(
        target_path, "--speculative-algorithm", "SSD", "--speculative-draft-model-path", str(target_path),
        "--ssd-k", "auto", "--ssd-budget", "2", "--ssd-backup", "neural", "--ssd-draft-timeout", "10",
        "--max-running-requests", "128", log_name="ssd_auto",
    )
    held("ssd_auto_server", server.stop)
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
    held("ssd3_draft", proc.stop)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def ssd3_server(target_path, ssd3_draft):
    server = start_server(
        target_path, "--speculative-algorithm", "SSD", "--ssd-draft-endpoint", ssd3_draft.endpoint,
        *SSD_FLAGS, log_name="ssd3",
    )  # fmt: skip
    held("ssd3_server", server.stop)
    yield server
    server.stop()


# ---- the law model as its own draft: α ≈ 1, so rounds reach the bonus after full acceptance -----------
# The sampling-law tests run on a tiny random target (tests/e2e/law_model.py), thousands of samples a
# minute. One SGLang server, one draft server per draft-side setting; a request reaches the draft server
# its id hashes to (DraftLink.shard), so the tests pick ids to choose the setting.
SELF_K = 2
PLANTED_SCRIPT = ROOT / "tests" / "e2e" / "planted_draft_server.py"
LAW_SERVER_ARGS = ("--skip-tokenizer-init", "--max-running-requests", "128", "--max-total-tokens", "65536",
                   "--ssd-draft-timeout", "10")


@pytest.fixture(scope="session")
def law_path(tmp_path_factory) -> Path:
    from tests.e2e.law_model import build

    return build(tmp_path_factory.mktemp("law_model"))


def self_draft_kinds(law_path: Path) -> dict[str, dict]:
    return {
        "neural": {},
        "fast": {"backup": "fast"},
        "saguaro": {"saguaro_c": 0.3},
        "q64": {"q_support": 64},
        "chain": {"draft_chain": [str(law_path / "ngram.json"), str(law_path)]},  # L0 n-gram → L1 law model
        # A deliberately wrong draft rule: the sampling test must reject its output (its power shown).
        "planted": {"script": PLANTED_SCRIPT},
    }


@pytest.fixture(scope="session")
def self_drafts(law_path) -> dict[str, DraftProcess]:
    procs = {name: DraftProcess(law_path, name=f"self_{name}", k=SELF_K, budget=2, **kw).start()
             for name, kw in self_draft_kinds(law_path).items()}  # fmt: skip
    held("self_drafts", lambda: [proc.stop() for proc in procs.values()])
    yield procs
    for proc in procs.values():
        proc.stop()


@pytest.fixture(scope="session")
def self_server(law_path, self_drafts):
    endpoints = [a for proc in self_drafts.values() for a in ("--ssd-draft-endpoint", proc.endpoint)]
    server = start_server(
        law_path, "--speculative-algorithm", "SSD", *endpoints, "--ssd-k", str(SELF_K), *LAW_SERVER_ARGS,
        log_name="ssd_self",
    )  # fmt: skip
    held("self_server", server.stop)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def law_auto_server(law_path):
    """`--ssd-k auto` on the law model, its own draft (the launcher starts the draft server)."""
    server = start_server(
        law_path, "--speculative-algorithm", "SSD", "--speculative-draft-model-path", str(law_path),
        "--ssd-k", "auto", "--ssd-budget", "2", "--ssd-backup", "neural", *LAW_SERVER_ARGS, log_name="law_auto",
    )  # fmt: skip
    held("law_auto_server", server.stop)
    yield server
    server.stop()


def rids_for(drafts: dict, name: str, count: int, tag: str) -> list[str]:
    """``count`` request ids that DraftLink.shard sends to draft server ``name`` (crc32 of the id
    modulo the number of endpoints, in the order they were given)."""
    import zlib

    index, out, i = list(drafts).index(name), [], 0
    while len(out) < count:
        rid = f"{tag}-{i}"
        if zlib.crc32(rid.encode()) % len(drafts) == index:
            out.append(rid)
        i += 1
    return out


@pytest.fixture(scope="session")
def law_model(law_path):
    """The law model in transformers (fp32): the reference for the sampling and fault tests."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(str(law_path), dtype=torch.float32).eval()


@pytest.fixture(scope="session")
def target_law(law_model):
    """The law model's exact next-token law at temperature T after a token context."""
    import numpy as np
    import torch

    cache: dict = {}

    def law(ids: tuple[int, ...], temperature: float) -> np.ndarray:
        key = (tuple(ids), temperature)
        if key not in cache:
            with torch.inference_mode():
                logits = law_model(torch.tensor([list(ids)])).logits[0, -1].double()
            cache[key] = torch.softmax(logits / temperature, -1).numpy()
        return cache[key]

    return law


# Power of each e2e sampling test, printed at the end of the run (tests/e2e/test_ssd_sampling.py).
POWER_REPORTS: list[str] = []


def pytest_terminal_summary(terminalreporter):
    if POWER_REPORTS:
        terminalreporter.section("e2e sampling tests: power")
        for line in POWER_REPORTS:
            terminalreporter.write_line(line)


# ---- the feature matrix (tests/e2e/test_features.py): AR and SSD with the same opt-in features --------
FEATURE_ARGS = ("--enable-custom-logit-processor", "--disable-radix-cache")  # the latter: input_embeds


def held_server(name: str, target_path: Path, *extra: str, log_name: str):
    """A session server fixture's body: start, stop after the run's last user of ``name``, stop at exit."""
    server = start_server(target_path, *extra, log_name=log_name)
    held(name, server.stop)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def feature_ar_server(target_path):
    yield from held_server("feature_ar_server", target_path, *FEATURE_ARGS, log_name="feature_ar")


@pytest.fixture(scope="session")
def feature_ssd_server(target_path, draft_path):
    yield from held_server("feature_ssd_server", target_path, *FEATURE_ARGS, "--speculative-algorithm", "SSD",
                           "--speculative-draft-model-path", str(draft_path), *SSD_FLAGS, log_name="feature_ssd")


@pytest.fixture(scope="session")
def workers_server(target_path, draft_path):
    """SSD behind four tokenizer worker processes, token ids in and out (the launch that once exited with
    'Unknown speculative algorithm name: SSD': the workers never loaded the plugin)."""
    yield from held_server("workers_server", target_path, "--skip-tokenizer-init", "--incremental-streaming-output",
                           "--tokenizer-worker-num", "4", "--speculative-algorithm", "SSD",
                           "--speculative-draft-model-path", str(draft_path), *SSD_FLAGS, log_name="workers")


@pytest.fixture(scope="session")
def feature_context(tokenizer, target_path):
    """Inputs the feature cases need (tests/e2e/features.py ``context``), the target's embedding rows too."""
    from safetensors import safe_open

    from tests.e2e.features import context

    for path in sorted(target_path.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            key = next((k for k in f.keys() if k.endswith("embed_tokens.weight")), None)
            if key is not None:
                return context(tokenizer, f.get_tensor(key))
    pytest.fail(f"no embedding table in {target_path}")
