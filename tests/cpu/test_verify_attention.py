"""TARGET_VERIFY attention for SGLang's torch_native backend, against independent SDPA references.

The KV pool below is a minimal row store (the torch_native path only calls `set_kv_buffer`,
`get_key_buffer` and `get_value_buffer`), with every request's tokens scattered over its slots
and every slot that should not be read filled with large noise. References are computed without
the pool: (a) chains = plain causal attention over the request's whole sequence (prefix + drafts);
(b) trees = for each draft, causal attention over the prefix and its own ancestor path.

The checks that need SGLang itself (its `KVWriteLoc`, the installed backend file, the source patch
in `patches/`, the hook registry) run in one child with `SGLANG_USE_CPU_ENGINE=1`: SGLang's modules
only import there.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.nn.functional import scaled_dot_product_attention

from sglang_ssd.cpu import clib
from sglang_ssd.cpu import verify_attention as va

ROOT = Path(__file__).resolve().parents[2]
PATCH = ROOT / "patches" / "0001-torch-native-target-verify.patch"
BACKEND_REL = Path("sglang/srt/layers/attention/torch_native_backend.py")

Q_HEADS, KV_HEADS, HEAD_DIM = 4, 2, 8
SCALING = 0.37  # not 1/sqrt(HEAD_DIM): a backend that ignored layer.scaling would differ
PREFIX_LENS = [3, 7, 12]
SLOTS = 80
NOISE = 1e3

#      0          draft tree used in the tree cases (index order is breadth-first)
#    /   \
#   1     2
#   |    / \
#   3   4   5
TREE_PARENT = [-1, 0, 0, 1, 2, 2]


class RowPool:
    """KV pool with one [slots, kv_heads, head_dim] K and V buffer per layer."""

    def __init__(self, layers: int, gen: torch.Generator):
        shape = (SLOTS, KV_HEADS, HEAD_DIM)
        self.k = [NOISE * torch.randn(shape, generator=gen) for _ in range(layers)]
        self.v = [NOISE * torch.randn(shape, generator=gen) for _ in range(layers)]

    def set_kv_buffer(self, layer, loc, cache_k, cache_v, *args, **kwargs):
        loc = getattr(loc, "loc", loc).to(torch.int64)  # SGLang passes a KVWriteLoc
        self.k[layer.layer_id][loc] = cache_k.reshape(-1, KV_HEADS, HEAD_DIM)
        self.v[layer.layer_id][loc] = cache_v.reshape(-1, KV_HEADS, HEAD_DIM)

    def get_key_buffer(self, layer_id: int) -> torch.Tensor:
        return self.k[layer_id]

    def get_value_buffer(self, layer_id: int) -> torch.Tensor:
        return self.v[layer_id]


def ancestor_mask(parents: list[int]) -> torch.Tensor:
    """[n, n] bool: row i marks i's ancestors and i itself."""
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, j] = True
            j = parents[j]
    return mask


