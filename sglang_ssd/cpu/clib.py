"""The C kernels of the CPU route: build, load, declare, and pick this process's route.

One shared library (gcc, from ``csrc/*.c``) holds every kernel: the small-M linear (``linear.py``), the
attention (``attention.py`` and the draft runner's ``draft/attention_c.py``), the rotary embedding
(``rope.py``) and the RMSNorm (``rmsnorm.py``). The compiled entry (``csrc/entry.cpp``, g++ against this
torch's headers) calls the same kernels without Python in between. Both are built by ``make install``
(``python -m sglang_ssd.cpu.linear --build``) or, failing that, on first use, into ``_build/`` keyed by
their sources, so an edit forces a rebuild. Without the entry the kernels are called through ctypes:
same bits, about 5 us more a call.

Route, from ``SGLANG_SSD_CPU_LINEAR`` (read once, at the first call; named after the linear, the
first kernel of the route, it switches all of them):
- ``auto`` (default): the AVX2+FMA kernels where the CPU has them, else the portable C kernels;
- ``portable``: the portable C kernels (plain C, same reduction order);
- ``torch``: torch everywhere (for A/B runs).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import torch

ENV = "SGLANG_SSD_CPU_LINEAR"
ROUTES = ("auto", "torch", "portable")

_SOURCES = tuple(Path(__file__).with_name("csrc") / name
                 for name in ("linear.c", "linear_bf16.c", "attention.c", "rope.c", "rmsnorm.c"))  # fmt: skip
_BUILD_DIR = Path(__file__).with_name("_build")
# The compiled entry (`csrc/entry.cpp`): the same checks and call without Python in between.
_ENTRY_SOURCE = Path(__file__).with_name("csrc") / "entry.cpp"
_ENTRY_NAME = "ssd_entry"
# -ffp-contract=off: the portable route must not have its multiply-adds fused behind our back, or
# its order of rounding would depend on the compiler's mood.
_CFLAGS = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-math-errno"]

_lock = threading.Lock()
_state: dict = {}
_UNRESOLVED = object()


def library_path() -> Path:
    """Where the compiled kernel lives: keyed by the source and flags, so an edit forces a rebuild."""
    digest = hashlib.sha256(b"".join(s.read_bytes() for s in _SOURCES) + " ".join(_CFLAGS).encode()).hexdigest()[:12]
    return _BUILD_DIR / f"ssd_linear-{digest}.so"


def _compile_once(out: Path, command) -> Path:
    """Build ``out`` with ``command(tmp)`` unless it exists. The file appears atomically (a process
    racing us sees either nothing or all of it), and builds of earlier sources are removed."""
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    subprocess.run(command(tmp), check=True, capture_output=True, text=True)
    tmp.replace(out)
    for stale in out.parent.glob(f"{out.name.rsplit('-', 1)[0]}-*.so"):
        if stale != out:
            stale.unlink(missing_ok=True)
    return out


def build() -> Path:
    """Compile the kernel with the system C compiler (no download); returns the library's path."""
    cc = os.environ.get("CC", "gcc")
    return _compile_once(library_path(), lambda tmp: [cc, *_CFLAGS, "-o", str(tmp), *map(str, _SOURCES), "-lm"])


def _entry_command(out: Path) -> list[str]:
    """The C++ compile of the entry against this interpreter's torch (what torch's extension builder
    runs, without its ninja dependency)."""
    import sysconfig

    from torch.utils import cpp_extension

    includes = [*cpp_extension.include_paths(), sysconfig.get_paths()["include"]]
    libs = cpp_extension.library_paths()
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [os.environ.get("CXX", "g++"), "-O2", "-fPIC", "-shared", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            f"-DTORCH_EXTENSION_NAME={_ENTRY_NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H", "-w",
            *(f"-I{d}" for d in includes), str(_ENTRY_SOURCE), "-o", str(out),
            *(f"-L{d}" for d in libs), *(f"-Wl,-rpath,{d}" for d in libs),
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]  # fmt: skip


def entry_path() -> Path:
    """Where the compiled entry lives: keyed by its source, torch and Python, so any of them changing
    forces a rebuild."""
    import sysconfig

    tag = f"{torch.__version__} {sysconfig.get_config_var('EXT_SUFFIX')}".encode()
    digest = hashlib.sha256(_ENTRY_SOURCE.read_bytes() + tag).hexdigest()[:12]
    return _BUILD_DIR / f"{_ENTRY_NAME}-{digest}.so"


