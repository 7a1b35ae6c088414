"""`python -m sglang_ssd.launch_server <sglang.launch_server args> [--ssd-* flags]`

A thin wrapper around `python -m sglang.launch_server`:
- on a machine without CUDA (or with `--device cpu`) it selects SGLang's CPU engine and adds the flags
  a plain CPU needs (`--attention-backend torch_native --disable-cuda-graph --max-total-tokens 4096
  --dtype float32`) unless they are given, and runs SGLang's processes with `OMP_NUM_THREADS=1`
  unless the environment sets it (the CPU kernels take fp32 on one thread: see `CPU_DEFAULTS`);
- with `--speculative-algorithm SSD` it validates the `--ssd-*` flags before any model loads, starts
  the draft server(s) it needs (or connects to `--ssd-draft-endpoint`s), hands the settings to
  SGLang's processes (env `SGLANG_SSD_CONFIG`), runs SGLang, and stops what it started on exit.
Every other argument goes to SGLang unchanged.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from sglang_ssd.target import defaults
from sglang_ssd.target.ssd_config import ENV_JSON, ConfigError, add_ssd_arguments, config_from_args

CPU_DEFAULTS = (
    ("--attention-backend", "torch_native"),
    ("--max-total-tokens", "4096"),
    # SGLang's `auto` dtype serves an fp32 checkpoint in fp16, and the CPU kernels (linear, attention,
    # rotary; sglang_ssd/cpu) take fp32 only: every call would go to torch.
    ("--dtype", "float32"),
)
# The CPU kernels are single-threaded (with more torch threads each call goes to torch), and SSD gives
# the draft server a core of its own.
CPU_THREADS_ENV = ("OMP_NUM_THREADS", "1")


class LaunchError(RuntimeError):
    """A one-line launch problem (bad path, bad device, bad flag)."""


def _has_flag(args: list[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _cuda_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def _check_model_path(flag: str, path: str | None) -> None:
    if path is None:
        return
    looks_local = path.startswith((".", "/", "~")) or os.sep in path and Path(path).parent.exists()
    p = Path(path).expanduser()
    if looks_local and not (p / "config.json").is_file():
        raise LaunchError(f"{flag} {path!r}: not a model folder (no config.json there)")


def build_sglang_argv(argv: list[str]) -> tuple[list[str], dict[str, str], argparse.Namespace, object]:
    """Split our flags from SGLang's; returns (sglang argv, extra env, parsed ns, SSD config or None)."""
    # No abbreviations: a mistyped `--ssd-mod` must be reported, not taken for `--ssd-mode`.
    # No exit on error: a bad value becomes one LaunchError line, not argparse's usage block.
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False, exit_on_error=False)
    parser.add_argument("--device", default=None)
    parser.add_argument("--model-path", "--model", dest="model_path", default=None)
    parser.add_argument("--speculative-algorithm", default=None)
    parser.add_argument("--speculative-draft-model-path", default=None)
    add_ssd_arguments(parser)
    try:
        ns, rest = parser.parse_known_args(argv)
    except argparse.ArgumentError as e:
        raise LaunchError(str(e)) from None
    except SystemExit as e:
        raise LaunchError("bad --ssd-* argument (see message above)") from e
    unknown = [a.split("=")[0] for a in rest if a.startswith("--ssd-")]
    if unknown:
        raise LaunchError(f"unknown flag {unknown[0]} (see `python -m sglang_ssd.launch_server --help`)")

    _check_model_path("--model-path", ns.model_path)
    env: dict[str, str] = {}
    device = ns.device or ("cuda" if _cuda_available() else "cpu")
    if device.startswith("cuda") and not _cuda_available():
        raise LaunchError(f"--device {device}: no CUDA device is available on this machine (use --device cpu)")
    if device not in ("cpu",) and not device.startswith("cuda"):
        raise LaunchError(f"--device {device!r}: sglang_ssd supports 'cpu' and 'cuda'")
    out = list(rest)
    if ns.model_path:
        out += ["--model-path", ns.model_path]
    out += ["--device", device]
    if device == "cpu":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
        if CPU_THREADS_ENV[0] not in os.environ:
            env[CPU_THREADS_ENV[0]] = CPU_THREADS_ENV[1]
        for flag, value in CPU_DEFAULTS:
            if not _has_flag(out, flag):
                out += [flag, value]
        if not _has_flag(out, "--disable-cuda-graph") and not _has_flag(out, "--cuda-graph-backend-decode"):
            out.append("--disable-cuda-graph")
        if not _has_flag(out, "--sleep-on-idle"):
            out.append("--sleep-on-idle")  # an idle scheduler would otherwise spin a whole core

    config = None
    algo = (ns.speculative_algorithm or "").upper()
    if algo == "SSD":
        _check_model_path("--speculative-draft-model-path", ns.speculative_draft_model_path)
        try:
            config = config_from_args(ns, ns.speculative_draft_model_path)
            config, line = defaults.apply(config, {a.split("=")[0] for a in argv}, ns.speculative_draft_model_path)
        except ConfigError as e:
            raise LaunchError(str(e)) from None
        print(f"sglang_ssd: {line}", file=sys.stderr, flush=True)
        if config.draft_chain and ns.speculative_draft_model_path and (
            os.path.realpath(ns.speculative_draft_model_path) != os.path.realpath(config.draft_chain[1])
        ):
            raise LaunchError("--speculative-draft-model-path and the L1 of --ssd-draft-chain name different models")
        if not config.draft_endpoints and not ns.speculative_draft_model_path and not config.draft_chain:
            raise LaunchError("--speculative-algorithm SSD needs --speculative-draft-model-path, --ssd-draft-chain "
                              "or --ssd-draft-endpoint")  # fmt: skip
        out += ["--speculative-algorithm", "SSD"]
    else:
        # Judged by presence, not by value: `--ssd-k 7` (the default) is still a request for SSD.
        given = [a.split("=")[0] for a in argv if a.startswith("--ssd-")]
        if given:
            raise LaunchError(f"{given[0]} needs --speculative-algorithm SSD")
        if ns.speculative_algorithm:
            out += ["--speculative-algorithm", ns.speculative_algorithm]
        if ns.speculative_draft_model_path:
            out += ["--speculative-draft-model-path", ns.speculative_draft_model_path]
    return out, env, ns, config


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        parser = argparse.ArgumentParser(prog="python -m sglang_ssd.launch_server", add_help=False)
        add_ssd_arguments(parser)
        parser.print_help()
        return 0
    try:
        sglang_argv, env, ns, config = build_sglang_argv(argv)
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    from sglang_ssd.target.draft_fleet import DraftFleet

    fleet = DraftFleet(config) if config is not None else None
    child_env = {**os.environ, **env}
    try:
        if fleet is not None:
            config = fleet.start(child_env)
            child_env[ENV_JSON] = config.to_json()
        proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *sglang_argv], env=child_env)

        def forward(signum, _frame):
            proc.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        return proc.wait()
    except LaunchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if fleet is not None:
            fleet.stop()


if __name__ == "__main__":
    sys.exit(main())
