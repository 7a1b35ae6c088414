"""The packaged prompt set and its bench_serving export."""

import json
import os
import random
import re
import sys
import types
from pathlib import Path

import pytest

from sglang_ssd.prompts import BENCH_PLACEHOLDER, KINDS, Prompt, export_bench_dataset, load_prompts
from tests.model_paths import require_model

TARGET = Path(__file__).resolve().parents[1] / "models" / "target"


def test_four_kinds_fifty_each():
    prompts = load_prompts()
    assert KINDS == ("chat", "math", "code", "feedback")
    assert len(prompts) == 200
    for kind in KINDS:
        assert len(load_prompts(kind)) == 50
        assert all(p.kind == kind for p in load_prompts(kind))


def test_ids_unique_and_well_formed():
    prompts = load_prompts()
    ids = [p.id for p in prompts]
    assert len(set(ids)) == len(ids)
    for p in prompts:
        assert re.fullmatch(rf"{p.kind}-\d{{3}}", p.id), p.id
    assert len({p.prompt for p in prompts}) == len(prompts)


def test_prompts_non_empty_and_sized():
    for p in load_prompts():
        assert isinstance(p, Prompt)
        assert 5 <= len(p.prompt.split()) <= 80, p.id


def test_answers_numeric_for_math_only():
    for p in load_prompts():
        if p.kind == "math":
            assert p.answer is not None and re.fullmatch(r"-?\d+(\.\d+)?", p.answer), p.id
        else:
            assert p.answer is None, p.id


def test_limit_and_bad_arguments():
    assert [p.id for p in load_prompts("code", limit=3)] == ["code-001", "code-002", "code-003"]
    assert load_prompts(limit=0) == []
    with pytest.raises(ValueError, match="kind"):
        load_prompts("poetry")
    with pytest.raises(ValueError, match="limit"):
        load_prompts(limit=-1)
    with pytest.raises(ValueError, match="kinds"):
        export_bench_dataset("unused.jsonl", kinds=["poetry"])


def test_export_round_trips(tmp_path):
    out = tmp_path / "bench.jsonl"
    n = export_bench_dataset(out, kinds=["math", "chat"], limit_per_kind=4)
    assert n == 8
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    expected = load_prompts("math", 4) + load_prompts("chat", 4)
    assert [r["id"] for r in rows] == [p.id for p in expected]
    for r, p in zip(rows, expected, strict=True):
        user, assistant = r["conversations"]
        assert user == {"role": "user", "content": p.prompt}
        assert assistant["content"] == (p.answer if p.answer is not None else BENCH_PLACEHOLDER)


def _custom_loader():
    """bench_serving's custom-dataset loader, even without the HF `datasets` package.

    The `sglang.benchmark.datasets` package __init__ imports every dataset module and
    some of them need `datasets`; the custom loader itself does not, so when that
    import fails the package is registered bare and the real module is imported.
    """
    pytest.importorskip("sglang")
    pytest.importorskip("transformers")
    try:
        from sglang.benchmark.datasets.custom import sample_custom_requests
    except ModuleNotFoundError:
        import sglang.benchmark as bench

        for name in [m for m in sys.modules if m.startswith("sglang.benchmark.datasets")]:
            del sys.modules[name]
        pkg = types.ModuleType("sglang.benchmark.datasets")
        pkg.__path__ = [os.path.join(bench.__path__[0], "datasets")]
        sys.modules["sglang.benchmark.datasets"] = pkg
        from sglang.benchmark.datasets.custom import sample_custom_requests
    return sample_custom_requests


def test_export_parses_with_bench_serving_loader(tmp_path):
    require_model(TARGET, "tokenizer.json")
    from transformers import AutoTokenizer

    sample_custom_requests = _custom_loader()
    tokenizer = AutoTokenizer.from_pretrained(str(TARGET))
    out = tmp_path / "bench.jsonl"
    n = export_bench_dataset(out)
    random.seed(0)
    rows = sample_custom_requests(
        dataset_path=str(out),
        num_requests=n,
        tokenizer=tokenizer,
        fixed_output_len=64,
        apply_chat_template=True,
    )
    assert len(rows) == n == 200
    by_text = {p.prompt: p for p in load_prompts()}
    for row in rows:
        assert row.output_len == 64
        assert row.prompt_len == len(tokenizer.encode(row.prompt))
        matches = [t for t in by_text if t in row.prompt]
        assert matches, row.prompt[:80]
