"""`make mutants`: every planted bug, its verdict and the evidence; ends with `mutants: P planted, C caught`.

A bug is caught when one of its named cases rejects the law under the bug while the same case, run
clean, passes all its checks (law, power, full-acceptance share). The slower cases `make test` leaves
out (EXTRA_CASES) run clean here first. Exit status 1 unless they pass and every bug is caught.
"""

from __future__ import annotations

import sys
import time

import torch

from tests.algo._cases import ALL_CASES, EXTRA_CASES, Result

from .planted import MUTANTS, planted


def _short(r: Result) -> str:
    if r.fit is None:
        return f"greedy chain on every row: {r.greedy_ok}"
    return f"p={r.fit.pvalue:.3g} TV={r.fit.tv:.4f} n={r.fit.n}"


def main() -> int:
    torch.set_num_threads(1)
    start = time.perf_counter()
    clean: dict[str, Result] = {}
    extra_ok = True
    for name, case in EXTRA_CASES.items():
        clean[name] = r = case.evaluate()
        try:
            r.check()
            print(f"{'passes':8s} clean {r}", flush=True)
        except AssertionError as e:
            extra_ok = False
            print(f"{'FAILS':8s} clean {e}", flush=True)
    caught = 0
    for m in MUTANTS:
        verdict, evidence = "SURVIVED", []
        for name in m.cases:
            case = ALL_CASES[name]
            if name not in clean:
                clean[name] = case.evaluate()
            base = clean[name]
            try:
                base.check()
            except AssertionError as e:
                evidence.append(f"{name}: the clean run fails, no evidence ({e})")
                continue
            try:
                with planted(m):
                    r = case.evaluate()
            except Exception as e:  # a crash is not a statistical rejection
                evidence.append(f"{name}: crashed ({type(e).__name__}: {e})")
                continue
            evidence.append(f"{name}: {_short(r)} (clean: {_short(base)})")
            if r.rejected:
                verdict = "caught"
                break
        caught += verdict == "caught"
        print(f"{verdict:8s} {m.name}: {m.what}", flush=True)
        for line in evidence:
            print(f"         {line}", flush=True)
    print(f"({time.perf_counter() - start:.0f} s)")
    print(f"mutants: {len(MUTANTS)} planted, {caught} caught")
    return 0 if extra_ok and caught == len(MUTANTS) else 1


if __name__ == "__main__":
    sys.exit(main())