def build_entry() -> Path:
    """Compile the entry (about 30 s with g++; `make install` does it). Returns its path."""
    out = entry_path()
    if not out.exists():
        print("sglang_ssd: compiling the CPU linear entry (once, about 30 s)", file=sys.stderr, flush=True)
    return _compile_once(out, _entry_command)


def entry(load: bool = True):
    """The compiled entry module, built if needed and loaded once per process; None if it cannot be
    (calls then go through ctypes: same kernels, same bits, about 5 us more a call), or if it is not
    loaded yet and ``load`` is false."""
    if "entry" in _state or not load:
        return _state.get("entry")
    module = None
    try:
        import importlib.util

        path = build_entry()
        spec = importlib.util.spec_from_file_location(_ENTRY_NAME, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (OSError, ImportError, subprocess.CalledProcessError) as exc:
        detail = (getattr(exc, "stderr", None) or "").strip()[-500:]
        print(f"sglang_ssd: compiled CPU linear entry unavailable ({exc} {detail}); calling the kernel "
              "through ctypes", file=sys.stderr, flush=True)  # fmt: skip
    _state["entry"] = module
    return module


def library() -> ctypes.CDLL | None:
    """The kernel library, built if needed and loaded once per process (None if it cannot be)."""
    if "lib" in _state:
        return _state["lib"]
    lib = None
    try:
        lib = ctypes.CDLL(str(build()))
    except (OSError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", None) or ""
        print(f"sglang_ssd: CPU linear kernel unavailable ({exc} {detail.strip()[-500:]}); using torch",
              file=sys.stderr, flush=True)  # fmt: skip
    if lib is not None:
        _declare(lib)
    _state["lib"] = lib
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    """The ctypes signature of every C function of the library."""
    sig = [ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
           ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long]  # fmt: skip
    for name in ("ssd_linear_avx2", "ssd_linear_portable", "ssd_linear_avx2_bf16", "ssd_linear_portable_bf16"):
        fn = getattr(lib, name)
        fn.argtypes = sig
        fn.restype = None
    for pack in (lib.ssd_pack, lib.ssd_pack_bf16):
        pack.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p]
        pack.restype = None
    lib.ssd_packed_size.argtypes = [ctypes.c_long, ctypes.c_long]
    lib.ssd_packed_size.restype = ctypes.c_long
    lib.ssd_lead_bytes.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_long]
    lib.ssd_lead_bytes.restype = ctypes.c_long
    lib.ssd_cpu_has_avx2_fma.restype = ctypes.c_int
    lib.ssd_linear_avx512.argtypes = [ctypes.c_int]
    lib.ssd_linear_avx512.restype = ctypes.c_int
    p, n = ctypes.c_void_p, ctypes.c_long
    for name in ("ssd_attention_avx2", "ssd_attention_avx2_pairwise", "ssd_attention_portable"):
        fn = getattr(lib, name)
        fn.argtypes = [p, n, p, p, p, n, p, n, p, p, ctypes.c_int, n, n, p, n, n, n, ctypes.c_float]
        fn.restype = ctypes.c_int
    lib.ssd_rope.argtypes = [p, n, p, n, p, p, p, n, n, n, n, n, ctypes.c_int, p, n, n]
    lib.ssd_rope.restype = ctypes.c_int
    lib.ssd_rmsnorm.argtypes = [p, n, p, n, p, ctypes.c_float, p, p, n, n, ctypes.c_int]
    lib.ssd_rmsnorm.restype = ctypes.c_int


def setting() -> str:
    """The route asked for by ``SGLANG_SSD_CPU_LINEAR``; a bad value is a one-line error."""
    wanted = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if wanted not in ROUTES:
        raise ValueError(f"{ENV}={wanted!r}: expected one of {', '.join(ROUTES)}")
    return wanted


