"""The per-part forward timers (sglang_ssd/target/module_timers.py): what they wrap, what they count."""

from __future__ import annotations

import torch
from torch import nn

from sglang_ssd.target import module_timers


class Part(nn.Module):
    def forward(self, x):
        return x + 1


class Attention(nn.Module):
    def __init__(self, rope):
        super().__init__()
        self.qkv_proj, self.attn, self.o_proj, self.rotary_emb = Part(), Part(), Part(), rope

    def forward(self, x):
        return self.o_proj(self.attn(self.rotary_emb(self.qkv_proj(x))))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_up_proj, self.act_fn, self.down_proj = Part(), Part(), Part()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_up_proj(x)))


class Layer(nn.Module):
    def __init__(self, rope):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = Part(), Part()
        self.self_attn, self.mlp = Attention(rope), MLP()

    def forward(self, x):
        return self.mlp(self.post_attention_layernorm(self.self_attn(self.input_layernorm(x))))


class Stack(nn.Module):
    def __init__(self, n):
        super().__init__()
        rope = Part()  # one rotary embedding shared by every layer, as in SGLang's Llama
        self.layers = nn.ModuleList(Layer(rope) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


class Model(nn.Module):
    def __init__(self, n=3):
        super().__init__()
        self.model, self.logits_processor = Stack(n), Part()

    def forward(self, x):
        return self.logits_processor(self.model(x))


def test_every_part_is_timed_per_width_and_a_shared_module_once():
    model = Model(3)
    want = model(torch.zeros(2))
    timers = module_timers.ModuleTimers(model)
    timers.width = 5
    assert torch.equal(model(torch.zeros(2)), want)  # the wrappers change nothing
    timers.width = 1
    model(torch.zeros(2))
    model(torch.zeros(2))
    snap = timers.snapshot()
    calls = snap["ssd_module_calls"]
    assert calls["model@5"] == 1 and calls["model@1"] == 2 and calls["layers@1"] == 2 and calls["logits@1"] == 2
    for part in ("layer", "norm_in", "self_attn", "qkv", "attention", "o", "norm_post", "mlp", "gate_up", "act", "down"):
        assert calls[f"{part}@5"] == 3 and calls[f"{part}@1"] == 6, part
    assert calls["rope@5"] == 3  # wrapped once: three layers, three calls, not nine
    assert set(snap["ssd_module_s"]) == set(calls) and all(s >= 0 for s in snap["ssd_module_s"].values())
    assert snap["ssd_module_s"]["model@1"] >= snap["ssd_module_s"]["layers@1"] >= snap["ssd_module_s"]["layer@1"]


def test_parts_a_model_lacks_are_skipped():
    model = Model(1)
    del model.model.layers[0].mlp.act_fn
    model.model.layers[0].mlp.forward = lambda x: x
    timers = module_timers.ModuleTimers(model)
    model(torch.zeros(1))
    assert "act@0" not in timers.snapshot()["ssd_module_calls"]
    assert timers.snapshot()["ssd_module_calls"]["layer@0"] == 1


def test_off_unless_the_variable_is_one(monkeypatch):
    for value, on in ((None, False), ("0", False), ("", False), ("1", True), (" 1 ", True)):
        if value is None:
            monkeypatch.delenv(module_timers.ENV, raising=False)
        else:
            monkeypatch.setenv(module_timers.ENV, value)
        assert module_timers.enabled() is on, value