def make_case(n: int, seed: int = 0, custom_mask=None, tree_topk: int = -1, layer_id: int = 1):
    """A verify batch of len(PREFIX_LENS) requests with n drafts each.

    Returns (backend, q, k, v, layer, forward_batch, seqs) where seqs[b] = (q_full, k_full, v_full),
    the request's whole sequence ([s + n, heads, head_dim] each) for the references.
    """
    gen = torch.Generator().manual_seed(seed)
    pool = RowPool(layers=2, gen=gen)
    rows = [2, 0, 3]  # req_pool_indices: table rows out of order
    req_to_token = torch.full((5, 32), -1, dtype=torch.int32)
    free = torch.randperm(SLOTS, generator=gen).tolist()
    seqs, out_cache_loc = [], []
    for s, row in zip(PREFIX_LENS, rows):
        slots = [free.pop() for _ in range(s + n)]
        req_to_token[row, : s + n] = torch.tensor(slots, dtype=torch.int32)
        q_full = torch.randn(s + n, Q_HEADS, HEAD_DIM, generator=gen)
        k_full = torch.randn(s + n, KV_HEADS, HEAD_DIM, generator=gen)
        v_full = torch.randn(s + n, KV_HEADS, HEAD_DIM, generator=gen)
        pool.k[layer_id][slots[:s]] = k_full[:s]  # the committed prefix is already cached
        pool.v[layer_id][slots[:s]] = v_full[:s]
        seqs.append((q_full, k_full, v_full))
        out_cache_loc += slots[s:]
    q = torch.cat([qf[s:] for (qf, _, _), s in zip(seqs, PREFIX_LENS)]).reshape(-1, Q_HEADS * HEAD_DIM)
    k = torch.cat([kf[s:] for (_, kf, _), s in zip(seqs, PREFIX_LENS)]).reshape(-1, KV_HEADS * HEAD_DIM)
    v = torch.cat([vf[s:] for (_, _, vf), s in zip(seqs, PREFIX_LENS)]).reshape(-1, KV_HEADS * HEAD_DIM)
    backend = SimpleNamespace(
        token_to_kv_pool=pool, req_to_token_pool=SimpleNamespace(req_to_token=req_to_token)
    )
    layer = SimpleNamespace(
        tp_q_head_num=Q_HEADS,
        tp_k_head_num=KV_HEADS,
        qk_head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM,
        scaling=SCALING,
        layer_id=layer_id,
    )
    forward_batch = SimpleNamespace(
        forward_mode=SimpleNamespace(is_target_verify=lambda: True),
        out_cache_loc=torch.tensor(out_cache_loc, dtype=torch.int64),
        seq_lens=torch.tensor(PREFIX_LENS),
        req_pool_indices=torch.tensor(rows),
        spec_info=SimpleNamespace(draft_token_num=n, custom_mask=custom_mask, tree_topk=tree_topk),
    )
    return backend, q, k, v, layer, forward_batch, seqs


def write_drafts(backend, k, v, layer, forward_batch) -> None:
    """What save_kv_cache=True does, for the in-process calls that cannot import SGLang."""
    backend.token_to_kv_pool.set_kv_buffer(layer, forward_batch.out_cache_loc, k, v)


def sdpa(q, k, v, causal: bool) -> torch.Tensor:
    """q [Lq, H, d], k/v [Lk, KVH, d] -> [Lq, H, d]; GQA by repeating each KV head for its Q heads."""
    groups = Q_HEADS // KV_HEADS
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    out = scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=causal, scale=SCALING
    )
    return out.transpose(0, 1)


def chain_reference(seqs, n: int) -> torch.Tensor:
    outs = [sdpa(qf, kf, vf, causal=True)[-n:] for qf, kf, vf in seqs]
    return torch.cat(outs).reshape(-1, Q_HEADS * HEAD_DIM)


def tree_reference(seqs, parents: list[int]) -> torch.Tensor:
    n, outs = len(parents), []
    for (qf, kf, vf), s in zip(seqs, PREFIX_LENS):
        for i in range(n):
            path, j = [], i
            while j >= 0:
                path.insert(0, s + j)
                j = parents[j]
            keep = list(range(s)) + path
            outs.append(sdpa(qf[s + i : s + i + 1], kf[keep], vf[keep], causal=False))
    return torch.cat(outs).reshape(-1, Q_HEADS * HEAD_DIM)


def compact_tree_mask(parents: list[int]) -> torch.Tensor:
    """NGRAM's layout on CPU: [bs * n * n] bool."""
    return ancestor_mask(parents).repeat(len(PREFIX_LENS), 1, 1).reshape(-1)


def full_width_tree_mask(parents: list[int]) -> torch.Tensor:
    """The GPU layout: per request, n rows of [ones(prefix) | ancestor mask], flattened."""
    n = len(parents)
    parts = [
        torch.cat([torch.ones(n, s, dtype=torch.bool), ancestor_mask(parents)], 1).reshape(-1)
        for s in PREFIX_LENS
    ]
    return torch.cat(parts)


def run_verify(case, save_kv_cache: bool = False) -> torch.Tensor:
    backend, q, k, v, layer, forward_batch, _ = case
    if not save_kv_cache:
        write_drafts(backend, k, v, layer, forward_batch)
    return va.verify_attention(backend, q, k, v, layer, forward_batch, save_kv_cache=save_kv_cache)


# ---------------------------------------------------------------- (a) chains


