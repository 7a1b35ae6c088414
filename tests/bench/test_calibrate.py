"""bench/calibrate.py times the transformers forward with the served attention (the C kernel over a
paged pool): it must compute what SDPA computes, after a prefill and across crops of the cache."""

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.calibrate import served_attention  # noqa: E402
from sglang_ssd.cpu import clib  # noqa: E402
from sglang_ssd.tools.random_model import write_random_model  # noqa: E402

pytestmark = pytest.mark.skipif(clib.attention_kernel() is None, reason="C kernels are off (torch route)")


def test_served_attention_matches_sdpa_through_verify_and_crop(tmp_path):
    from transformers import AutoModelForCausalLM, DynamicCache

    write_random_model(tmp_path, num_layers=2, num_heads=4, num_kv_heads=2, hidden_size=64)
    ref = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    model = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    batch, context, n = 2, 23, 5
    attn = served_attention(model, batch, context + n)
    assert attn is not None and model.config._attn_implementation == attn.NAME
    g = torch.Generator().manual_seed(0)
    ctx = torch.randint(0, 256, (batch, context), generator=g)
    new = torch.randint(0, 256, (batch, n), generator=g)
    caches = {"ref": DynamicCache(config=ref.config), "served": DynamicCache(config=model.config)}
    with torch.inference_mode():
        for m, key in ((ref, "ref"), (model, "served")):
            m(input_ids=ctx, past_key_values=caches[key], use_cache=True)
        for width in (n, 1, 3):  # verify, crop, verify again over the same positions
            pos = torch.arange(context, context + width).expand(batch, width)
            a = ref(input_ids=new[:, :width], past_key_values=caches["ref"], position_ids=pos).logits
            calls = []
            original = attn.fn
            attn.fn = lambda *args, calls=calls, original=original: calls.append(1) or original(*args)
            b = model(input_ids=new[:, :width], past_key_values=caches["served"], position_ids=pos).logits
            attn.fn = original
            assert len(calls) == 2  # one kernel call per layer: the kernel, not the SDPA fallback
            torch.testing.assert_close(b, a, atol=2e-5, rtol=1e-4)
            for c in caches.values():
                c.crop(-width)
