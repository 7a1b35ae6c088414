"""Shared real-server fixtures: each kind of server starts once per test session, and stops after the
last test that uses it (tests/conftest.py runs the e2e tests grouped by server)."""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import Future
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
    while the server-free tests keep the other core busy; ``hf_greedy`` collects it), then the first
    e2e servers (SERVERS_AHEAD) once it is done."""
    if session.config.option.collectonly or not (TARGET / "config.json").is_file():
        return  # the fixtures report a missing model
    used = {name for it in session.items for name in getattr(it, "fixturenames", ())}
    if "hf_greedy" in used:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        _BACKGROUND["hf_greedy"] = pool.submit(hf_greedy_reference, str(TARGET))
        pool.shutdown(wait=False)
    needs = {name: DRAFT / "config.json" for name in ("sd_server", "ssd_draft", "ssd_server", "ssd3_server")}
    needs["ssd3_draft"] = NGRAM
    ahead = [n for n in SERVERS_AHEAD if n in used and needs.get(n, TARGET).exists()]
    if ahead:
        EARLY.start_ahead(ahead, after=_BACKGROUND.get("hf_greedy"))


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
    server = SGLangServer(argv, log_path=Path("/tmp") / f"sglang_ssd_{log_name}.log", **kw)
    _RESOURCES.append(server)  # stopped at the end of the session whatever happens
    return server.start()


def _session_resource(name: str):
    """Body of a session fixture whose resource ``MAKERS[name]`` makes (or made ahead, see Early)."""
    resource = EARLY.get(name)
    proc = resource.proc
    if proc is not None and proc.poll() is not None:  # started ahead, died while it waited
        log = getattr(resource, "log_path", None) or getattr(resource, "log", "")
        pytest.fail(f"{name} exited with code {proc.returncode} before its first test; log: {log}")
    held(name, resource.stop)
    yield resource
    resource.stop()


@pytest.fixture(scope="session")
def ar_server(target_path):
    yield from _session_resource("ar_server")


@pytest.fixture(scope="session")
def ngram_server(target_path):
    yield from _session_resource("ngram_server")


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

        from sglang_ssd.target.config import SSDConfig

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

        _RESOURCES.append(self)  # stopped at the end of the session whatever happens
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
    yield from _session_resource("ssd_draft")


@pytest.fixture(scope="session")
def ssd_server(target_path, ssd_draft):
    """SSD (async) with a draft server the tests own, reached through --ssd-draft-endpoint."""
    yield from _session_resource("ssd_server")


@pytest.fixture(scope="session")
def sd_server(target_path, draft_path):
    """SD baseline: same draft, synchronous mode; the launcher starts and stops its draft server."""
    yield from _session_resource("sd_server")


@pytest.fixture(scope="session")
def ssd_auto_server(target_path):
    """SSD with --ssd-k auto: the worker picks K (0 = plain decoding) per round from live timings. The
    target is its own draft (α ≈ 1), so drafting pays and auto-K drafts (the sampling test checks)."""
    yield from _session_resource("ssd_auto_server")


# ---- recursive SSD: L0 (n-gram) → L1 (draft) → target -------------------------------------------------
NGRAM = ROOT / "models" / "ngram.json"


@pytest.fixture(scope="session")
def ssd3_draft(draft_path):
    """A three-level draft server (L0 proposes for L1), with both level temperatures calibrated live."""
    if not NGRAM.is_file():
        pytest.fail(f"{NGRAM} is missing: run `make models` first (make test does it)")
    yield from _session_resource("ssd3_draft")


@pytest.fixture(scope="session")
def ssd3_server(target_path, ssd3_draft):
    yield from _session_resource("ssd3_server")


# ---- servers started ahead ------------------------------------------------------------------------
# While the server-free tests run (one core), the other core is idle once the transformers reference
# is done: the servers of the first e2e tests start there. A fixture takes its server from EARLY,
# waiting for a start in progress or starting it itself; each resource is made once.
def _make_ssd_draft():
    return DraftProcess(DRAFT).start()


def _make_ssd3_draft():
    return DraftProcess(DRAFT, draft_chain=[str(NGRAM), str(DRAFT)], l0_temperature="auto",
                        draft_temperature="auto").start()  # fmt: skip


MAKERS = {
    "ar_server": lambda: start_server(TARGET, log_name="ar"),
    "ngram_server": lambda: start_server(
        TARGET, "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4", log_name="ngram"),
    "sd_server": lambda: start_server(
        TARGET, "--speculative-algorithm", "SSD", "--speculative-draft-model-path", str(DRAFT),
        "--ssd-mode", "sync", *SSD_FLAGS, log_name="sd"),
    "ssd_draft": _make_ssd_draft,
    "ssd_server": lambda: start_server(
        TARGET, "--speculative-algorithm", "SSD", "--ssd-draft-endpoint", EARLY.get("ssd_draft").endpoint,
        "--ssd-draft-timeout", "3", *SSD_FLAGS, "--enable-metrics", log_name="ssd"),
    "ssd_auto_server": lambda: start_server(
        TARGET, "--speculative-algorithm", "SSD", "--speculative-draft-model-path", str(TARGET),
        "--ssd-k", "auto", "--ssd-budget", "2", "--ssd-backup", "neural", "--ssd-draft-timeout", "10",
        "--max-running-requests", "128", log_name="ssd_auto"),
    "ssd3_draft": _make_ssd3_draft,
    "ssd3_server": lambda: start_server(
        TARGET, "--speculative-algorithm", "SSD", "--ssd-draft-endpoint", EARLY.get("ssd3_draft").endpoint,
        *SSD_FLAGS, log_name="ssd3"),
}  # fmt: skip
# Started ahead, in the order the e2e tests first use them (tests/conftest.py), if a selected test
# does. At most five SGLang servers (~2.5 GB each) and three draft servers: within 24 GiB.
SERVERS_AHEAD = ("ar_server", "ngram_server", "sd_server", "ssd_draft", "ssd_server", "ssd3_draft", "ssd3_server")
_RESOURCES: list = []  # everything started (SGLangServer, DraftProcess): all stopped at session end


class Early:
    def __init__(self):
        self._made: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def get(self, name: str):
        """The resource ``MAKERS[name]`` makes: made here unless it is made or being made."""
        with self._lock:
            future, mine = self._made.get(name), name not in self._made
            if mine:
                future = self._made[name] = Future()
        if mine:
            try:
                future.set_result(MAKERS[name]())
            except BaseException as exc:  # the fixture that asks re-raises it
                future.set_exception(exc)
        return future.result()

    def start_ahead(self, names: list[str], after: Future | None) -> None:
        def run():
            if after is not None:
                after.exception()  # wait for the reference's process to free its core
            for name in names:
                if self._stop.is_set():
                    return
                try:
                    self.get(name)
                except BaseException:  # noqa: S110 - stored in the future; its fixture reports it
                    pass

        self._thread = threading.Thread(target=run, name="servers-ahead", daemon=True)
        self._thread.start()

    def close(self, wait: bool = True) -> None:
        """No more starts ahead; ``wait``: until one in progress is done."""
        self._stop.set()
        if wait and self._thread is not None:
            self._thread.join(600)


EARLY = Early()


def pytest_runtest_setup(item) -> None:
    # The e2e tests keep both cores busy: from their first test on, servers start only when needed.
    if "e2e" in item.nodeid.split("::")[0].split("/"):
        EARLY.close(wait=False)


def pytest_sessionfinish(session) -> None:
    EARLY.close()
    for resource in reversed(_RESOURCES):  # servers before the draft servers they use
        try:
            resource.stop()
        except Exception as exc:  # keep stopping the others
            print(f"stopping {resource!r}: {exc}")


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
