"""Draft data: training on what is cached so far reads exactly the cached batches and generates nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from sglang_ssd.tools import draft_data
from sglang_ssd.tools.draft_data import DataSpec, build_dataset
from tests.model_paths import require_model

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "models" / "target"


def _record(i: int) -> dict:
    return {"prompt": torch.tensor([1, 2, i]), "answer": torch.tensor([i, 2]), "top_ids": torch.zeros(2, 1),
            "top_logits": torch.zeros(2, 1)}  # fmt: skip


def test_cached_only_reads_the_cached_batches_and_generates_nothing(tmp_path, monkeypatch):
    spec = DataSpec(n_greedy=4, n_sampled=4, batch=2, source="templates", route="server")
    tag = f"srv_g4_s4_t{spec.temperature}_n{spec.max_new}_k{spec.top_k}_b2_seed0"
    for bi in (0, 2):  # batches 1 and 3 are not there yet (a generator still running)
        torch.save([_record(10 * bi), _record(10 * bi + 1)], tmp_path / f"{tag}_batch_{bi:04d}.pt")

    def no_server(*a, **kw):
        raise AssertionError("cached_only must not start a server")

    monkeypatch.setattr(draft_data, "_start_server", no_server)
    records = build_dataset(require_model(TARGET), tmp_path, spec, cached_only=True)
    assert [int(r["prompt"][-1]) for r in records] == [0, 1, 20, 21]
    with pytest.raises(AssertionError, match="must not start"):
        build_dataset(TARGET, tmp_path, spec)  # without it, the missing batch 1 is generated


@pytest.fixture(scope="module")
def target():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = require_model(TARGET)
    tok = AutoTokenizer.from_pretrained(str(path))
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval(), tok


def test_stored_answers_rebuild_the_generated_records(tmp_path, target):
    """A batch that reaches the answer store comes back from it (another checkout: no cache) with the
    same answers and, by teacher forcing, the top-k logits generation recorded (float rounding aside)."""
    from sglang_ssd.prompts import chat_ids

    model, tok = target
    prompts = [chat_ids(tok, "Name three colours."), chat_ids(tok, "What is 2 + 3? Answer briefly.")]
    recs = draft_data.generate_batch(model, prompts, 8, 0.0, 4, tok.eos_token_id, tok.pad_token_id)
    for r in recs:
        r["temperature"] = 0.0
    draft_data.AnswerStore(tmp_path / "part.npz").add(3, recs)

    store = draft_data.AnswerStore(tmp_path / "part.npz")
    assert list(store.batches) == [3]
    rebuilt = store.rebuild(3, prompts, model, 4, tok.pad_token_id)
    for r, g in zip(rebuilt, recs):
        assert r["answer"].tolist() == g["answer"].tolist()
        assert r["top_ids"][:, 0].tolist() == g["answer"].tolist()  # greedy: the answer is the argmax
        torch.testing.assert_close(r["top_logits"].float(), g["top_logits"].float(), atol=0.02, rtol=0)
    with pytest.raises(ValueError, match="prompts differ"):
        store.rebuild(3, [prompts[1], prompts[0]], model, 4, tok.pad_token_id)


def test_a_batch_in_the_store_is_rebuilt_not_generated(tmp_path, monkeypatch, target):
    """build_dataset: a batch missing from the cache but in the answer store is rebuilt (no server, even
    with cached_only), written to the cache, and the store keeps one entry per batch."""
    model, tok = target
    spec = DataSpec(n_greedy=2, n_sampled=0, batch=2, max_new=4, top_k=4, source="templates", route="server")

    def fake_server(*a, **kw):
        class Server:
            def post(self, path, payload, timeout):
                return [{"output_ids": [tok.eos_token_id], "meta_info": {"output_top_logprobs": [[[0.0, 1]] * 4]}}
                        for _ in payload["input_ids"]]  # fmt: skip

            def stop(self):
                pass

        return Server()

    monkeypatch.setattr(draft_data, "_start_server", fake_server)
    first = build_dataset(require_model(TARGET), tmp_path / "cache", spec, answers_dir=tmp_path / "answers")
    (stored,) = (tmp_path / "answers").glob("*.npz")

    def no_server(*a, **kw):
        raise AssertionError("a stored batch must not be generated again")

    monkeypatch.setattr(draft_data, "_start_server", no_server)
    again = build_dataset(TARGET, tmp_path / "other_cache", spec, cached_only=True, answers_dir=tmp_path / "answers")
    assert [r["answer"].tolist() for r in again] == [r["answer"].tolist() for r in first]
    assert all(r.get("rebuilt") for r in again) and len(list((tmp_path / "other_cache").glob("*.pt"))) == 1
    assert list(draft_data.AnswerStore(stored).batches) == [0]


DRAFT = ROOT / "models" / "draft"


def test_on_policy_records_hold_the_drafts_answers_and_the_targets_scores(tmp_path, monkeypatch, target):
    """An on-policy batch: the answer is the draft's own greedy continuation, every position carries the
    target's top-k at the position that predicts it (one plain forward of the target over prompt +
    answer agrees), the tag names the draft, and another checkout rebuilds the batch from the store."""
    from sglang_ssd.tools.draft_model import load_draft

    model, tok = target
    draft = require_model(DRAFT)
    spec = DataSpec(n_greedy=2, n_sampled=0, batch=2, max_new=6, top_k=4, source="templates", answerer=str(draft))
    monkeypatch.setattr(draft_data, "_start_server", lambda *a, **kw: pytest.fail("on-policy data needs no server"))
    recs = build_dataset(require_model(TARGET), tmp_path / "cache", spec, answers_dir=tmp_path / "answers")
    (stored,) = (tmp_path / "answers").glob("*.npz")
    assert f"_by{draft_data.answerer_digest(str(draft))}" in stored.name and not stored.name.startswith("srv_")
    drafter = load_draft(draft)
    with torch.no_grad():
        for r in recs:
            seq = torch.cat([r["prompt"], r["answer"]])[None]
            p = len(r["prompt"])
            d_next = drafter(input_ids=seq).logits[0, p - 1 : -1].argmax(-1)
            t_top = model(input_ids=seq).logits[0, p - 1 : -1].topk(4, dim=-1).indices
            assert r["answer"].tolist() == d_next.tolist()  # greedy: the draft's own argmax
            assert r["top_ids"][:, 0].long().tolist() == t_top[:, 0].tolist()  # scored by the target
            assert set(r["top_ids"][-1].tolist()) == set(t_top[-1].tolist())
    again = build_dataset(TARGET, tmp_path / "other_cache", spec, cached_only=True, answers_dir=tmp_path / "answers")
    assert [r["answer"].tolist() for r in again] == [r["answer"].tolist() for r in recs]
    assert all(r.get("rebuilt") for r in again)


def test_parts_are_read_as_lists_and_ranges():
    assert draft_data.parse_parts("0") == [0] and draft_data.parse_parts("") == []
    assert draft_data.parse_parts("8-9,12") == [8, 9, 12]
    with pytest.raises(ValueError, match="parts must look like"):
        draft_data.parse_parts("9-8")
