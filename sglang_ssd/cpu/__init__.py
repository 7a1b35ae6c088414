"""Serving SGLang on plain CPUs: kernel stand-ins, a TARGET_VERIFY path for torch attention, and
the small-M linear route (`linear.py`), the rotary embedding and the RMSNorm in C (`sglang_rope.py`,
`rmsnorm.py`), SiLU-and-mul without SGLang's Python around it (`silu_mul.py`), and a malloc policy that
keeps a step's freed buffers in the process (`allocator.py`). `clib.py` builds and loads the C kernels
(`csrc/`) and picks the process's route; the modules above call them through it."""


def install_cpu_support() -> None:
    """Idempotent: stand-ins for missing kernel packages, the verify and decode attention hooks, the linear
    route, the rotary embedding, the RMSNorm, SiLU-and-mul, the malloc policy."""
    from sglang_ssd.cpu import linear_hooks, rmsnorm, silu_mul, verify_attention
    from sglang_ssd.cpu import sglang_attention as attention
    from sglang_ssd.cpu import sglang_rope as rope
    from sglang_ssd.cpu.allocator import keep_freed_memory
    from sglang_ssd.cpu.stand_ins import install

    keep_freed_memory()
    install()
    verify_attention.register()
    attention.register()
    linear_hooks.register()
    rope.register()
    rmsnorm.register()
    silu_mul.register()
