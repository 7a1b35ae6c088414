"""Fast backup: deterministic draft tokens from a context lookup over the request's own tokens.

The proposal after a miss is the continuation of the most recent earlier occurrence of the context's
longest matching suffix (n = ``max_n`` down to ``min_n`` tokens). It costs a few dict look-ups (T_b ≈ 0)
and is a point-mass proposal (q = None): the verifier accepts x with probability p(x), which keeps the
output exact whatever the tokens are.
"""

from __future__ import annotations


class ContextLookup:
    """Incremental index: n-gram → latest end position that has a following token."""

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 ≤ min_n ≤ max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._index: dict[tuple[int, ...], int] = {}
        self._indexed = 0  # n-grams ending before this position are in the index

    def update(self, tokens: list[int]) -> None:
        """Index every n-gram that ends before the last token of ``tokens`` (call as tokens grow)."""
        for end in range(max(self._indexed, 0), len(tokens) - 1):
            for n in range(self.min_n, min(self.max_n, end + 1) + 1):
                self._index[tuple(tokens[end - n + 1 : end + 1])] = end
        self._indexed = max(self._indexed, len(tokens) - 1)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens continuing ``tokens`` (fewer, or none, when nothing matches)."""
        self.update(tokens)
        for n in range(min(self.max_n, len(tokens)), self.min_n - 1, -1):
            end = self._index.get(tuple(tokens[-n:]))
            if end is not None:
                out = tokens[end + 1 : end + 1 + k]
                # The slice stops at the end of the context only when the match is periodic with
                # period len(out); continuing the period is the natural guess.
                period = len(out)
                while len(out) < k:
                    out.append(out[len(out) - period])
                return out
        return []
