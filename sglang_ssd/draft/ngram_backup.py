"""The context lookup over a request's own tokens: the fast backup, and L0's first source (``draft/ngram.py``).

:func:`suffix_matches` finds the earlier occurrences of the longest suffix of the context that occurs
earlier at all (its length within bounds). The fast backup proposes the continuation of the most recent
one (n = ``max_n`` down to ``min_n`` tokens). It costs one pass over the earlier positions of the last
token (T_b ≈ 0) and is a point-mass proposal (q = None): the verifier accepts x with probability p(x),
which keeps the output exact whatever the tokens are.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def suffix_matches(tokens: Sequence[int], min_n: int, max_n: int, candidates: Iterable[int] | None = None) -> list[int]:
    """End positions j ≤ len − 2, ascending, of every earlier occurrence of the longest suffix of
    ``tokens`` (length in [min_n, max_n]) that occurs earlier; empty when none does.

    ``candidates``: the positions j ≤ len − 2 holding the last token, for a caller that indexes them;
    found by a scan otherwise.
    """
    n = len(tokens)
    if n <= min_n:  # no earlier occurrence can be min_n long
        return []
    if candidates is None:
        last = tokens[-1]
        candidates = [j for j, t in enumerate(tokens[:-1]) if t == last]
    best, ends = 0, []
    for j in candidates:
        length = 1
        while length < max_n and j - length >= 0 and tokens[j - length] == tokens[n - 1 - length]:
            length += 1
        if length < min_n or length < best:
            continue
        if length > best:
            best, ends = length, []
        ends.append(j)
    return ends


class ContextLookup:
    """A request's fast backup, indexed as its tokens grow: token → the positions holding it."""

    def __init__(self, min_n: int = 1, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"need 1 ≤ min_n ≤ max_n, got min_n={min_n}, max_n={max_n}")
        self.min_n, self.max_n = min_n, max_n
        self._positions: dict[int, list[int]] = {}
        self._indexed = 0  # positions before this one are in the index

    def update(self, tokens: list[int]) -> None:
        """Index every position before the last token of ``tokens`` (call as the same list grows)."""
        for pos in range(self._indexed, len(tokens) - 1):
            self._positions.setdefault(tokens[pos], []).append(pos)
        self._indexed = max(self._indexed, len(tokens) - 1)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens continuing ``tokens`` (fewer, or none, when nothing matches)."""
        self.update(tokens)
        ends = suffix_matches(tokens, self.min_n, self.max_n, self._positions.get(tokens[-1], []) if tokens else [])
        if not ends:
            return []
        out = tokens[ends[-1] + 1 : ends[-1] + 1 + k]
        # The slice stops at the end of the context only when the match is periodic with period
        # len(out); continuing the period is the natural guess.
        period = len(out)
        while len(out) < k:
            out.append(out[len(out) - period])
        return out
