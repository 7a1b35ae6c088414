"""The draft's own KV memory: one flat pool of slots per layer, handed out as contiguous extents.

Each request owns one extent (a run of whole pages) laid out as

    [ committed context | glue: last token + speculation under verification | branches, step-major ]

so the committed prefix of any branch is a plain slice (no gather on the torch path) and the extent is
also a valid page list for a paged-attention kernel (pages = extent / page_size, consecutive).
Memory is bounded by the pool size; an extent grows in place when the space after it is free, otherwise
it moves (one copy), and is returned to the free list on close / abort / idle timeout.
"""

from __future__ import annotations

import bisect

import torch

from .model_config import ModelConfig


class PoolExhausted(RuntimeError):
    """No free extent large enough (the request is refused; others keep running)."""


class KVPool:
    """K and V tensors ``[layers, slots, Hkv, D]`` and a first-fit allocator of page-aligned extents."""

    def __init__(
        self, cfg: ModelConfig, num_slots: int, dtype: torch.dtype, device: torch.device, page_size: int = 16
    ) -> None:
        if num_slots < page_size:
            raise ValueError(f"num_slots must be ≥ page_size ({page_size}), got {num_slots}")
        self.page_size = page_size
        self.num_slots = num_slots // page_size * page_size
        shape = (cfg.num_layers, self.num_slots, cfg.num_kv_heads, cfg.head_dim)
        # Pages are zeroed when handed out, not here: resident memory follows use, not the pool size.
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self._free: list[tuple[int, int]] = [(0, self.num_slots)]  # sorted (start, length)
        self.used_slots = 0
        self.high_water = 0  # end of the furthest slot ever handed out: the pool's touched part

    def round_up(self, n: int) -> int:
        return -(-n // self.page_size) * self.page_size

    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()

    def touched_bytes(self) -> int:
        """Bytes of K and V written so far (pages past the high-water mark were never touched, so on a
        CPU they are not resident): it grows toward ``nbytes()`` as the pool fills, then stays. Exact
        because first-fit hands out the lowest free slots: every slot below the mark was zeroed once."""
        return self.nbytes() * self.high_water // self.num_slots

    def alloc(self, n: int) -> tuple[int, int]:
        """A free extent of at least ``n`` slots: (start, length)."""
        n = self.round_up(max(n, 1))
        for i, (start, length) in enumerate(self._free):
            if length >= n:
                if length == n:
                    self._free.pop(i)
                else:
                    self._free[i] = (start + n, length - n)
                self.used_slots += n
                self._zero(start, n)
                return start, n
        raise PoolExhausted(f"KV pool has no free extent of {n} slots ({self.free_slots()} free in all)")

    def release(self, start: int, length: int) -> None:
        i = bisect.bisect_left(self._free, (start, 0))
        self._free.insert(i, (start, length))
        self.used_slots -= length
        # Coalesce with the neighbours so large extents stay available.
        if i + 1 < len(self._free) and self._free[i][0] + self._free[i][1] == self._free[i + 1][0]:
            self._free[i] = (start, self._free[i][1] + self._free.pop(i + 1)[1])
        if i > 0 and self._free[i - 1][0] + self._free[i - 1][1] == self._free[i][0]:
            self._free[i - 1] = (self._free[i - 1][0], self._free[i - 1][1] + self._free.pop(i)[1])

    def grow(self, start: int, length: int, need: int, keep: int) -> tuple[int, int]:
        """Extent of at least ``need`` slots holding the first ``keep`` slots of (start, length)."""
        need = self.round_up(need)
        if need <= length:
            return start, length
        end = start + length
        i = bisect.bisect_left(self._free, (end, 0))
        if i < len(self._free) and self._free[i][0] == end and length + self._free[i][1] >= need:
            extra = need - length
            s, n = self._free[i]
            if n == extra:
                self._free.pop(i)
            else:
                self._free[i] = (s + extra, n - extra)
            self.used_slots += extra
            self._zero(end, extra)
            return start, need
        # Doubling keeps the number of moves logarithmic in the final context length.
        new_start, new_len = self.alloc(max(need, 2 * length))
        if keep:
            self.k[:, new_start : new_start + keep] = self.k[:, start : start + keep]
            self.v[:, new_start : new_start + keep] = self.v[:, start : start + keep]
        self.release(start, length)
        return new_start, new_len

    def _zero(self, start: int, n: int) -> None:
        # Masked-out slots inside an attention window are still read; they must hold finite values.
        self.high_water = max(self.high_water, start + n)
        self.k[:, start : start + n].zero_()
        self.v[:, start : start + n].zero_()

    @staticmethod
    def slot_bytes(cfg: ModelConfig, dtype: torch.dtype) -> int:
        """Bytes of K and V for one token over all layers."""
        return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * torch.finfo(dtype).bits // 8

    def free_slots(self) -> int:
        return sum(n for _, n in self._free)
