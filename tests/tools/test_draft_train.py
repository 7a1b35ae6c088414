"""Draft training: an interrupted run resumed from its checkpoint ends with exactly the weights of a run
that never stopped, a warm start (--init) begins from the given draft's weights and vocabulary, and the
bonus-coverage measure of draft_eval counts what it says."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from sglang_ssd.tools import draft_train
from sglang_ssd.tools.draft_eval import greedy_stats
from tests.model_paths import require_model

ROOT = Path(__file__).resolve().parents[2]
TARGET = ROOT / "models" / "target"


def _records(n: int, vocab: int = 49152, k: int = 4) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        answer = torch.randint(0, 300, (12,), generator=g)
        out.append({"prompt": torch.randint(0, 300, (6,), generator=g), "answer": answer,
                    "top_ids": torch.randint(0, 300, (12, k), generator=g).to(torch.int32),
                    "top_logits": torch.randn(12, k, generator=g).to(torch.float16)})  # fmt: skip
    return out


class Stop(Exception):
    pass


def _args(out: Path, resume: bool, *extra: str):
    return draft_train.parse_args(["--target", str(require_model(TARGET)), "--out", str(out), "--layers", "0",
                                   "--vocab", "512", "--steps", "6", "--batch", "2", "--val-every", "2",
                                   *(["--resume"] if resume else []), *extra])  # fmt: skip


def test_resumed_training_equals_an_uninterrupted_run(tmp_path, monkeypatch):
    records = _records(6)
    monkeypatch.setattr(draft_train, "load_records", lambda args: (records, records[:2]))
    straight = tmp_path / "straight.safetensors"
    draft_train.train(_args(straight, resume=False))

    resumed = tmp_path / "resumed.safetensors"
    real_step, calls = draft_train.train_step, []

    def dies_at_step_5(*a, **kw):
        calls.append(1)
        if len(calls) == 5:
            raise Stop
        return real_step(*a, **kw)

    monkeypatch.setattr(draft_train, "train_step", dies_at_step_5)
    with pytest.raises(Stop):
        draft_train.train(_args(resumed, resume=True))
    assert torch.load(draft_train.checkpoint_path(_args(resumed, True)), weights_only=False)["step"] == 4
    monkeypatch.setattr(draft_train, "train_step", real_step)
    report = draft_train.train(_args(resumed, resume=True))
    a, b = load_file(str(straight)), load_file(str(resumed))
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [v[0] for v in report["val_log"]] == [0, 2, 4, 6]  # step 0: the starting point


@pytest.mark.parametrize("freeze", ["head", ""])  # the head kept as target rows, or trained and shipped
def test_warm_start_begins_from_the_init_weights_and_vocabulary(tmp_path, monkeypatch, freeze):
    records = _records(6)
    monkeypatch.setattr(draft_train, "load_records", lambda args: (records, records[:2]))
    first = tmp_path / "first.safetensors"
    draft_train.train(_args(first, False, "--freeze", freeze))
    # One step at a vanishing learning rate: every bf16 weight must come back as the init file's.
    again = tmp_path / "again.safetensors"
    report = draft_train.train(_args(again, False, "--freeze", freeze, "--init", str(first), "--vocab", "256",
                                     "--steps", "1", "--lr", "1e-12"))  # fmt: skip
    a, b = load_file(str(first)), load_file(str(again))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert ("lm_head.weight" in a) == (freeze == "")
    assert report["init"] == str(first) and report["vocab"] == 512
    # From target copies instead, the same step gives other weights (the check above can fail).
    cold = tmp_path / "cold.safetensors"
    draft_train.train(_args(cold, False, "--freeze", freeze, "--steps", "1", "--lr", "1e-12"))
    c = load_file(str(cold))
    assert not all(torch.equal(a[k], c[k]) for k in a)
    with pytest.raises(ValueError, match="has layers"):
        draft_train.train(_args(tmp_path / "x.safetensors", False, "--init", str(first), "--layers", "1"))
    with pytest.raises(ValueError, match="other --freeze"):
        draft_train.train(_args(tmp_path / "y.safetensors", False, "--init", str(first),
                                "--freeze", "head,mlp" if freeze else "head"))
    with pytest.raises(ValueError, match="same file"):
        _args(first, False, "--init", str(first))


def test_warm_start_grows_the_draft_around_the_init_layers(tmp_path, monkeypatch):
    records = _records(6)
    monkeypatch.setattr(draft_train, "load_records", lambda args: (records, records[:2]))
    first = tmp_path / "first.safetensors"
    draft_train.train(_args(first, False, "--freeze", "", "--layers", "0,3"))
    # Target layer 1 goes between the file's two: its student layers 0 and 1 become 0 and 2.
    tiny = ("--freeze", "", "--layers", "0,1,3", "--steps", "1", "--lr", "1e-12")
    grown, cold = tmp_path / "grown.safetensors", tmp_path / "cold.safetensors"
    draft_train.train(_args(grown, False, *tiny, "--init", str(first)))
    draft_train.train(_args(cold, False, *tiny))
    a, g, c = load_file(str(first)), load_file(str(grown)), load_file(str(cold))
    moved = {"model.layers.0.": "model.layers.0.", "model.layers.1.": "model.layers.2."}
    for key, value in a.items():
        new_key = next((key.replace(old, to, 1) for old, to in moved.items() if key.startswith(old)), key)
        assert torch.equal(g[new_key], value), key
    # The added layer is the target copy a cold run starts from, its two output projections zeroed
    # (Adam's first step moves weights by about the learning rate, 1e-12: hence the tolerance).
    same = lambda k: torch.allclose(g[k].float(), c[k].float(), rtol=0, atol=1e-9)  # noqa: E731
    added = [k for k in g if k.startswith("model.layers.1.")]
    zeroed = [k for k in added if k.endswith(draft_train.ADDED_LAYER_OUTPUTS)]
    assert len(zeroed) == 2 and all(g[k].abs().max() <= 1e-9 for k in zeroed)
    assert all(same(k) for k in added if k not in zeroed)
    assert not all(same(k) for k in g if k.startswith("model.layers.2."))
    with pytest.raises(ValueError, match="in that order"):
        draft_train.train(_args(tmp_path / "x.safetensors", False, "--freeze", "", "--layers", "3,0",
                                "--init", str(first)))  # fmt: skip


def test_a_grown_draft_starts_where_its_init_draft_stands(tmp_path, monkeypatch):
    # An added layer is a residual no-op at step 0: validation before any step reads exactly what the
    # init draft reads on its own layers (a plain target copy in the stack would move it).
    records = _records(6)
    monkeypatch.setattr(draft_train, "load_records", lambda args: (records, records[:2]))
    first = tmp_path / "first.safetensors"
    draft_train.train(_args(first, False, "--freeze", "", "--layers", "0,3"))
    start = {}
    for layers in ("0,3", "0,1,2,3"):
        out = tmp_path / f"layers_{layers.replace(',', '_')}.safetensors"
        report = draft_train.train(_args(out, False, "--freeze", "", "--layers", layers, "--steps", "1",
                                         "--init", str(first)))  # fmt: skip
        start[layers] = report["val_log"][0]
    assert start["0,1,2,3"] == start["0,3"]


def test_warm_start_grows_the_head_after_the_init_rows(tmp_path, monkeypatch):
    from safetensors.torch import load_file as load
    records = _records(6)
    monkeypatch.setattr(draft_train, "load_records", lambda args: (records, records[:2]))
    first, grown = tmp_path / "first.safetensors", tmp_path / "grown.safetensors"
    draft_train.train(_args(first, False, "--freeze", ""))
    report = draft_train.train(_args(grown, False, "--freeze", "", "--init", str(first), "--vocab", "640",
                                     "--steps", "1", "--lr", "1e-12"))  # fmt: skip
    a, g = load_file(str(first)), load_file(str(grown))
    assert report["vocab"] == 640 and g["lm_head.weight"].shape[0] == 640
    ids_a, ids_g = a["draft_token_ids"].long(), g["draft_token_ids"].long()
    assert torch.equal(ids_g[:512], ids_a) and len(set(ids_g.tolist())) == 640
    assert torch.equal(g["lm_head.weight"][:512], a["lm_head.weight"])
    # The added rows start as the target's embedding rows of their tokens (Adam's 1e-12 step aside).
    emb = load(str(require_model(TARGET) / "model.safetensors"))["model.embed_tokens.weight"]
    added = emb[ids_g[512:]].to(torch.bfloat16).float()
    assert torch.allclose(g["lm_head.weight"][512:].float(), added, rtol=0, atol=1e-9)


def test_resume_refuses_a_checkpoint_of_another_vocabulary(tmp_path, monkeypatch):
    records = _records(6)
    monkeypatch.setattr(draft_train, "load_records", lambda args: (records, records[:2]))
    out = tmp_path / "run.safetensors"
    draft_train.train(_args(out, True, "--steps", "2"))  # leaves a checkpoint at step 2
    with pytest.raises(ValueError, match="another head vocabulary"):
        draft_train.train(_args(out, True, "--vocab", "256"))


class _FixedDraft:
    """A 'draft' whose logits are given: ranks the vocabulary 0 < 1 < 2 < ... by score."""

    def __init__(self, scores: torch.Tensor):
        self.scores = scores

    def __call__(self, input_ids):
        n = input_ids.shape[1]
        return type("Out", (), {"logits": self.scores[None, :n]})()


def test_bonus_coverage_counts_the_rank_of_the_target_token_after_a_miss():
    # 5 answer positions; the draft's order is 9, 8, 7, ... at every position.
    scores = torch.arange(10, dtype=torch.float32).repeat(8, 1)
    ref = {"prompt": torch.tensor([1, 2]), "answer": torch.tensor([9, 8, 7, 6, 0])}
    stats = greedy_stats(_FixedDraft(scores), [ref], ks=(2,), fanouts=(1, 2, 3))
    assert stats["alpha_per_token"] == pytest.approx(1 / 5)
    # Misses at ranks 1, 2, 3 and 9: F = 1 covers one of four, F = 2 two, F = 3 three.
    assert stats["bonus_coverage_F1"] == pytest.approx(1 / 4)
    assert stats["bonus_coverage_F2"] == pytest.approx(2 / 4)
    assert stats["bonus_coverage_F3"] == pytest.approx(3 / 4)


def test_the_data_flags_name_the_parts_loaded(monkeypatch):
    # --sharegpt-parts N and --sharegpt-later-parts M load parts 0..N-1 of the first turns and 0..M-1 of
    # the later turns, each under its own source (so its own cache and answer store), validation apart.
    loaded = []
    monkeypatch.setattr(draft_train, "build_dataset", lambda target, data, spec, *a, **k: loaded.append(spec) or [])
    args = draft_train.parse_args(["--target", "t", "--out", "o.safetensors", "--parts", "0", "--sharegpt-parts", "2",
                                   "--sharegpt-later-parts", "3", "--val-sharegpt", "16"])  # fmt: skip
    draft_train.load_records(args)
    got = [(s.source, s.part) for s in loaded]
    assert got == [("sharegpt", 0), ("sharegpt", 1), ("sharegpt-later", 0), ("sharegpt-later", 1),
                   ("sharegpt-later", 2), ("sharegpt-held-out", 0)]  # fmt: skip
    # ... or the later-turn parts named: a run from the shipped weights trains on the parts it has not seen
    loaded.clear()
    args = draft_train.parse_args(["--target", "t", "--out", "o.safetensors", "--parts", "0",
                                   "--sharegpt-later-parts", "8-9,11"])  # fmt: skip
    draft_train.load_records(args)
    assert [(s.source, s.part) for s in loaded] == [("sharegpt-later", 8), ("sharegpt-later", 9), ("sharegpt-later", 11)]
    with pytest.raises(SystemExit):  # argparse's one-line usage error
        draft_train.parse_args(["--target", "t", "--out", "o.safetensors", "--sharegpt-later-parts", "-1"])
    # The template parts follow --route like the ShareGPT ones (their cache and answer store are the
    # route's): the default route reads what `draft_data --source templates` writes.
    loaded.clear()
    draft_train.load_records(draft_train.parse_args(["--target", "t", "--out", "o.safetensors", "--parts", "1"]))
    assert [(s.source, s.part, s.route) for s in loaded] == [("templates", 0, "server")]
    loaded.clear()
    draft_train.load_records(draft_train.parse_args(["--target", "t", "--out", "o.safetensors", "--parts", "1",
                                                     "--route", "hf"]))  # fmt: skip
    assert [(s.source, s.part, s.route) for s in loaded] == [("templates", 0, "hf")]
    # The second template family has its own source, so its own cache and answer store.
    loaded.clear()
    draft_train.load_records(draft_train.parse_args(["--target", "t", "--out", "o.safetensors", "--parts", "0",
                                                     "--templates-b-parts", "0-1"]))  # fmt: skip
    assert [(s.source, s.part, s.route) for s in loaded] == [("templates-b", 0, "server"), ("templates-b", 1, "server")]