@pytest.mark.parametrize("mask_kind", ["none", "tril"])
def test_chain_equals_causal_attention_over_the_whole_sequence(mask_kind):
    n = 4
    custom = (
        None if mask_kind == "none" else torch.ones(n, n, dtype=torch.bool).tril().repeat(3, 1, 1).reshape(-1)
    )
    case = make_case(n, seed=1, custom_mask=custom)
    out = run_verify(case)
    assert out.shape == (3 * n, Q_HEADS * HEAD_DIM)
    torch.testing.assert_close(out, chain_reference(case[-1], n), atol=1e-5, rtol=1e-5)


def test_tree_topk_one_means_a_chain_whatever_the_mask():
    n = len(TREE_PARENT)
    case = make_case(n, seed=2, custom_mask=compact_tree_mask(TREE_PARENT), tree_topk=1)
    torch.testing.assert_close(run_verify(case), chain_reference(case[-1], n), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- (b) trees


@pytest.mark.parametrize("layout", [compact_tree_mask, full_width_tree_mask])
def test_tree_draft_attends_to_prefix_and_its_ancestor_path(layout):
    case = make_case(len(TREE_PARENT), seed=3, custom_mask=layout(TREE_PARENT))
    torch.testing.assert_close(run_verify(case), tree_reference(case[-1], TREE_PARENT), atol=1e-5, rtol=1e-5)


def test_tree_result_differs_from_the_chain_result():
    # guards the tree reference itself: on this tree a causal chain would attend to wrong tokens
    case = make_case(len(TREE_PARENT), seed=3, custom_mask=compact_tree_mask(TREE_PARENT))
    assert not torch.allclose(
        tree_reference(case[-1], TREE_PARENT), chain_reference(case[-1], len(TREE_PARENT))
    )


def test_verify_masks_reads_both_layouts_the_same():
    spec = SimpleNamespace(draft_token_num=len(TREE_PARENT), tree_topk=-1)
    spec.custom_mask = compact_tree_mask(TREE_PARENT)
    compact = va.verify_masks(spec, PREFIX_LENS, "cpu")
    spec.custom_mask = full_width_tree_mask(TREE_PARENT)
    full = va.verify_masks(spec, PREFIX_LENS, "cpu")
    assert len(compact) == len(full) == 3
    for a, b in zip(compact, full):
        assert torch.equal(a, ancestor_mask(TREE_PARENT)) and torch.equal(b, ancestor_mask(TREE_PARENT))


# ---------------------------------------------------------------- the AROUND hook's routing


def test_hook_routes_only_target_verify_batches():
    case = make_case(4, seed=4)
    backend, q, k, v, layer, forward_batch, seqs = case
    write_drafts(backend, k, v, layer, forward_batch)
    calls = []

    def original(*args, **kwargs):
        calls.append(args)
        return "original"

    out = va.forward_extend_hook(original, backend, q, k, v, layer, forward_batch, save_kv_cache=False)
    assert not calls
    torch.testing.assert_close(out, chain_reference(seqs, 4), atol=1e-5, rtol=1e-5)
    forward_batch.forward_mode = SimpleNamespace(is_target_verify=lambda: False)
    assert va.forward_extend_hook(original, backend, q, k, v, layer, forward_batch, False) == "original"
    assert calls == [(backend, q, k, v, layer, forward_batch, False)]


# ---------------------------------------------------------------- (c) the source patch


def installed_backend_file() -> Path:
    return Path(sysconfig.get_paths()["purelib"]) / BACKEND_REL


def apply_patch(tree: Path) -> Path:
    """Copies the installed backend file under `tree` and applies the patch there (-p2, like site-packages)."""
    target = tree / BACKEND_REL
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(installed_backend_file(), target)
    for extra in (["--dry-run"], []):
        proc = subprocess.run(
            ["patch", "-p2", "--batch", "--forward", *extra, "-d", str(tree), "-i", str(PATCH)],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        # clean = no hunk needed an offset or fuzz against the installed sglang
        assert "offset" not in proc.stdout and "fuzz" not in proc.stdout, proc.stdout
    return target


def test_patch_applies_cleanly_to_the_installed_sglang(tmp_path):
    if shutil.which("patch") is None:
        pytest.fail("the `patch` program is needed (apt-get install patch)")
    target = apply_patch(tmp_path)
    text = target.read_text()
    assert "def _forward_target_verify(" in text
    assert "if forward_batch.forward_mode.is_target_verify():" in text
    assert text != installed_backend_file().read_text()


def cpu_engine_checks(patched_file: str) -> None:
    """Run in a child with SGLANG_USE_CPU_ENGINE=1 (SGLang's modules import only there)."""
    from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from sglang.srt.plugins.hook_registry import HookRegistry

    spec = importlib.util.spec_from_file_location(
        "sglang_ssd_test_patched_torch_native_backend", patched_file
    )
    patched = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(patched)

    cases = {
        "chain": (4, None, lambda seqs: chain_reference(seqs, 4)),
        "tree": (6, compact_tree_mask(TREE_PARENT), lambda seqs: tree_reference(seqs, TREE_PARENT)),
        "tree-full-width": (
            6,
            full_width_tree_mask(TREE_PARENT),
            lambda seqs: tree_reference(seqs, TREE_PARENT),
        ),
    }
    for name, (n, mask, reference) in cases.items():
        # the plugin path, writing the drafts' K/V itself through SGLang's KVWriteLoc
        print(f"{name}: checking", flush=True)
        backend, q, k, v, layer, fb, seqs = make_case(n, seed=5, custom_mask=mask)
        ours = va.verify_attention(backend, q, k, v, layer, fb, save_kv_cache=True)
        torch.testing.assert_close(ours, reference(seqs), atol=1e-5, rtol=1e-5)
        sdpa_form = va.torch_verify_attention(backend, q, layer, fb)  # what the patch computes
        pool = backend.token_to_kv_pool
        assert torch.equal(pool.k[layer.layer_id][fb.out_cache_loc], k.reshape(-1, KV_HEADS, HEAD_DIM)), name
        assert torch.equal(pool.v[layer.layer_id][fb.out_cache_loc], v.reshape(-1, KV_HEADS, HEAD_DIM)), name

        # the source patch, on a fresh copy of the same inputs (draft slots full of noise again)
        for method in ("_forward_target_verify", "forward_extend"):
            backend2, *_ = fresh = make_case(n, seed=5, custom_mask=mask)
            patched_backend = object.__new__(patched.TorchNativeAttnBackend)
            patched_backend.token_to_kv_pool = backend2.token_to_kv_pool
            patched_backend.req_to_token_pool = backend2.req_to_token_pool
            out = getattr(patched_backend, method)(*fresh[1:6], save_kv_cache=True)
            assert torch.equal(out, sdpa_form), (name, method)
            assert all(torch.equal(a, b) for a, b in zip(backend2.token_to_kv_pool.k, pool.k)), (name, method)
            assert all(torch.equal(a, b) for a, b in zip(backend2.token_to_kv_pool.v, pool.v)), (name, method)
        print(f"{name}: ok")

    # the hook as SGLang applies it, on the installed (unpatched) class
    va.register()
    va.register()  # idempotent
    assert sum(h is va.forward_extend_hook for _, h, _ in HookRegistry._hooks[va.TARGET]) == 1
    HookRegistry.apply_hooks()
    backend, q, k, v, layer, fb, seqs = make_case(6, seed=6, custom_mask=compact_tree_mask(TREE_PARENT))
    real = object.__new__(TorchNativeAttnBackend)
    real.token_to_kv_pool, real.req_to_token_pool = backend.token_to_kv_pool, backend.req_to_token_pool
    out = real.forward_extend(q, k, v, layer, fb)
    torch.testing.assert_close(out, tree_reference(seqs, TREE_PARENT), atol=1e-5, rtol=1e-5)
    print("hook: ok")

    # the decode hook (C attention), writing the token's K/V through SGLang's KVWriteLoc
    from sglang_ssd.cpu import sglang_attention as attention

    attention.register()
    HookRegistry.apply_hooks()
    backend, q, k, v, layer, fb, seqs = make_case(1, seed=7)
    fb.seq_lens = fb.seq_lens + 1  # a decode step's lengths count the new token
    real = object.__new__(TorchNativeAttnBackend)
    real.token_to_kv_pool, real.req_to_token_pool = backend.token_to_kv_pool, backend.req_to_token_pool
    layer.is_cross_attention, layer.sliding_window_size = False, -1
    fb.encoder_lens = None
    used, kernel_call = [], attention.paged_attention
    attention.paged_attention = lambda *a, **kw: used.append(1) or kernel_call(*a, **kw)
    out = real.forward_decode(q, k, v, layer, fb)
    attention.paged_attention = kernel_call
    assert used or os.environ.get("SGLANG_SSD_CPU_LINEAR") == "torch", "the decode hook did not take the kernel"
    torch.testing.assert_close(out, chain_reference(seqs, 1), atol=1e-5, rtol=1e-5)
    assert torch.equal(backend.token_to_kv_pool.k[layer.layer_id][fb.out_cache_loc], k.reshape(-1, KV_HEADS, HEAD_DIM))
    print("decode hook: ok")

    # the same hooks on SGLang's own fp32 pool take the compiled entry (KV write + attention in one
    # call) and give the bits of the ctypes path with SGLang's own KV write
    if clib.attention_entry() is not None:
        fused_pool_checks(real, layer)
        print("fused pool: ok")


def sglang_pool(rows: RowPool):
    """SGLang's MHATokenToKVPool on the CPU holding the same K/V as ``rows``."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    pool = MHATokenToKVPool(size=SLOTS - 1, page_size=1, dtype=torch.float32, head_num=KV_HEADS, head_dim=HEAD_DIM,
                            layer_num=len(rows.k), device="cpu", enable_memory_saver=False)  # fmt: skip
    for i, (k, v) in enumerate(zip(rows.k, rows.v)):
        pool.get_key_buffer(i).copy_(k)
        pool.get_value_buffer(i).copy_(v)
    return pool


def fused_pool_checks(real, layer) -> None:
    from sglang_ssd.cpu import sglang_attention as attention

    kernel_call, entry = attention.paged_attention, clib.attention_entry
    for name, n, mask, decode in (("decode", 1, None, True), ("chain", 4, None, False),
                                  ("tree", 6, compact_tree_mask(TREE_PARENT), False)):  # fmt: skip
        outs, pools = [], []
        for fused in (True, False):
            backend, q, k, v, layer, fb, _ = make_case(n, seed=8, custom_mask=mask)
            if decode:
                fb.seq_lens = fb.seq_lens + 1
            k, v = k.view(-1, KV_HEADS, HEAD_DIM), v.view(-1, KV_HEADS, HEAD_DIM)  # as RadixAttention hands them
            real.token_to_kv_pool, real.req_to_token_pool = sglang_pool(backend.token_to_kv_pool), backend.req_to_token_pool
            assert attention.plain_pool(real.token_to_kv_pool), "SGLang's fp32 pool not recognised as plain"
            used = []
            attention.paged_attention = lambda *a, used=used, **kw: used.append(1) or kernel_call(*a, **kw)
            clib.attention_entry = entry if fused else (lambda: None)
            try:
                step = real.forward_decode if decode else real.forward_extend
                outs.append(step(q, k, v, layer, fb))
            finally:
                attention.paged_attention, clib.attention_entry = kernel_call, entry
            assert bool(used) != fused, (name, fused, used)  # which path ran
            pool = real.token_to_kv_pool
            pools.append([pool.get_key_buffer(i).clone() for i in range(2)] + [pool.get_value_buffer(i).clone() for i in range(2)])
        assert torch.equal(outs[0], outs[1]), name
        assert all(torch.equal(a, b) for a, b in zip(*pools)), name


@pytest.mark.slow  # ~7 s of CPU: the child imports SGLang's attention and memory-pool modules
def test_patch_and_hook_match_verify_attention_in_sglang(tmp_path):
    patched = apply_patch(tmp_path)
    env = {**os.environ, "SGLANG_USE_CPU_ENGINE": "1", "OMP_NUM_THREADS": "1"}
    code = (
        "import sys, torch; torch.set_num_threads(1)\n"
        "from tests.cpu.test_verify_attention import cpu_engine_checks\n"
        "cpu_engine_checks(sys.argv[1])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, str(patched)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    names = ["chain", "tree", "tree-full-width", "hook", "decode hook"]
    if os.environ.get("SGLANG_SSD_CPU_LINEAR") != "torch":
        names.append("fused pool")
    for name in names:
        assert f"{name}: ok" in proc.stdout, proc.stdout
