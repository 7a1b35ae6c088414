"""sglang_ssd.hooks: one registration per hook, whatever the number of calls."""

from sglang.srt.plugins.hook_registry import HookRegistry, HookType

from sglang_ssd.hooks import register_once

TARGET = "tests.test_hooks.nowhere"  # never applied: no class by this path


def a_hook(*args, **kwargs):
    return None


def test_a_hook_is_registered_once_with_its_kind():
    before = list(HookRegistry._hooks.get(TARGET, []))
    try:
        register_once(TARGET, a_hook, "AFTER")
        register_once(TARGET, a_hook, "AFTER")
        mine = [entry for entry in HookRegistry._hooks[TARGET] if entry[1] is a_hook]
        assert len(mine) == 1
        assert HookType.AFTER in mine[0]
    finally:
        HookRegistry._hooks[TARGET] = before
