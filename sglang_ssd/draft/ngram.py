"""L0 of the recursive chain: an n-gram drafter on the target's token ids (no neural network).

Two sources of evidence, used in this order:

(a) **context lookup** — the longest suffix of the request's own history (length ≥ ``min_match``, capped
    at ``max_match``) that also occurs earlier in that history; the tokens that followed its earlier
    occurrences are the lookup's votes (``draft/ngram_backup.suffix_matches``, the fast backup's lookup);
(b) **backoff n-gram table** — counts of (n−1 context tokens → next token) for n = ``order`` … 1, fitted on
    a token corpus. Only the ``max_next`` most frequent continuations of each context are kept (plus the
    context's total count and number of distinct continuations, which the smoothing needs), so the table
    stays small.

The smoothed next-token distribution is interpolated absolute discounting over the table (discount D):

    P_n(w | h) = max(c(h, w) − D, 0) / c(h) + D · N(h) / c(h) · P_{n−1}(w | h′),

with P_n = P_{n−1} when the context h was never seen, and the base P_1 = unigram frequencies of the
``max_unigram`` most frequent tokens. The lookup then acts as one more level on top, with weight 1 for
the table: P(w) = (v(w) + P_table(w)) / (Σv + 1), where v(w) counts the lookup's votes for w. Any lookup
vote therefore outweighs everything else, so the argmax follows (a) whenever (a) matches and (b)
otherwise. ``distribution`` keeps the ``top`` most likely tokens and renormalizes them, so it is a
proper bounded-support proposal q; ``propose`` is the greedy chain of argmaxes (a point-mass proposal).

The draft server loads the fitted table (``L0Level.load``); ``sglang_ssd.tools.ngram_build`` builds it and
measures its greedy acceptance against the target.
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from .ngram_backup import suffix_matches

FORMAT = "sglang-ssd/ngram"
VERSION = 1


def _check_ids(tokens, name: str, vocab_size: int | None) -> list[int]:
    """Token ids as a list of ints, or ValueError naming the argument."""
    if isinstance(tokens, torch.Tensor):
        if tokens.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(tokens.shape)}")
        tokens = tokens.tolist()
    if not isinstance(tokens, (list, tuple)):
        raise ValueError(f"{name} must be a list of token ids, got {type(tokens).__name__}")
    for t in tokens:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0 or (vocab_size is not None and t >= vocab_size):
            raise ValueError(f"{name} must hold ints in [0, {vocab_size or 'inf'}), got {t!r}")
    return list(tokens)


class NgramDraft:
    """Context lookup + backoff n-gram drafter on token ids.

    order: largest n (context of order−1 tokens); max_next: continuations kept per context;
    max_unigram: support of the base distribution; discount: absolute discount D in (0, 1);
    min_match / max_match: suffix lengths the context lookup accepts; vocab_size: if given, ids are
    checked against it.
    """

    def __init__(self, order: int = 4, max_next: int = 8, max_unigram: int = 256, discount: float = 0.75,
                 min_match: int = 2, max_match: int = 16, vocab_size: int | None = None):
        for name, v, lo in (("order", order, 1), ("max_next", max_next, 1), ("max_unigram", max_unigram, 1),
                            ("min_match", min_match, 1)):
            if not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an int ≥ {lo}, got {v!r}")
        if not isinstance(max_match, int) or max_match < min_match:
            raise ValueError(f"max_match must be an int ≥ min_match={min_match}, got {max_match!r}")
        if not 0.0 < discount < 1.0:
            raise ValueError(f"discount must be in (0, 1), got {discount!r}")
        if vocab_size is not None and (not isinstance(vocab_size, int) or vocab_size < 1):
            raise ValueError(f"vocab_size must be a positive int or None, got {vocab_size!r}")
        self.order, self.max_next, self.max_unigram = order, max_next, max_unigram
        self.discount, self.min_match, self.max_match, self.vocab_size = discount, min_match, max_match, vocab_size
        self.num_tokens = 0
        # tables[n - 1]: context tuple of n−1 ids → (total count, distinct continuations, [(id, count)…]).
        self.tables: list[dict[tuple[int, ...], tuple[int, int, list[tuple[int, int]]]]] = [{} for _ in range(order)]

    # ----------------------------------------------------------------------------------------- fitting
    def fit(self, token_sequences: Iterable[Sequence[int]]) -> NgramDraft:
        """Replace the table by counts over `token_sequences` (each a list of ids). Returns self."""
        counts = [defaultdict(Counter) for _ in range(self.order)]
        n_tok = 0
        for i, seq in enumerate(token_sequences):
            ids = _check_ids(seq, f"token_sequences[{i}]", self.vocab_size)
            n_tok += len(ids)
            for pos, tok in enumerate(ids):
                for n in range(1, min(self.order, pos + 1) + 1):
                    counts[n - 1][tuple(ids[pos - n + 1:pos])][tok] += 1
        if n_tok == 0:
            raise ValueError("token_sequences must contain at least one token")
        self.num_tokens = n_tok
        for n, table in enumerate(counts, 1):
            keep = self.max_unigram if n == 1 else self.max_next
            self.tables[n - 1] = {
                h: (sum(c.values()), len(c), sorted(c.items(), key=lambda x: (-x[1], x[0]))[:keep])
                for h, c in table.items()
            }
        return self

    # ----------------------------------------------------------------------------------------- inference
    def lookup_votes(self, context: list[int]) -> Counter:
        """Continuations of the longest earlier occurrence(s) of the context's suffix (len ≥ min_match)."""
        return Counter(context[j + 1] for j in suffix_matches(context, self.min_match, self.max_match))

    def _table_probs(self, context: list[int]) -> dict[int, float]:
        p: dict[int, float] = {}
        d = self.discount
        for n in range(1, self.order + 1):
            if n - 1 > len(context):
                break
            entry = self.tables[n - 1].get(tuple(context[len(context) - n + 1:]) if n > 1 else ())
            if entry is None:
                continue  # unseen context: P_n = P_{n−1}
            total, distinct, nxt = entry
            if n == 1:
                p = {w: c / total for w, c in nxt}
                continue
            gamma = d * distinct / total
            q = {w: gamma * v for w, v in p.items()}
            for w, c in nxt:
                q[w] = q.get(w, 0.0) + max(c - d, 0.0) / total
            p = q
        return p

    def _scores(self, context: list[int]) -> dict[int, float]:
        p = self._table_probs(context)
        votes = self.lookup_votes(context)
        if votes:
            z = sum(votes.values()) + 1.0
            p = {w: v / z for w, v in p.items()}
            for w, c in votes.items():
                p[w] = p.get(w, 0.0) + c / z
        return p

    def distribution(self, context: Sequence[int], top: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
        """Smoothed next-token distribution on at most `top` tokens.

        Returns (ids LongTensor[S], probs FloatTensor[S]) with S ≤ top, sorted by decreasing probability
        (ties: smaller id first); probs > 0 and sum to 1 over the returned support.
        """
        if not isinstance(top, int) or isinstance(top, bool) or top < 1:
            raise ValueError(f"top must be an int ≥ 1, got {top!r}")
        ctx = _check_ids(context, "context", self.vocab_size)
        scores = sorted(((w, s) for w, s in self._scores(ctx).items() if s > 0), key=lambda x: (-x[1], x[0]))[:top]
        if not scores:
            raise ValueError("context: no lookup match and the drafter has no table (call fit() or load())")
        ids = torch.tensor([w for w, _ in scores], dtype=torch.long)
        probs = torch.tensor([s for _, s in scores], dtype=torch.float64)
        return ids, (probs / probs.sum()).to(torch.float32)

    def propose(self, context: Sequence[int], k: int) -> list[int]:
        """Greedy chain of `k` draft tokens (point-mass proposals) after `context`.

        Fewer than k tokens only when nothing is known (no lookup match and an empty table).
        """
        if not isinstance(k, int) or isinstance(k, bool) or k < 0:
            raise ValueError(f"k must be an int ≥ 0, got {k!r}")
        ctx = _check_ids(context, "context", self.vocab_size)
        out: list[int] = []
        for _ in range(k):
            scores = self._scores(ctx)
            if not scores:
                break
            tok = min(scores.items(), key=lambda x: (-x[1], x[0]))[0]
            out.append(tok)
            ctx.append(tok)
        return out

    # ----------------------------------------------------------------------------------------- storage
    def save(self, path: str | Path) -> None:
        """Write JSON: per order a CSR table (contexts, total, distinct, offsets, next, count)."""
        tables = []
        for n, table in enumerate(self.tables, 1):
            keys = sorted(table)
            rec = {"n": n, "contexts": [t for h in keys for t in h], "total": [], "distinct": [],
                   "offsets": [0], "next": [], "count": []}
            for h in keys:
                total, distinct, nxt = table[h]
                rec["total"].append(total)
                rec["distinct"].append(distinct)
                rec["next"].extend(w for w, _ in nxt)
                rec["count"].extend(c for _, c in nxt)
                rec["offsets"].append(len(rec["next"]))
            tables.append(rec)
        meta = {"format": FORMAT, "version": VERSION, "order": self.order, "max_next": self.max_next,
                "max_unigram": self.max_unigram, "discount": self.discount, "min_match": self.min_match,
                "max_match": self.max_match, "vocab_size": self.vocab_size, "num_tokens": self.num_tokens}
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({**meta, "tables": tables}, separators=(",", ":")), encoding="utf-8")
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str | Path) -> NgramDraft:
        """Read a file written by `save`; ValueError if it is not one."""
        obj = json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(obj, dict) or obj.get("format") != FORMAT or obj.get("version") != VERSION:
            raise ValueError(f"path {path} is not a {FORMAT} v{VERSION} file")
        model = cls(obj["order"], obj["max_next"], obj["max_unigram"], obj["discount"], obj["min_match"],
                    obj["max_match"], obj["vocab_size"])
        model.num_tokens = obj["num_tokens"]
        for rec in obj["tables"]:
            n, width = rec["n"], rec["n"] - 1
            table = {}
            for i, (total, distinct) in enumerate(zip(rec["total"], rec["distinct"], strict=True)):
                lo, hi = rec["offsets"][i], rec["offsets"][i + 1]
                h = tuple(rec["contexts"][i * width:(i + 1) * width])
                table[h] = (total, distinct, list(zip(rec["next"][lo:hi], rec["count"][lo:hi], strict=True)))
            model.tables[n - 1] = table
        return model
