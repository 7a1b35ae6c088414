"""`python -m sglang_ssd.launch_server`: CPU defaults and `--ssd-*` validation, before any model loads."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sglang_ssd.launch_server import LaunchError, build_sglang_argv
from sglang_ssd.wire.settings import DraftSettings

ROOT = Path(__file__).resolve().parents[2]
TARGET = str(ROOT / "models" / "target")
NO_CUDA = not torch.cuda.is_available()


@pytest.fixture(scope="module", autouse=True)
def target_model():
    if not (Path(TARGET) / "config.json").is_file():
        pytest.fail(f"{TARGET} is missing: run `make models` first")


def flag_value(argv: list[str], flag: str) -> list[str]:
    """Every value given for `flag` (`--flag v` or `--flag=v`)."""
    values = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]
    return values + [a.split("=", 1)[1] for a in argv if a.startswith(flag + "=")]


def sent_settings(command: list[str]) -> DraftSettings:
    """The draft settings a draft-server command line carries (its one `--settings` JSON argument)."""
    (text,) = flag_value(command, "--settings")
    return DraftSettings.from_json(text).validate()


def launch_error(argv: list[str]) -> str:
    with pytest.raises(LaunchError) as info:
        build_sglang_argv(argv)
    message = str(info.value)
    assert "\n" not in message, message
    return message


def ssd(*extra: str) -> list[str]:
    return ["--model-path", TARGET, "--device", "cpu", "--speculative-algorithm", "SSD",
            "--speculative-draft-model-path", TARGET, *extra]  # fmt: skip


# ---------------------------------------------------------------- CPU defaults


def test_cpu_gets_the_torch_native_defaults(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    out, env, ns, config = build_sglang_argv(["--model-path", TARGET, "--device", "cpu"])
    assert flag_value(out, "--device") == ["cpu"]
    assert flag_value(out, "--attention-backend") == ["torch_native"]
    assert flag_value(out, "--max-total-tokens") == ["4096"]
    # SGLang's `auto` would serve the fp32 checkpoint in fp16, which the CPU kernels do not take
    assert flag_value(out, "--dtype") == ["float32"]
    assert out.count("--disable-cuda-graph") == 1
    assert flag_value(out, "--model-path") == [TARGET]
    assert env == {"SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
    assert config is None and "--speculative-algorithm" not in out


def test_cpu_keeps_the_users_thread_count(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    _, env, _, _ = build_sglang_argv(["--model-path", TARGET, "--device", "cpu"])
    assert "OMP_NUM_THREADS" not in env  # the child inherits the user's 4


def test_gpu_gets_no_cpu_defaults(monkeypatch):
    monkeypatch.setattr("sglang_ssd.launch_server._cuda_available", lambda: True)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    out, env, _, _ = build_sglang_argv(["--model-path", TARGET, "--device", "cuda"])
    assert flag_value(out, "--dtype") == [] and "OMP_NUM_THREADS" not in env


@pytest.mark.skipif(not NO_CUDA, reason="the default device is cuda where CUDA exists")
def test_cpu_is_the_default_device_without_cuda():
    out, env, _, _ = build_sglang_argv(["--model-path", TARGET])
    assert flag_value(out, "--device") == ["cpu"]
    assert flag_value(out, "--attention-backend") == ["torch_native"]
    assert env["SGLANG_USE_CPU_ENGINE"] == "1"


@pytest.mark.parametrize(
    "given, flag, value",
    [
        (["--max-total-tokens", "1000"], "--max-total-tokens", "1000"),
        (["--max-total-tokens=2048"], "--max-total-tokens", "2048"),
        (["--attention-backend", "intel_amx"], "--attention-backend", "intel_amx"),
        (["--dtype", "bfloat16"], "--dtype", "bfloat16"),
        (["--dtype=float16"], "--dtype", "float16"),
    ],
)
def test_user_given_values_are_kept(given, flag, value):
    out, _, _, _ = build_sglang_argv(["--model-path", TARGET, "--device", "cpu", *given])
    assert flag_value(out, flag) == [value]


def test_other_sglang_flags_pass_through_unchanged():
    sglang_flags = ["--port", "31000", "--disable-radix-cache", "--dtype", "float32"]
    out, _, _, _ = build_sglang_argv(["--model-path", TARGET, "--device", "cpu", *sglang_flags])
    assert out[: len(sglang_flags)] == sglang_flags


# ---------------------------------------------------------------- model path and device


def test_missing_local_model_path_names_the_flag(tmp_path):
    missing = str(tmp_path / "no-such-model")
    message = launch_error(["--model-path", missing, "--device", "cpu"])
    assert "--model-path" in message and missing in message


def test_folder_without_config_is_not_a_model(tmp_path):
    assert "--model-path" in launch_error(["--model-path", str(tmp_path), "--device", "cpu"])


def test_missing_draft_model_path_names_its_flag(tmp_path):
    missing = str(tmp_path / "no-draft")
    message = launch_error(ssd()[:-1] + [missing])
    assert "--speculative-draft-model-path" in message and missing in message


@pytest.mark.skipif(not NO_CUDA, reason="this machine has CUDA")
def test_cuda_device_without_cuda_names_the_device():
    assert "--device cuda" in launch_error(["--model-path", TARGET, "--device", "cuda"])
    assert "cuda:1" in launch_error(["--model-path", TARGET, "--device", "cuda:1"])


def test_unsupported_device_names_it():
    assert "tpu" in launch_error(["--model-path", TARGET, "--device", "tpu"])


# ---------------------------------------------------------------- --ssd-* flags


def test_good_ssd_flags_build_the_config():
    out, _, _, config = build_sglang_argv(
        ssd(
            "--ssd-k",
            "3",
            "--ssd-fanout",
            "uniform",
            "--ssd-budget",
            "8",
            "--ssd-saguaro-c",
            "0.5",
            "--ssd-backup",
            "fast",
            "--ssd-mode",
            "sync",
            "--ssd-draft-cores",
            "0,1",
        )  # fmt: skip
    )
    assert flag_value(out, "--speculative-algorithm") == ["SSD"]
    assert (config.k, config.fanout, config.budget, config.saguaro_c) == (3, "uniform", 8, 0.5)
    assert (config.backup, config.mode, config.draft_cores, config.draft_model_path) == (
        "fast",
        "sync",
        [0, 1],
        TARGET,
    )
    assert not any(a.startswith("--ssd-") for a in out), out  # SGLang never sees our flags


def test_ssd_k_auto_is_accepted():
    assert build_sglang_argv(ssd("--ssd-k", "auto"))[3].k == "auto"


def test_ssd_with_endpoint_needs_no_draft_path():
    argv = ["--model-path", TARGET, "--device", "cpu", "--speculative-algorithm", "SSD",
            "--ssd-draft-endpoint", "tcp://127.0.0.1:5599"]  # fmt: skip
    config = build_sglang_argv(argv)[3]
    assert config.draft_endpoints == ["tcp://127.0.0.1:5599"] and config.draft_model_path is None


@pytest.mark.parametrize("spelling", [["--ssd-foo", "1"], ["--ssd-foo=1"], ["--ssd-foo"]])
def test_unknown_ssd_flag_is_named(spelling):
    assert "--ssd-foo" in launch_error(ssd(*spelling))


@pytest.mark.parametrize("prefix", ["--ssd-mod", "--ssd-draft"])
def test_abbreviated_ssd_flags_are_unknown_not_guessed(prefix):
    assert prefix in launch_error(ssd(prefix, "sync"))


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--ssd-k", "-1"),
        ("--ssd-k", "33"),
        ("--ssd-k", "x"),
        ("--ssd-fanout", "tree"),
        ("--ssd-budget", "0"),
        ("--ssd-budget", "x"),
        ("--ssd-saguaro-c", "1.5"),
        ("--ssd-saguaro-c", "-0.1"),
        ("--ssd-backup", "slow"),
        ("--ssd-mode", "fast"),
        ("--ssd-draft-device", "tpu"),
        ("--ssd-draft-device", "cuda"),
        ("--ssd-draft-endpoint", "http://x"),
        ("--ssd-draft-cores", "0,a"),
        ("--ssd-draft-timeout", "0"),
    ],
)
def test_bad_ssd_value_is_a_one_line_error_naming_the_flag(flag, value, capsys):
    message = launch_error(ssd(flag, value))
    assert flag in message
    assert capsys.readouterr().err == ""  # nothing else (no argparse usage block) is printed


def test_missing_ssd_value_names_the_flag():
    assert "--ssd-budget" in launch_error(ssd("--ssd-budget"))


@pytest.mark.parametrize(
    "extra",
    [
        ["--ssd-k", "3"],
        ["--ssd-k", "7"],  # the default value still means the user asked for SSD settings
        ["--ssd-draft-endpoint", "tcp://127.0.0.1:5599"],
        ["--speculative-algorithm", "NGRAM", "--ssd-mode", "sync"],
    ],
)
def test_ssd_flags_without_the_ssd_algorithm_are_an_error(extra):
    message = launch_error(["--model-path", TARGET, "--device", "cpu", *extra])
    assert "--speculative-algorithm SSD" in message and extra[-2] in message


def test_ssd_without_draft_model_or_endpoint_is_an_error():
    message = launch_error(["--model-path", TARGET, "--device", "cpu", "--speculative-algorithm", "SSD"])
    assert "--speculative-draft-model-path" in message and "--ssd-draft-endpoint" in message


def test_other_speculative_algorithms_pass_through():
    out, _, _, config = build_sglang_argv(
        ["--model-path", TARGET, "--device", "cpu", "--speculative-algorithm", "NGRAM"]
    )
    assert config is None and flag_value(out, "--speculative-algorithm") == ["NGRAM"]


# ---------------------------------------------------------------- the command line


def test_command_line_rejects_a_missing_model_in_one_line_without_loading_anything():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "sglang_ssd.launch_server", "--model-path", "/nonexistent", "--device", "cpu"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "/nonexistent" in lines[0], proc.stderr
    assert proc.stdout == ""
    assert elapsed < 20, f"took {elapsed:.1f} s: something heavy ran before the argument checks"


# ---------------------------------------------------------------- recursive chain (--ssd-draft-chain)
NGRAM = str(ROOT / "models" / "ngram.json")
DRAFT = str(ROOT / "models" / "draft")


def test_draft_chain_builds_a_recursive_draft_server_command():
    from sglang_ssd.target.draft_fleet import draft_server_command

    argv = ["--model-path", TARGET, "--device", "cpu", "--speculative-algorithm", "SSD",
            "--ssd-draft-chain", f"{NGRAM},{DRAFT}", "--ssd-l0-tokens", "2", "--ssd-draft-temperature", "auto"]  # fmt: skip
    _, _, _, config = build_sglang_argv(argv)
    assert config.draft_chain == [NGRAM, DRAFT] and config.l0_tokens == 2 and config.draft_temperature == "auto"
    cmd = draft_server_command(config, "ipc:///tmp/x.sock")
    assert flag_value(cmd, "--model") == [DRAFT] and flag_value(cmd, "--l0") == [NGRAM]
    sent = sent_settings(cmd)
    assert (sent.l0_tokens, sent.l0_temperature, sent.draft_temperature) == (2, "auto", "auto")


@pytest.mark.parametrize(
    "chain,needle",
    [(f"{NGRAM}", "two entries"), ("/nope.json,{DRAFT}", "is not a file"), (f"{NGRAM},/nope", "not a model folder")],
)
def test_bad_draft_chain_is_one_line_naming_the_flag(chain, needle):
    msg = launch_error(ssd("--ssd-draft-chain", chain.replace("{DRAFT}", DRAFT)))
    assert "--ssd-draft-chain" in msg and needle in msg


def test_draft_chain_must_agree_with_the_draft_model_path():
    msg = launch_error(ssd("--ssd-draft-chain", f"{NGRAM},{DRAFT}"))  # ssd() names the target as draft
    assert "different models" in msg


@pytest.mark.parametrize("flag,value", [("--ssd-l0-tokens", "0"), ("--ssd-l0-temperature", "-1"),
                                        ("--ssd-draft-temperature", "0"), ("--ssd-draft-temperature", "warm")])  # fmt: skip
def test_bad_level_settings_are_one_line_errors(flag, value):
    assert flag in launch_error(ssd(flag, value))


def test_q_support_reaches_the_draft_server_and_is_validated():
    from sglang_ssd.target.draft_fleet import draft_server_command

    _, _, _, config = build_sglang_argv(ssd("--ssd-q-support", "64"))
    assert sent_settings(draft_server_command(config, "ipc:///tmp/x.sock")).q_support == 64
    assert "--ssd-q-support" in launch_error(ssd("--ssd-q-support", "-1"))
