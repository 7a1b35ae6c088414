"""The draft settings: declared once here, read by both processes.

`DraftSettings` is every knob the target side decides and the draft server obeys. The target's
`SSDConfig` (target/ssd_config.py) extends it with launch-only fields, the draft engine's `EngineConfig`
(draft/engine_config.py) extends it with server-only limits, and the launcher hands it to the draft server as
one JSON argument (`--settings '<json>'`). Each field's metadata names its flag parser and help text,
so the `--ssd-<name>` flags of the launcher and the `--<name>` flags of `python -m sglang_ssd.draft_server`
are both generated from the same field. Adding a setting: one field here, one check in `validate()`,
then its use.

This module imports nothing heavy: the launcher reads it before any model (or torch) loads.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field, fields
from typing import Self

AUTO_K_MAX = 7  # with k = "auto": K's ceiling (the target steers the draft server's depth below it)
K_MAX = 32  # the most draft tokens per round


class ConfigError(ValueError):
    """A bad setting; the message is one line naming the flag."""


def _auto_or(convert, what: str):
    """A flag parser: "auto" as it is, else `convert(text)`. It raises argparse's ArgumentTypeError, whose
    text argparse shows as it is ("argument --ssd-k: must be ..."); a plain ValueError would read
    "invalid parse value"."""

    def parse(text: str):
        if text == "auto":
            return text
        try:
            return convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {what} or 'auto', got {text!r}") from None

    return parse


parse_k = _auto_or(int, "an integer")
parse_auto_or_float = _auto_or(float, "a number")


def _flag(parse, help_text: str) -> dict:
    return {"parse": parse, "help": help_text}


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


@dataclass
class DraftSettings:
    # K and ΣF without a calibration file (target/defaults.py picks them from one): the fastest fixed
    # pair measured on this project's CPU at batch 1 (bench/README.md).
    k: int | str = field(default=4, metadata=_flag(parse_k, "draft tokens per round (K), or auto"))
    fanout: str = field(default="geometric", metadata=_flag(str, "fan-out over the K positions: geometric or uniform"))
    budget: int = field(default=24, metadata=_flag(int, "Σ F_k: branches per request per round"))
    saguaro_c: float = field(default=1.0, metadata=_flag(float, "Saguaro C in [0, 1] (1 = off)"))
    # fast: a neural backup drafts K tokens on a miss, and the round after it then forks its budget over
    # K + 1 outcomes instead of the bonus alone. In every sweep point where `auto` turned neural (8 of
    # the 2026-12-06 grids' c = 1-2 points) the hit rate fell to 0.34-0.56 against 0.71-0.83 (bench/NOTEBOOK.md)
    backup: str = field(default="fast", metadata=_flag(str, "backup draft on a miss: fast, neural or auto"))
    mode: str = field(default="async", metadata=_flag(str, "async (SSD) or sync (the SD baseline)"))
    q_support: int = field(default=0, metadata=_flag(int, "draft samples from its top-S tokens, q′ travels "
                                                           "sparse (0 = full vocabulary)"))  # fmt: skip
    l0_tokens: int = field(default=3, metadata=_flag(int, "recursive chain: L0 proposals per L1 forward"))
    l0_temperature: float | str = field(default="auto", metadata=_flag(parse_auto_or_float,
                                        "recursive chain: L0 temperature τ₀ ≥ 0, or auto (measured)"))  # fmt: skip
    draft_temperature: float | str | None = field(default=None, metadata=_flag(parse_auto_or_float,
        "draft temperature τ₁ as a multiple of the request's T (e.g. 0.75), or auto (measured); unset: 1"))  # fmt: skip

    def validate(self, prefix: str = "--") -> Self:
        """Raise a one-line ConfigError naming the flag (`prefix` + the field name with dashes)."""

        def bad(name: str, rule: str, value) -> ConfigError:
            return ConfigError(f"{prefix}{name.replace('_', '-')} must be {rule}, got {value!r}")

        if self.k != "auto" and (not _is_int(self.k) or not 0 <= self.k <= K_MAX):
            raise bad("k", f"an integer in 0..{K_MAX} or 'auto'", self.k)
        if self.fanout not in ("geometric", "uniform"):
            raise bad("fanout", "'geometric' or 'uniform'", self.fanout)
        if not _is_int(self.budget) or self.budget < 1:
            raise bad("budget", "a positive integer", self.budget)
        if not _is_number(self.saguaro_c) or not 0.0 <= self.saguaro_c <= 1.0:
            raise bad("saguaro_c", "in [0, 1]", self.saguaro_c)
        if self.backup not in ("auto", "neural", "fast"):
            raise bad("backup", "'auto', 'neural' or 'fast'", self.backup)
        if self.mode not in ("async", "sync"):
            raise bad("mode", "'async' or 'sync'", self.mode)
        if not _is_int(self.q_support) or self.q_support < 0:
            raise bad("q_support", "an integer ≥ 0 (0 = dense q′)", self.q_support)
        if not _is_int(self.l0_tokens) or not 1 <= self.l0_tokens <= 16:
            raise bad("l0_tokens", "an integer in 1..16", self.l0_tokens)
        t0 = self.l0_temperature
        if t0 != "auto" and (not _is_number(t0) or t0 < 0):
            raise bad("l0_temperature", "≥ 0 or 'auto'", t0)
        m = self.draft_temperature
        if m is not None and m != "auto" and (not _is_number(m) or m <= 0):
            raise bad("draft_temperature", "> 0 or 'auto'", m)
        return self

    # ---- what K means on each side -----------------------------------------------------------------
    @property
    def max_k(self) -> int:
        """The most draft tokens a round verifies: K, or its ceiling under auto."""
        return AUTO_K_MAX if self.k == "auto" else self.k

    @property
    def verify_width(self) -> int:
        """Tokens per request in a verify forward: the root plus `max_k` drafts."""
        return self.max_k + 1

    @property
    def draft_k(self) -> int:
        """Tokens the draft server drafts per round. K = 0 never verifies a draft, but the server
        still needs a tree of at least one step."""
        return max(self.max_k, 1)

    # ---- transport -----------------------------------------------------------------------------------
    def draft_settings(self) -> DraftSettings:
        """Just the draft settings (drops the fields a subclass adds)."""
        return DraftSettings(**{f.name: getattr(self, f.name) for f in fields(DraftSettings)})

    def to_json(self) -> str:
        return json.dumps({f.name: getattr(self, f.name) for f in fields(self)})

    @classmethod
    def from_mapping(cls, data: dict) -> Self:
        """Strict: an unknown key is an error (a typo must not silently fall back to a default)."""
        if not isinstance(data, dict):
            raise ConfigError(f"{cls.__name__} must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown {cls.__name__} setting {unknown[0]!r} (known: {', '.join(sorted(known))})")
        return cls(**data)

    @classmethod
    def from_json(cls, text: str) -> Self:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{cls.__name__} is not valid JSON: {e}") from None
        return cls.from_mapping(data)


def add_setting_flags(group, prefix: str, *, defaults: bool) -> None:
    """One flag per `DraftSettings` field: `prefix` + the name with dashes, dest `prefix`-less name
    with underscores (`--ssd-l0-tokens` → `ssd_l0_tokens`). `defaults=False` leaves a flag that was
    not given out of the namespace, so it can override a `--settings` JSON only when given."""
    for f in fields(DraftSettings):
        flag = prefix + f.name.replace("_", "-")
        default = f.default if defaults else argparse.SUPPRESS
        shown = "" if f.default is None else f" (default: {f.default})"
        group.add_argument(flag, type=f.metadata["parse"], default=default, help=f.metadata["help"] + shown)


def settings_from_flags(ns: argparse.Namespace, dest_prefix: str = "") -> dict:
    """The setting values present in `ns` (see `add_setting_flags`), by field name."""
    out = {}
    for f in fields(DraftSettings):
        dest = dest_prefix + f.name
        if hasattr(ns, dest):
            out[f.name] = getattr(ns, dest)
    return out
