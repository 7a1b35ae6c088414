"""The draft-settings contract (sglang_ssd/wire/settings.py): one declaration, read by the launcher and
the draft server alike. No model loads here."""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from sglang_ssd.draft.cli import draft_settings, parse_args
from sglang_ssd.target.draft_fleet import draft_server_command
from sglang_ssd.target.ssd_config import SSDConfig, add_ssd_arguments, config_from_args
from sglang_ssd.wire.settings import AUTO_K_MAX, ConfigError, DraftSettings

NON_DEFAULT = dict(k=3, fanout="uniform", budget=9, saguaro_c=0.5, backup="auto", mode="sync", q_support=64,
                   l0_tokens=2, l0_temperature=0.4, draft_temperature="auto")  # fmt: skip


def test_every_field_has_a_non_default_example():
    # NON_DEFAULT must grow with DraftSettings, or the round trips below test less than they claim.
    assert set(NON_DEFAULT) == {f.name for f in fields(DraftSettings)}
    assert all(getattr(DraftSettings(), k) != v for k, v in NON_DEFAULT.items())


def test_json_round_trip_and_strict_keys():
    s = DraftSettings(**NON_DEFAULT).validate()
    assert DraftSettings.from_json(s.to_json()) == s
    with pytest.raises(ConfigError, match="unknown DraftSettings setting 'kk'"):
        DraftSettings.from_json('{"kk": 3}')
    with pytest.raises(ConfigError, match="not valid JSON"):
        DraftSettings.from_json("{k: 3")


@pytest.mark.parametrize("field, value", [("k", 33), ("k", -1), ("k", "7"), ("budget", 0), ("saguaro_c", 1.5),
                                          ("fanout", "tree"), ("backup", "slow"), ("mode", "fast"),
                                          ("q_support", -1), ("l0_tokens", 0), ("l0_temperature", -1.0),
                                          ("draft_temperature", 0)])  # fmt: skip
@pytest.mark.parametrize("prefix", ["--", "--ssd-"])
def test_a_bad_value_is_one_line_naming_the_flag_of_its_side(field, value, prefix):
    with pytest.raises(ConfigError) as info:
        DraftSettings(**{field: value}).validate(prefix)
    message = str(info.value)
    assert message.startswith(prefix + field.replace("_", "-") + " must be") and "\n" not in message


@pytest.mark.parametrize("k, verify_width, draft_k", [(0, 1, 1), (1, 2, 1), (5, 6, 5), ("auto", AUTO_K_MAX + 1, AUTO_K_MAX)])
def test_what_k_means_on_each_side(k, verify_width, draft_k):
    s = DraftSettings(k=k).validate()
    assert (s.verify_width, s.draft_k) == (verify_width, draft_k)


def test_the_launcher_flags_reach_the_draft_server_as_one_json_argument():
    parser = argparse.ArgumentParser()
    add_ssd_arguments(parser)
    argv = [a for name, v in NON_DEFAULT.items() for a in (f"--ssd-{name.replace('_', '-')}", str(v))]
    config = config_from_args(parser.parse_args(argv), "models/draft")
    assert config.draft_settings() == DraftSettings(**NON_DEFAULT)
    command = draft_server_command(config, "ipc:///tmp/x.sock")
    assert command[1:3] == ["-m", "sglang_ssd.draft_server"]
    received = draft_settings(parse_args(command[3:]))
    assert received == DraftSettings(**NON_DEFAULT)


def test_the_draft_server_flags_alone_and_over_settings():
    assert draft_settings(parse_args(["--model", "m"])) == DraftSettings()
    by_hand = ["--model", "m", *[a for name, v in NON_DEFAULT.items() for a in (f"--{name.replace('_', '-')}", str(v))]]
    assert draft_settings(parse_args(by_hand)) == DraftSettings(**NON_DEFAULT)
    sent = SSDConfig(k=4, budget=12).draft_settings().to_json()
    got = draft_settings(parse_args(["--model", "m", "--settings", sent, "--budget", "5"]))
    assert (got.k, got.budget) == (4, 5)  # the flag given wins over the JSON field
    with pytest.raises(ConfigError, match="^--k must be"):
        draft_settings(parse_args(["--model", "m", "--settings", '{"k": 40}']))
