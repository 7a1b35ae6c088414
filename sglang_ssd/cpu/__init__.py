"""Serving SGLang on plain CPUs: kernel stand-ins and a TARGET_VERIFY path for torch attention."""


def install_cpu_support() -> None:
    """Idempotent: stand-ins for missing kernel packages + the torch verify attention hook."""
    from sglang_ssd.cpu import verify_attention
    from sglang_ssd.cpu.stand_ins import install

    install()
    verify_attention.register()
