"""Registering this project's functions in SGLang's hook registry (``sglang.srt.plugins.hook_registry``)."""

from __future__ import annotations


def register_once(target: str, hook, kind: str = "AROUND") -> None:
    """Register ``hook`` (``kind``: a ``HookType`` name) on ``target``, unless it is there already: the
    plugin and ``install_cpu_support`` may run more than once in a process, and a hook registered twice
    would run twice."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    if not any(h is hook for _, h, _ in HookRegistry._hooks.get(target, [])):
        HookRegistry.register(target, hook, getattr(HookType, kind))
