"""README.md and bench/README.md stay short, current and free of lab-notebook numbering.

- README.md: at most 250 lines, a table row with `SSD/AR` in its first 60 lines, and the `--ssd-*` flag
  table equal to what `bench/readme_flags.py` generates from the settings' declarations;
- bench/README.md: at most 150 lines, with the fixed-form lines and blocks the benchmark scripts rewrite
  (`bench/calibrate.py`'s verify curve line, the soak and per-linear blocks) and the sweep's headline lines;
- neither (nor bench/NOTEBOOK.md) numbers sessions.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from bench.readme_flags import flag_table, readme_table

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
BENCH_README = ROOT / "bench" / "README.md"
NOTEBOOK = ROOT / "bench" / "NOTEBOOK.md"
SESSION = re.compile(r"\bsessions?[\s_-]*\d", re.IGNORECASE)


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines()


def script_constant(script: str, name: str) -> str:
    """A module-level string constant of a bench script, read without importing it (and torch)."""
    tree = ast.parse((ROOT / "bench" / script).read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"bench/{script} has no {name}")


def block(text: str, name: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    assert begin in text and end in text, f"bench/README.md lacks the {name} block the script rewrites"
    return text.split(begin, 1)[1].split(end, 1)[0].strip()


def test_readme_is_at_most_250_lines():
    assert len(lines(README)) <= 250, f"README.md has {len(lines(README))} lines; move detail to docs/"


def test_bench_readme_is_at_most_150_lines():
    n = len(lines(BENCH_README))
    assert n <= 150, f"bench/README.md has {n} lines; history goes to bench/NOTEBOOK.md"


def test_no_session_numbering():
    for path in (README, BENCH_README, NOTEBOOK):
        hits = [f"{i}: {s.strip()}" for i, s in enumerate(lines(path), 1) if SESSION.search(s)]
        assert not hits, f"{path} numbers sessions (use dates and topics): {hits[:3]}"


def test_headline_row_with_ssd_over_ar_on_the_first_screen():
    rows = [s for s in lines(README)[:60] if s.lstrip().startswith("|") and "SSD/AR" in s]
    assert rows, "README.md's first 60 lines hold no table row with SSD/AR"


def test_flag_table_is_generated_from_the_settings():
    table = readme_table(README)
    assert table is not None, "README.md lacks the <!-- flags:begin --> / <!-- flags:end --> markers"
    assert table == flag_table(), "README.md's flag table is stale: run python bench/readme_flags.py"


def test_fixed_form_lines_the_scripts_rewrite_are_on_the_results_page():
    body = lines(BENCH_README)
    prefix = script_constant("calibrate.py", "CURVE_PREFIX")
    assert sum(s.startswith(prefix) for s in body) == 1, f"bench/README.md needs one line starting {prefix!r}"
    stripped = [s.strip() for s in body]
    for start in ("SSD/AR = ", "SSD/SD = ", "defaults: ", "step overhead: ", "draft tree step on GPU: "):
        assert any(s.startswith(start) for s in stripped), f"bench/README.md lacks its {start.strip()!r} line"
    ssd_sd = next(s for s in stripped if s.startswith("SSD/SD = "))
    assert re.fullmatch(r"SSD/SD = \d+\.\d\d \(bound \d+\.\d\d, \d+ %\)", ssd_sd), ssd_sd
    # the first `SSD/AR = x` line is the current headline, not a defaults or per-point line
    first = next(s for s in stripped if "SSD/AR = " in s)
    assert re.fullmatch(r"SSD/AR = \d+\.\d\d", first), first


def test_blocks_the_scripts_rewrite_are_on_the_results_page():
    text = BENCH_README.read_text()
    for script, name in (("soak.py", "soak"), ("linear_microbench.py", "linear-microbench")):
        assert f'write_block("{name}"' in (ROOT / "bench" / script).read_text(), f"bench/{script} no longer writes {name}"
        block(text, name)
    assert block(text, "soak").startswith("soak: "), "the soak block must open with its fixed-form soak: line"
