"""Import-time stand-ins for `sgl_kernel` and `torchvision` under SGLang's CPU engine.

The stand-in finder is process-global and is installed at interpreter start by the `.pth` hook
(`sglang_ssd/cpu/autoload.py`), so every case runs in a fresh interpreter with or without
`SGLANG_USE_CPU_ENGINE=1`, the way SGLang's spawned processes see it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sglang_ssd.cpu.install_hook import PTH_LINE, pth_path

ROOT = Path(__file__).resolve().parents[2]


def run_child(code: str, cpu_engine: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {
        k: v for k, v in os.environ.items() if k not in ("SGLANG_USE_CPU_ENGINE", "SGLANG_SSD_NO_STAND_INS")
    }
    env["OMP_NUM_THREADS"] = "1"
    if cpu_engine:
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(proc: subprocess.CompletedProcess, marker: str = "OK") -> None:
    assert proc.returncode == 0 and marker in proc.stdout, (
        f"rc={proc.returncode}\n{proc.stdout}\n{proc.stderr[-3000:]}"
    )


@pytest.fixture(scope="module", autouse=True)
def hook_installed():
    path = pth_path()
    if not path.is_file() or path.read_text() != PTH_LINE:
        pytest.fail(f"{path} is missing: run `python -m sglang_ssd.cpu.install_hook` (make install does it)")


def test_cpu_ops_import_from_sgl_kernel():
    ok(
        run_child(
            """
            import sgl_kernel
            from sgl_kernel import assign_req_to_token_pool_cpu
            from sglang_ssd.cpu import kernels
            from sglang_ssd.cpu.stand_ins import is_stand_in
            assert is_stand_in(sgl_kernel)
            assert assign_req_to_token_pool_cpu is kernels.assign_req_to_token_pool_cpu
            for name in kernels.OPS:
                assert getattr(sgl_kernel, name) is getattr(kernels, name), name
            print("OK")
            """
        )
    )


def test_other_sgl_kernel_names_raise_import_error():
    ok(
        run_child(
            """
            try:
                from sgl_kernel import silu_and_mul
            except ImportError as e:
                assert "silu_and_mul" in str(e), e
                print("OK")
            """
        )
    )


def test_unknown_sgl_kernel_submodules_raise_import_error():
    # SGLang's `try: from sgl_kernel.mamba import ... except ImportError` fallbacks rely on this
    ok(
        run_child(
            """
            try:
                import sgl_kernel.mamba
            except ImportError as e:
                assert "sgl_kernel.mamba" in str(e), e
                print("OK")
            """
        )
    )


def test_speculative_submodule_serves_reconstruct_indices():
    ok(
        run_child(
            """
            from sgl_kernel.speculative import reconstruct_indices_from_tree_mask
            from sglang_ssd.cpu import kernels
            assert reconstruct_indices_from_tree_mask is kernels.reconstruct_indices_from_tree_mask
            print("OK")
            """
        )
    )


def test_torchvision_placeholder_imports_but_refuses_use():
    ok(
        run_child(
            """
            import torchvision
            import torchvision.transforms as T
            from torchvision.transforms import InterpolationMode
            from sglang_ssd.cpu.stand_ins import is_stand_in
            assert is_stand_in(torchvision) and is_stand_in(T)
            T.InterpolationMode.BICUBIC
            InterpolationMode.BILINEAR
            class Sub(T.Compose):  # class bodies that subclass torchvision types must still load
                pass
            try:
                T.functional.resize([[0.0]], [4, 4])
            except RuntimeError as e:
                assert "torchvision" in str(e), e
                print("OK")
            """
        )
    )


def test_no_stand_ins_without_the_cpu_engine():
    proc = run_child(
        """
        import importlib.util
        real = importlib.util.find_spec("sgl_kernel") is not None
        try:
            import sgl_kernel
        except ImportError:
            print("IMPORT-FAILED", real)
        else:
            from sglang_ssd.cpu.stand_ins import is_stand_in
            assert not is_stand_in(sgl_kernel), "stand-in served without SGLANG_USE_CPU_ENGINE=1"
            print("REAL-PACKAGE", real)
        """,
        cpu_engine=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a machine without a real kernel package must see a plain ImportError
    assert proc.stdout.split() in (["IMPORT-FAILED", "False"], ["REAL-PACKAGE", "True"]), proc.stdout


@pytest.mark.slow  # ~7 s of CPU: imports a large part of SGLang
def test_sglang_allocation_module_imports_under_the_cpu_engine():
    # imports `assign_req_to_token_pool_cpu` from sgl_kernel at module level
    ok(
        run_child(
            """
            import sglang.srt.mem_cache.allocation as allocation
            from sglang_ssd.cpu import kernels
            assert allocation._is_cpu
            assert allocation.assign_req_to_token_pool_cpu is kernels.assign_req_to_token_pool_cpu
            print("OK")
            """,
            timeout=300,
        )
    )
