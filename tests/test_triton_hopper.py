"""Every Triton kernel of the package compiles for a Hopper GPU (sm_90), here on the CPU.

The kernels' own tests run them under ``TRITON_INTERPRET=1``, which accepts code the compiler refuses
(a kernel reading a plain module global ran interpreted but failed on the first GPU run of
`make gpu-check`). Triton's compiler needs no GPU, only its bundled ``ptxas``, so each kernel is taken
down to a cubin in a child process without the interpreter (the test modules set it in this one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton")

ROOT = Path(__file__).resolve().parents[1]

# module, kernel, argument types (pointers by dtype; other arguments i32, as Triton specializes small Python ints), constexprs
KERNELS = [
    ("sglang_ssd.draft.attention_triton", "_tree_attention_kernel",
     {"q_ptr": "*bf16", "k_ptr": "*bf16", "v_ptr": "*bf16", "o_ptr": "*bf16", "start_ptr": "*i64",
      "kvlen_ptr": "*i32", "moff_ptr": "*i64", "mask_ptr": "*u8", "scale": "fp32"},
     {"GROUP": 4, "D": 64, "BLOCK_N": 64}),
    ("sglang_ssd.algo.verify_triton", "_chain_verify_kernel",
     {"p_ptr": "*fp32", "q_ptr": "*fp32", "s_ptr": "*i64", "n_ptr": "*i32", "u_ptr": "*fp32",
      "k_ptr": "*i32", "bonus_ptr": "*i32"},
     {"BLOCK": 1024}),
]  # fmt: skip

CHILD = textwrap.dedent("""
    import importlib, json, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, name, types, consts = json.loads(sys.argv[1])
    fn = getattr(importlib.import_module(module), name)
    sig = {a: types.get(a, "constexpr" if a in consts else "i32") for a in fn.arg_names}
    src = ASTSource(fn, sig, {(fn.arg_names.index(c),): v for c, v in consts.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32))
    print("stages:", " ".join(kernel.asm))
""")


def _compile(spec, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = f"{cwd}{os.pathsep}{ROOT}"
    return subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip


@pytest.mark.parametrize("spec", KERNELS, ids=[k[1] for k in KERNELS])
def test_kernel_compiles_for_sm90(spec):
    r = _compile(spec)
    assert r.returncode == 0 and "cubin" in r.stdout, r.stderr[-2000:]


def test_a_kernel_reading_a_plain_global_is_refused(tmp_path):
    """The planted bug the interpreter let through: the same harness must fail on it."""
    (tmp_path / "planted_kernel.py").write_text(textwrap.dedent("""
        import triton
        import triton.language as tl

        NEG = -1.0e30  # not a tl.constexpr: a compiled kernel may not read it

        @triton.jit
        def kernel(x_ptr, BLOCK: tl.constexpr):
            x = tl.load(x_ptr + tl.arange(0, BLOCK))
            tl.store(x_ptr + tl.arange(0, BLOCK), tl.maximum(x, NEG))
    """))
    r = _compile(("planted_kernel", "kernel", {"x_ptr": "*fp32"}, {"BLOCK": 64}), cwd=tmp_path)
    assert r.returncode != 0 and "global variable NEG" in r.stderr, r.stdout + r.stderr[-2000:]
