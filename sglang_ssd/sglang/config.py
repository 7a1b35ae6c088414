"""SSD settings: parsed from `--ssd-*` flags by our launcher, handed to SGLang's processes via env.

SGLang plugins cannot add CLI flags, so `python -m sglang_ssd.launch_server` parses the `--ssd-*`
flags, validates them before any model loads, and exports them as JSON in `SGLANG_SSD_CONFIG`
(or a file named by `SGLANG_SSD_CONFIG_FILE`) for the worker inside every SGLang process. The same
variables are how `python -m sglang.launch_server --speculative-algorithm SSD` is configured.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass, field, fields

ENV_JSON = "SGLANG_SSD_CONFIG"
ENV_FILE = "SGLANG_SSD_CONFIG_FILE"


class ConfigError(ValueError):
    """A bad `--ssd-*` value; the message is one line naming the flag."""


@dataclass
class SSDConfig:
    k: int | str = 7  # draft tokens per round, or "auto"
    fanout: str = "geometric"
    budget: int = 24
    saguaro_c: float = 1.0
    backup: str = "auto"
    mode: str = "async"  # async = SSD, sync = SD baseline from the same draft server
    draft_device: str = "cpu"
    draft_endpoints: list[str] = field(default_factory=list)  # given ⇒ connect, else start our own
    draft_cores: list[int] = field(default_factory=list)
    draft_timeout_s: float = 5.0
    draft_model_path: str | None = None
    draft_chain: list[str] = field(default_factory=list)  # [L0 n-gram file, L1 draft folder]: recursive SSD
    l0_tokens: int = 3
    l0_temperature: float | str = "auto"
    draft_temperature: float | str | None = None  # τ₁ as a multiple of T, or "auto"
    q_support: int = 0  # > 0: the draft samples from its top-S tokens, q′ travels sparse (exact)

    def validate(self) -> SSDConfig:
        if self.k != "auto" and (not isinstance(self.k, int) or not 0 <= self.k <= 32):
            raise ConfigError(f"--ssd-k must be an integer in 0..32 or 'auto', got {self.k!r}")
        if self.fanout not in ("geometric", "uniform"):
            raise ConfigError(f"--ssd-fanout must be 'geometric' or 'uniform', got {self.fanout!r}")
        if not isinstance(self.budget, int) or self.budget < 1:
            raise ConfigError(f"--ssd-budget must be a positive integer, got {self.budget!r}")
        if not 0.0 <= float(self.saguaro_c) <= 1.0:
            raise ConfigError(f"--ssd-saguaro-c must be in [0, 1], got {self.saguaro_c!r}")
        if self.backup not in ("auto", "neural", "fast"):
            raise ConfigError(f"--ssd-backup must be 'auto', 'neural' or 'fast', got {self.backup!r}")
        if self.mode not in ("async", "sync"):
            raise ConfigError(f"--ssd-mode must be 'async' or 'sync', got {self.mode!r}")
        dev = self.draft_device
        if not (dev == "cpu" or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise ConfigError(f"--ssd-draft-device must be 'cpu' or 'cuda:N', got {dev!r}")
        for ep in self.draft_endpoints:
            if not ep.startswith(("tcp://", "ipc://")):
                raise ConfigError(f"--ssd-draft-endpoint must start with tcp:// or ipc://, got {ep!r}")
        if self.draft_chain:
            if len(self.draft_chain) != 2:
                raise ConfigError(f"--ssd-draft-chain must be L0_PATH,L1_PATH (two entries), got {','.join(self.draft_chain)!r}")
            if not os.path.isfile(self.draft_chain[0]):
                raise ConfigError(f"--ssd-draft-chain: L0 {self.draft_chain[0]!r} is not a file (an n-gram table, "
                                  "e.g. models/ngram.json)")  # fmt: skip
            if not os.path.isfile(os.path.join(self.draft_chain[1], "config.json")):
                raise ConfigError(f"--ssd-draft-chain: L1 {self.draft_chain[1]!r} is not a model folder (no config.json)")
        if not isinstance(self.q_support, int) or self.q_support < 0:
            raise ConfigError(f"--ssd-q-support must be an integer ≥ 0 (0 = dense q′), got {self.q_support!r}")
        if not isinstance(self.l0_tokens, int) or not 1 <= self.l0_tokens <= 16:
            raise ConfigError(f"--ssd-l0-tokens must be an integer in 1..16, got {self.l0_tokens!r}")
        for flag, v, lo in (("--ssd-l0-temperature", self.l0_temperature, 0.0),
                            ("--ssd-draft-temperature", self.draft_temperature, None)):
            if v is None or v == "auto":
                continue
            if not isinstance(v, int | float) or (v < 0 if lo == 0.0 else v <= 0):
                raise ConfigError(f"{flag} must be {'≥ 0' if lo == 0.0 else '> 0'} or 'auto', got {v!r}")
        if self.draft_timeout_s <= 0:
            raise ConfigError(f"--ssd-draft-timeout must be positive, got {self.draft_timeout_s!r}")
        return self

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_mapping(cls, data: dict) -> SSDConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown SSD setting {unknown[0]!r} (known: {', '.join(sorted(known))})")
        return cls(**data).validate()

    @classmethod
    def from_env(cls) -> SSDConfig:
        if os.environ.get(ENV_JSON):
            return cls.from_mapping(json.loads(os.environ[ENV_JSON]))
        if os.environ.get(ENV_FILE):
            with open(os.environ[ENV_FILE]) as f:
                return cls.from_mapping(json.load(f))
        return cls().validate()


def _k_value(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        # argparse shows an ArgumentTypeError's own text ("argument --ssd-k: ..."); a plain
        # ValueError would become "invalid _k_value value".
        raise argparse.ArgumentTypeError(f"must be an integer or 'auto', got {text!r}") from None


def _auto_or_float(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number or 'auto', got {text!r}") from None


def add_ssd_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("SSD (speculative speculative decoding)")
    g.add_argument("--ssd-k", type=_k_value, default=SSDConfig.k)
    g.add_argument("--ssd-fanout", default=SSDConfig.fanout)
    g.add_argument("--ssd-budget", type=int, default=SSDConfig.budget)
    g.add_argument("--ssd-saguaro-c", type=float, default=SSDConfig.saguaro_c)
    g.add_argument("--ssd-backup", default=SSDConfig.backup)
    g.add_argument("--ssd-mode", default=SSDConfig.mode)
    g.add_argument("--ssd-draft-device", default=SSDConfig.draft_device)
    g.add_argument("--ssd-draft-endpoint", action="append", default=[])
    g.add_argument("--ssd-draft-cores", default="", help="comma-separated CPU cores for the draft server")
    g.add_argument("--ssd-draft-timeout", type=float, default=SSDConfig.draft_timeout_s)
    g.add_argument("--ssd-q-support", type=int, default=0, help="draft samples from its top-S tokens (0 = full)")
    g.add_argument("--ssd-draft-chain", default="", help="recursive SSD: L0_PATH,L1_PATH (n-gram file, draft folder)")
    g.add_argument("--ssd-l0-tokens", type=int, default=SSDConfig.l0_tokens, help="L0 proposals per L1 forward")
    g.add_argument("--ssd-l0-temperature", type=_auto_or_float, default=SSDConfig.l0_temperature)
    g.add_argument("--ssd-draft-temperature", type=_auto_or_float, default=None,
                   help="draft temperature as a multiple of the request's (e.g. 0.75), or auto")


def config_from_args(ns: argparse.Namespace, draft_model_path: str | None) -> SSDConfig:
    try:
        cores = [int(c) for c in ns.ssd_draft_cores.split(",") if c.strip()]
    except ValueError:
        raise ConfigError(f"--ssd-draft-cores must be comma-separated integers, got {ns.ssd_draft_cores!r}") from None
    return SSDConfig(
        k=ns.ssd_k,
        fanout=ns.ssd_fanout,
        budget=ns.ssd_budget,
        saguaro_c=ns.ssd_saguaro_c,
        backup=ns.ssd_backup,
        mode=ns.ssd_mode,
        draft_device=ns.ssd_draft_device,
        draft_endpoints=list(ns.ssd_draft_endpoint),
        draft_cores=cores,
        draft_timeout_s=ns.ssd_draft_timeout,
        draft_model_path=draft_model_path,
        draft_chain=[x for x in ns.ssd_draft_chain.split(",") if x] if ns.ssd_draft_chain else [],
        l0_tokens=ns.ssd_l0_tokens,
        l0_temperature=ns.ssd_l0_temperature,
        draft_temperature=ns.ssd_draft_temperature,
        q_support=ns.ssd_q_support,
    ).validate()