def route() -> str:
    """'avx2', 'portable' or 'torch': the kernels this process runs; decided once, and said on stderr
    (not logging: SGLang's processes show only their own loggers, and which route served a run must be
    visible in its log; benchmarks compare them)."""
    with _lock:
        if "route" in _state:
            return _state["route"]
        wanted = setting()
        lib = library() if wanted != "torch" else None
        name = "torch" if lib is None else "avx2" if wanted == "auto" and lib.ssd_cpu_has_avx2_fma() else "portable"
        tiles = " with AVX-512 tiles" if name == "avx2" and avx512_tiles() else ""
        if name != "torch":
            tiles += ", compiled entry" if entry() is not None else ", ctypes entry"
        print(f"sglang_ssd: CPU linear route: {name}{tiles} ({ENV}={wanted}, pid {os.getpid()})", file=sys.stderr,
              flush=True)  # fmt: skip
        _state["route"] = name
        return name


def address(fn) -> int:
    """A ctypes function's address (0 for None), as the compiled entry takes it."""
    return 0 if fn is None else ctypes.cast(fn, ctypes.c_void_p).value


def avx512_tiles(on: bool | None = None) -> bool:
    """Whether the avx2 route runs its AVX-512 tiles (where the CPU has AVX-512F; same bits either
    way). ``on`` switches them (tests and benchmarks compare the two); None only asks."""
    lib = library()
    if lib is None:
        return False
    if on is None:
        state = _state.get("avx512")
        if state is None:
            state = _state["avx512"] = bool(lib.ssd_linear_avx512(1))
        return state
    _state["avx512"] = bool(lib.ssd_linear_avx512(int(on)))
    return _state["avx512"]


def rows_of(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x as [rows, features] with unit column stride, and its row stride: a row-strided view (a slice of
    a wider buffer, such as q or k inside a fused QKV output) is passed to C without a copy."""
    if x.dim() == 2 and x.stride(1) == 1:  # the common case, without reshape's dispatch (~1.5 us)
        return x, x.stride(0)
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    return x2, x2.stride(0)


def _kernel(key: str, symbol: str):
    """A C function of the library (``symbol``, with ``{route}`` filled in), or None on the torch route;
    looked up once per process, then read on every layer and step without a lock."""
    fn = _state.get(key, _UNRESOLVED)
    if fn is _UNRESOLVED:
        name = route()
        lib = library() if name != "torch" else None
        fn = _state[key] = None if lib is None else getattr(lib, symbol.format(route=name))
    return fn


def attention_kernel():
    """The C attention (``csrc/attention.c``) of this process's route, or None on the torch route."""
    return _kernel("attention", "ssd_attention_{route}")


def _entry_function(name: str, kernel=None):
    """The compiled entry's function ``name`` (``csrc/entry.cpp``), looked up once per process; None on
    the torch route or without the entry. ``kernel``: the accessor of the route's C function that the
    entry calls, handed to it once through ``set_<name>`` (none for an entry that calls ATen only)."""
    key = f"{name}_entry"
    fast = _state.get(key, _UNRESOLVED)
    if fast is _UNRESOLVED:
        fn = kernel() if kernel is not None else None
        usable = fn is not None if kernel is not None else route() != "torch"
        loaded = entry() if usable else None
        fast = None
        if loaded is not None:
            if fn is not None:
                getattr(loaded, f"set_{name}")(address(fn))
            fast = getattr(loaded, name)
        _state[key] = fast
    return fast


def attention_entry():
    """The compiled entry's KV write + attention, or None (torch route, no entry): then ``attention.py``
    runs the same kernel through ctypes, with SGLang's own KV write."""
    return _entry_function("attention", attention_kernel)


def rope_kernel():
    """The C rotary embedding (``csrc/rope.c``), or None on the torch route (same switch as the linears)."""
    return _kernel("rope", "ssd_rope")


def rope_entry():
    """The compiled entry's rotary embedding, or None (torch route, no entry): then ``rope.py`` calls the
    same kernel through ctypes."""
    return _entry_function("rope", rope_kernel)


def silu_mul_entry():
    """The compiled entry's SiLU-and-mul (SGLang's two ATen calls from C++), or None (torch route, no
    entry): then SGLang's own ``forward_native`` runs."""
    return _entry_function("silu_mul")


def rmsnorm_kernel():
    """The C RMSNorm (``csrc/rmsnorm.c``), or None on the torch route (same switch as the linears)."""
    return _kernel("rmsnorm", "ssd_rmsnorm")
