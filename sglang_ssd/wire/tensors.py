"""Tensors on the wire: raw little-endian frames, dtype and shape in the header (no Python object serialization).

A :class:`FrameWriter` collects tensors for one message and hands out :class:`TensorRef` s; a
:class:`FrameReader` checks every frame against its ref (known dtype, byte count = prod(shape) × itemsize,
frame index in range, size limit) before turning it back into a tensor.
"""

from __future__ import annotations

import sys
from math import prod

import numpy as np
import torch

from .messages import TensorRef

_TORCH = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAME = {v: k for k, v in _TORCH.items()}
#: numpy dtype used to read/write the raw bytes (bfloat16 travels as its 16-bit pattern).
_NUMPY = {
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": "<u2",
    "int64": "<i8",
    "int32": "<i4",
    "int16": "<i2",
    "uint8": "u1",
    "bool": "?",
}
MAX_NDIM = 4


class WireError(ValueError):
    """A message that does not follow the protocol; ``code`` is sent back in the error reply."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


def tensor_to_bytes(t: torch.Tensor) -> bytes:
    """Raw little-endian bytes of a CPU copy of ``t`` (row-major)."""
    name = _NAME.get(t.dtype)
    if name is None:
        raise ValueError(f"tensor dtype {t.dtype} cannot travel on the wire")
    t = t.detach().to("cpu").contiguous()
    if name == "bfloat16":
        t = t.view(torch.int16)
    arr = t.numpy()
    if sys.byteorder != "little":
        arr = arr.astype(np.dtype(_NUMPY[name]))
    return arr.tobytes()


def bytes_to_tensor(buf: bytes | memoryview, dtype: str, shape: list[int]) -> torch.Tensor:
    """Inverse of :func:`tensor_to_bytes`; always returns a fresh, writable CPU tensor."""
    arr = np.frombuffer(buf, dtype=np.dtype(_NUMPY[dtype])).reshape(shape)
    t = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="), copy=True))
    if dtype == "bfloat16":
        t = t.view(torch.int16).view(torch.bfloat16)
    return t


class FrameWriter:
    """Accumulates the tensor frames of one outgoing message."""

    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def add(self, t: torch.Tensor) -> TensorRef:
        if t.dim() > MAX_NDIM:
            raise ValueError(f"tensor has {t.dim()} dims, at most {MAX_NDIM} travel on the wire")
        ref = TensorRef(frame=len(self.frames), dtype=_NAME.get(t.dtype, "?"), shape=list(t.shape))
        self.frames.append(tensor_to_bytes(t))
        return ref


class FrameReader:
    """Validates and decodes the tensor frames of one incoming message."""

    def __init__(self, frames: list[bytes | memoryview], max_tensor_bytes: int) -> None:
        self.frames = frames
        self.max_tensor_bytes = max_tensor_bytes
        self.used: set[int] = set()

    def get(self, ref: TensorRef, name: str) -> torch.Tensor:
        if ref.dtype not in _TORCH:
            raise WireError("bad_message", f"{name}: unknown dtype {ref.dtype!r}")
        if len(ref.shape) > MAX_NDIM:
            raise WireError("bad_message", f"{name}: {len(ref.shape)} dims, at most {MAX_NDIM}")
        if ref.frame >= len(self.frames):
            raise WireError("bad_message", f"{name}: frame {ref.frame} missing ({len(self.frames)} frames)")
        if ref.frame in self.used:
            raise WireError("bad_message", f"{name}: frame {ref.frame} referenced twice")
        itemsize = np.dtype(_NUMPY[ref.dtype]).itemsize
        want = prod(ref.shape) * itemsize
        if want > self.max_tensor_bytes:
            raise WireError("too_large", f"{name}: {want} bytes exceeds the {self.max_tensor_bytes} limit")
        buf = self.frames[ref.frame]
        if len(buf) != want:
            raise WireError(
                "bad_message", f"{name}: frame has {len(buf)} bytes, dtype/shape say {want}"
            )
        self.used.add(ref.frame)
        return bytes_to_tensor(buf, ref.dtype, ref.shape)


def dtype_name(dtype: torch.dtype) -> str:
    return _NAME[dtype]
