"""Import-time stand-ins for packages SGLang's CPU engine imports but a plain CPU cannot provide.

- `sgl_kernel`: SGLang's CPU engine imports a few `*_cpu` ops from a source-built kernel wheel that
  needs AVX-512/AMX and is not published. We answer exactly those names with pure-torch versions
  (`sglang_ssd.cpu.kernels`) and raise ImportError for every other name or submodule, so SGLang's own
  `try: from sgl_kernel... except ImportError` fallbacks keep working.
- `torchvision`: imported at module level on vision-model config paths only; PyPI's torchvision does
  not load beside the CPU torch build. An import-only placeholder satisfies those imports; using any
  of it raises a clear error.

A stand-in is used only when the real package cannot be found or fails to import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

STAND_IN_ATTR = "__sglang_ssd_stand_in__"


def _real_package_usable(name: str) -> bool:
    """True if `name` resolves on the normal path and imports cleanly (checked in a child-safe way)."""
    for finder in sys.meta_path:
        if isinstance(finder, _StandInFinder):
            continue
        find = getattr(finder, "find_spec", None)
        if find is None:
            continue
        try:
            spec = find(name, None)
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            break
    else:
        return False
    if name != "sgl_kernel":
        return True
    # The PyPI kernel wheel is CUDA-only: it is found but fails to load without libcuda.
    try:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except Exception:
        return False
    return hasattr(module, "assign_req_to_token_pool_cpu")


class _Unavailable:
    """Placeholder for any torchvision object: attribute access works, using it fails loudly."""

    def __init__(self, path: str):
        self._path = path

    def __getattr__(self, item: str) -> _Unavailable:
        if item.startswith("__"):
            raise AttributeError(item)
        return _Unavailable(f"{self._path}.{item}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(
            f"{self._path} is unavailable: torchvision is not installed in this CPU environment "
            "(vision models are not supported by the CPU route)"
        )

    def __mro_entries__(self, bases):
        return (object,)


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Unavailable(f"{self.__name__}.{item}")


class _StandInLoader(importlib.abc.Loader):
    def __init__(self, build):
        self._build = build

    def create_module(self, spec):
        return self._build(spec.name)

    def exec_module(self, module):
        setattr(module, STAND_IN_ATTR, True)


def _build_sgl_kernel(name: str) -> types.ModuleType:
    from sglang_ssd.cpu import kernels

    module = types.ModuleType(name)
    _, _, sub = name.partition(".")
    if sub:
        names = kernels.SUBMODULE_OPS[sub]
    else:
        module.__path__ = []  # a package; only the submodules in SUBMODULE_OPS resolve
        names = kernels.OPS
    for op_name in names:
        setattr(module, op_name, getattr(kernels, op_name))
    return module


def _build_placeholder(name: str) -> types.ModuleType:
    module = _PlaceholderModule(name)
    module.__path__ = []
    module.__version__ = "0.0.0+unavailable"
    return module


class _StandInFinder(importlib.abc.MetaPathFinder):
    """Answers `sgl_kernel` and `torchvision[.*]` when no usable real package exists."""

    def __init__(self, packages: set[str]):
        self.packages = packages

    def find_spec(self, fullname, path=None, target=None):
        top, _, rest = fullname.partition(".")
        if top not in self.packages:
            return None
        if top == "sgl_kernel":
            from sglang_ssd.cpu.kernels import SUBMODULE_OPS

            if rest:
                if rest not in SUBMODULE_OPS:
                    return None  # SGLang's ImportError fallbacks take over
                return importlib.machinery.ModuleSpec(fullname, _StandInLoader(_build_sgl_kernel))
            return importlib.machinery.ModuleSpec(
                fullname, _StandInLoader(_build_sgl_kernel), is_package=True
            )
        return importlib.machinery.ModuleSpec(fullname, _StandInLoader(_build_placeholder), is_package=True)


def install() -> list[str]:
    """Put the finder in front of the import system for packages that are missing; returns their names."""
    if any(isinstance(f, _StandInFinder) for f in sys.meta_path):
        return sorted(next(f for f in sys.meta_path if isinstance(f, _StandInFinder)).packages)
    missing = {name for name in ("sgl_kernel", "torchvision") if not _real_package_usable(name)}
    if missing:
        sys.meta_path.insert(0, _StandInFinder(missing))
    return sorted(missing)


def is_stand_in(module: types.ModuleType) -> bool:
    return bool(getattr(module, STAND_IN_ATTR, False))
