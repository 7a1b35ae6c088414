"""SSD settings: parsed from `--ssd-*` flags by our launcher, handed to SGLang's processes via env.

`SSDConfig` is the draft settings (`sglang_ssd/wire/settings.py`, where each one and its check is
declared once) plus the launch-only fields below; the `--ssd-*` flags of the draft settings are
generated from that declaration.

SGLang plugins cannot add CLI flags, so `python -m sglang_ssd.launch_server` parses the `--ssd-*`
flags, validates them before any model loads, and exports them as JSON in `SGLANG_SSD_CONFIG`
(or a file named by `SGLANG_SSD_CONFIG_FILE`) for the worker inside every SGLang process. The same
variables are how `python -m sglang.launch_server --speculative-algorithm SSD` is configured.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass, field, replace

from sglang_ssd.wire.settings import ConfigError, DraftSettings, add_setting_flags, settings_from_flags

ENV_JSON = "SGLANG_SSD_CONFIG"
ENV_FILE = "SGLANG_SSD_CONFIG_FILE"

__all__ = ["ENV_FILE", "ENV_JSON", "ConfigError", "SSDConfig", "add_ssd_arguments", "config_from_args"]


@dataclass
class SSDConfig(DraftSettings):
    """The draft settings (wire/settings.py) plus what only the launcher and the worker use."""

    draft_device: str = "cpu"
    draft_endpoints: list[str] = field(default_factory=list)  # given ⇒ connect, else start our own
    draft_cores: list[int] = field(default_factory=list)
    draft_timeout_s: float = 5.0
    draft_model_path: str | None = None
    draft_chain: list[str] = field(default_factory=list)  # [L0 n-gram file, L1 draft folder]: recursive SSD
    # auto-K's ΣF per batch-size bucket (rows: 1, 2-3, 4-7, ...) and K (entries K = 1, 2, ...): what each
    # round asks of the draft server. No flag: the launcher fills it from the calibration (target/defaults.py);
    # empty, the draft server keeps its own ΣF.
    tree_budgets: list[list[int]] = field(default_factory=list)

    def validate(self, prefix: str = "--ssd-") -> SSDConfig:
        super().validate(prefix)
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
        if not all(isinstance(row, list) and row and all(isinstance(f, int) and f >= 1 for f in row)
                   for row in self.tree_budgets):
            raise ConfigError(f"tree_budgets must be rows of positive integers, got {self.tree_budgets!r}")
        if self.draft_timeout_s <= 0:
            raise ConfigError(f"--ssd-draft-timeout must be positive, got {self.draft_timeout_s!r}")
        return self

    @classmethod
    def from_env(cls) -> SSDConfig:
        """The process's settings, parsed once per value of the variables (a copy each call)."""
        key = (os.environ.get(ENV_JSON), os.environ.get(ENV_FILE))
        if key not in _FROM_ENV:
            _FROM_ENV[key] = cls._parse_env()
        return replace(_FROM_ENV[key])

    @classmethod
    def _parse_env(cls) -> SSDConfig:
        if os.environ.get(ENV_JSON):
            return cls.from_json(os.environ[ENV_JSON]).validate()
        if os.environ.get(ENV_FILE):
            with open(os.environ[ENV_FILE]) as f:
                return cls.from_mapping(json.load(f)).validate()
        return cls().validate()


_FROM_ENV: dict[tuple[str | None, str | None], SSDConfig] = {}  # SGLang asks in several places per process


def add_ssd_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("SSD (speculative speculative decoding)")
    add_setting_flags(g, "--ssd-", defaults=True)  # --ssd-k, --ssd-budget, ...: one per DraftSettings field
    g.add_argument("--ssd-draft-device", default=SSDConfig.draft_device)
    g.add_argument("--ssd-draft-endpoint", action="append", default=[])
    g.add_argument("--ssd-draft-cores", default="", help="comma-separated CPU cores for the draft server")
    g.add_argument("--ssd-draft-timeout", type=float, default=SSDConfig.draft_timeout_s)
    g.add_argument("--ssd-draft-chain", default="", help="recursive SSD: L0_PATH,L1_PATH (n-gram file, draft folder)")


def config_from_args(ns: argparse.Namespace, draft_model_path: str | None) -> SSDConfig:
    try:
        cores = [int(c) for c in ns.ssd_draft_cores.split(",") if c.strip()]
    except ValueError:
        raise ConfigError(f"--ssd-draft-cores must be comma-separated integers, got {ns.ssd_draft_cores!r}") from None
    return SSDConfig(
        **settings_from_flags(ns, "ssd_"),
        draft_device=ns.ssd_draft_device,
        draft_endpoints=list(ns.ssd_draft_endpoint),
        draft_cores=cores,
        draft_timeout_s=ns.ssd_draft_timeout,
        draft_model_path=draft_model_path,
        draft_chain=[x for x in ns.ssd_draft_chain.split(",") if x] if ns.ssd_draft_chain else [],
    ).validate()
