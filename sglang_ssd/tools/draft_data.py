"""Distillation data for the draft: target-generated answers with the target's top-k logits.

Each training prompt goes through the target's chat template; the target answers it (greedy, or sampled
at T = 0.7), batched with left padding and a KV cache, and at every generated position the target's
top-k raw logits (the distribution that produced that token) are stored. Batches are cached as
`<cache>/batch_<i>.pt`, so an interrupted run resumes where it stopped; a batch depends only on its
index and the seed, so the data are the same whatever was cached before.

Per sequence the cache holds: `prompt` (int64 [P], chat-templated prompt ids), `answer` (int64 [N],
generated ids, ending with EOS unless cut at `max_new`), `top_ids` (int32 [N, k]) and `top_logits`
(float16 [N, k]): the target's k largest logits at the position that predicts `answer[i]`.

On-policy data (`DataSpec.answerer`): a draft folder answers the prompts instead of the target, and one
teacher-forced forward of the target scores every position of the draft's answer. Training on them
teaches the draft the target's distribution where the draft's own proposals lead, which is where it is
verified (DistillSpec's on-policy data); the cache tag names the answering draft's weights.

The cache (top-k logits: ~200 bytes a token) lives outside git and does not outlive a checkout. What
costs the hours, the answers themselves, is also kept in a small committed store (`data/draft_answers/`,
uint16 ids, about 1 byte a token compressed, one `.npz` per data part; `AnswerStore`). A batch missing from the cache but present
in the store is rebuilt from it by one teacher-forced forward of the target per sequence: the same
top-k up to float rounding, for about 0.5-0.6 of the cost of generating it again
(`bench/datagen_rebuild.py`; numbers in docs/DRAFT_TRAINING.md).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from sglang_ssd.prompts import chat_ids
from sglang_ssd.tools.draft_prompts import training_prompts, training_prompts_b

# the ShareGPT split part (sglang_ssd/sharegpt.py) and the cache/answer-store prefix of each source
SHAREGPT_PARTS = {"sharegpt": "train", "sharegpt-held-out": "held_out", "sharegpt-later": "train_later"}
PREFIXES = {"templates": "", "templates-b": "tmplb_", "sharegpt": "sharegpt_", "sharegpt-held-out": "sharegpt_held_out_",
            "sharegpt-later": "sharegpt_later_"}
SOURCES = tuple(PREFIXES)


def source_prompts(spec: DataSpec) -> list[str]:
    """The n_greedy + n_sampled prompt texts of ``spec``'s part, from one fixed stream per source."""
    n = spec.n_greedy + spec.n_sampled
    family = {"templates": training_prompts, "templates-b": training_prompts_b}.get(spec.source)
    if family is not None:
        return [p for _, p in family(n * (spec.part + 1), seed=spec.seed)[n * spec.part:]]
    from sglang_ssd.sharegpt import load_sharegpt

    stream = load_sharegpt(SHAREGPT_PARTS[spec.source])
    if n * (spec.part + 1) > len(stream):
        raise ValueError(f"ShareGPT part {spec.part} of {n} prompts runs past the {len(stream)} prompts of its split")
    return [p.prompt for p in stream[n * spec.part: n * (spec.part + 1)]]


@dataclass(frozen=True)
class DataSpec:
    """What to generate. `n_greedy` + `n_sampled` prompts, answered in batches of `batch` prompts.
    Part p takes the p-th block of n_greedy + n_sampled prompts of one deterministic prompt stream, so
    parts never share a prompt and adding a part leaves the cached ones valid."""

    n_greedy: int = 400
    n_sampled: int = 112
    # "templates" (draft_prompts.py), "sharegpt" (the train part of sglang_ssd/sharegpt.py's fixed split),
    # "sharegpt-later" (its later turns, training only) or "sharegpt-held-out" (its held-out part: for
    # validation and evaluation only)
    source: str = "templates"
    temperature: float = 0.7
    max_new: int = 128
    top_k: int = 32
    batch: int = 32
    seed: int = 0
    part: int = 0
    route: str = "hf"  # "hf": the batched transformers loop; "server": an AR SGLang server (3x faster here)
    max_prompt: int = 512  # prompt tokens kept (the end of a longer prompt: the question sits there)
    answerer: str = ""  # a draft folder that answers instead of the target (on-policy data); "" = the target


@torch.inference_mode()
def generate_batch(model, prompts: list[list[int]], max_new: int, temperature: float, top_k: int,
                   eos_id: int, pad_id: int, generator: torch.Generator | None = None) -> list[dict]:
    """Answer a batch of prompts (token id lists) with the target; returns one record per prompt.

    temperature 0 ⇒ greedy. Left padding keeps each row's last prompt token at the same column; position
    ids count only real tokens so a padded row sees exactly what it would see alone.
    """
    if temperature < 0:
        raise ValueError(f"temperature must be ≥ 0, got {temperature}")
    b = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1)
    past = out.past_key_values
    logits = out.logits[:, -1].float()
    last_pos = pos[:, -1]
    done = torch.zeros(b, dtype=torch.bool)
    answers, tops_i, tops_v = [], [], []
    for _ in range(max_new):
        v, ix = logits.topk(top_k, dim=-1)
        if temperature == 0:
            nxt = logits.argmax(-1)
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator).squeeze(1)
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        answers.append(nxt)
        tops_i.append(ix.to(torch.int32))
        tops_v.append(v.to(torch.float16))
        done = done | (nxt == eos_id)
        if bool(done.all()):
            break
        mask = torch.cat([mask, torch.ones((b, 1), dtype=torch.long)], dim=1)
        last_pos = last_pos + 1
        out = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=last_pos[:, None],
                    past_key_values=past, use_cache=True)
        past = out.past_key_values
        logits = out.logits[:, -1].float()
    ans = torch.stack(answers, 1)
    ti = torch.stack(tops_i, 1)
    tv = torch.stack(tops_v, 1)
    records = []
    for i, p in enumerate(prompts):
        row = ans[i]
        ends = (row == eos_id).nonzero()
        n = int(ends[0]) + 1 if len(ends) else len(row)
        records.append({"prompt": torch.tensor(p, dtype=torch.long), "answer": row[:n].clone(),
                        "top_ids": ti[i, :n].clone(), "top_logits": tv[i, :n].clone()})
    return records


@torch.inference_mode()
def teacher_tops(model, prompts: list[list[int]], answers: list[list[int]], top_k: int, pad_id: int
                 ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(top_ids int32 [N, k], top_logits float16 [N, k]) per sequence: the target's k largest logits at
    each position that predicts an answer token, from one forward over prompt + answer (right padding:
    a causal model's earlier positions never see the pads)."""
    seqs = [p + a for p, a in zip(prompts, answers)]
    ids = torch.full((len(seqs), max(map(len, seqs))), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(seqs):
        ids[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), 1
    hidden = model.model(input_ids=ids, attention_mask=mask).last_hidden_state
    out = []
    for i, (p, a) in enumerate(zip(prompts, answers)):
        logits = model.lm_head(hidden[i, len(p) - 1 : len(p) - 1 + len(a)]).float()  # the head only where scored
        v, ix = logits.topk(top_k, dim=-1)
        out.append((ix.to(torch.int32), v.to(torch.float16)))
    return out


class AnswerStore:
    """The answers of one data part (its cache tag), committed: per record its batch, temperature,
    a CRC of its prompt ids (a changed prompt reader shows up as a mismatch, not as wrong data), and
    its answer ids as uint16. Rewritten whole after each new batch (a few MB at most)."""

    def __init__(self, path: Path):
        self.path = path
        self.batches: dict[int, list[tuple[float, int, list[int]]]] = {}
        if path.is_file():
            import numpy as np

            z = np.load(path)
            offsets = z["offsets"]
            for j, (bi, temp, crc) in enumerate(zip(z["batch"], z["temperature"], z["prompt_crc"])):
                answer = z["answers"][offsets[j] : offsets[j + 1]].astype(np.int64).tolist()
                self.batches.setdefault(int(bi), []).append((float(temp), int(crc), answer))

    @staticmethod
    def crc(prompt: list[int]) -> int:
        import zlib

        return zlib.crc32(torch.tensor(prompt, dtype=torch.int64).numpy().tobytes())

    def add(self, bi: int, records: list[dict]) -> None:
        answers = [r["answer"].tolist() for r in records]
        if any(t < 0 or t >= 1 << 16 for a in answers for t in a):
            raise ValueError("answer ids must fit in uint16 for the answer store")
        self.batches[bi] = [(float(r["temperature"]), self.crc(r["prompt"].tolist()), a)
                            for r, a in zip(records, answers)]  # fmt: skip
        self._write()

    def _write(self) -> None:
        import numpy as np

        rows = [(bi, *row) for bi in sorted(self.batches) for row in self.batches[bi]]
        lengths = [len(r[3]) for r in rows]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "wb") as f:
            np.savez_compressed(
                f, batch=np.array([r[0] for r in rows], dtype=np.int32),
                temperature=np.array([r[1] for r in rows], dtype=np.float32),
                prompt_crc=np.array([r[2] for r in rows], dtype=np.uint32),
                offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                answers=np.array([t for r in rows for t in r[3]], dtype=np.uint16),
            )  # fmt: skip
        tmp.replace(self.path)

    def rebuild(self, bi: int, prompts: list[list[int]], model, top_k: int, pad_id: int) -> list[dict]:
        """Batch ``bi``'s records from its stored answers (``prompts``: its members' prompt ids)."""
        rows = self.batches[bi]
        if len(rows) != len(prompts) or any(crc != self.crc(p) for (_, crc, _), p in zip(rows, prompts)):
            raise ValueError(f"{self.path}: batch {bi}'s prompts differ from the ones it was generated for")
        tops = teacher_tops(model, prompts, [a for _, _, a in rows], top_k, pad_id)
        return [{"prompt": torch.tensor(p, dtype=torch.long), "answer": torch.tensor(a, dtype=torch.long),
                 "top_ids": ti, "top_logits": tv, "top_kind": "logit", "rebuilt": True}
                for p, (_, _, a), (ti, tv) in zip(prompts, rows, tops)]  # fmt: skip


def server_batch(server, prompts: list[list[int]], max_new: int, temperature: float, top_k: int, seed: int) -> list[dict]:
    """The records of ``generate_batch`` from an AR SGLang server, one batched request. ``top_logits``
    then holds the top-k log-probabilities: the logits shifted by one constant per position, so the
    distillation's softmax over the top k is the same."""
    params = {"temperature": temperature, "max_new_tokens": max_new}
    if temperature > 0:
        params["sampling_seed"] = seed
    # A generous timeout: on a shared, loaded machine one batch can take many minutes.
    outs = server.post("/generate", {"input_ids": prompts, "sampling_params": params, "return_logprob": True,
                                     "top_logprobs_num": top_k}, timeout=3600)  # fmt: skip
    records = []
    for p, out in zip(prompts, outs):
        answer = out["output_ids"]
        tops = out["meta_info"]["output_top_logprobs"][: len(answer)]
        records.append({"prompt": torch.tensor(p, dtype=torch.long), "answer": torch.tensor(answer, dtype=torch.long),
                        "top_ids": torch.tensor([[t[1] for t in row] for row in tops], dtype=torch.int32),
                        "top_logits": torch.tensor([[t[0] for t in row] for row in tops], dtype=torch.float16),
                        "top_kind": "logprob"})  # fmt: skip
    return records


def _start_server(target_dir: Path, batch: int, max_tokens: int):
    from sglang_ssd.tools.server_process import CPU_SERVER_ARGS, SGLangServer

    argv = ["--model-path", str(target_dir), *CPU_SERVER_ARGS, "--max-running-requests", str(batch)]
    argv[argv.index("--max-total-tokens") + 1] = str(batch * max_tokens)  # the whole batch at once
    return SGLangServer(argv).start()  # its log: /tmp/sglang_ssd_server_<port>.log


ANSWERS = Path("data/draft_answers")  # the committed answer store, relative to the repository root


def build_dataset(target_dir: Path, cache_dir: Path, spec: DataSpec, cached_only: bool = False,
                  answers_dir: Path | None = None) -> list[dict]:
    """Generate (or load from `cache_dir`, or rebuild from the answer store) the distillation records
    for `spec`; deterministic in spec. ``cached_only``: nothing generated (rebuilding from stored
    answers is not generating). ``answers_dir``: the answer store (None: not used)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglang_ssd.tools.draft_model import load_draft

    if spec.batch <= 0 or spec.max_new <= 0 or spec.top_k <= 0 or spec.max_prompt <= 0:
        raise ValueError(f"batch, max_new, top_k and max_prompt must be positive, got {spec}")
    if spec.source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {spec.source!r}")
    cache_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    prompts = source_prompts(spec)
    jobs = [(p, 0.0) for p in prompts[: spec.n_greedy]] + [(p, spec.temperature) for p in prompts[spec.n_greedy:]]
    # Similar lengths share a batch (less padding); the order is fixed by the spec, not by the cache.
    ids = [chat_ids(tokenizer, p)[-spec.max_prompt:] for p, _ in jobs]
    order = sorted(range(len(jobs)), key=lambda j: (jobs[j][1], len(ids[j]), j))
    batches = [order[i: i + spec.batch] for i in range(0, len(order), spec.batch)]
    if spec.route not in ("hf", "server"):
        raise ValueError(f"route must be 'hf' or 'server', got {spec.route!r}")
    prefix = ("srv_" if spec.route == "server" and not spec.answerer else "") + PREFIXES[spec.source]
    tag = prefix + f"g{spec.n_greedy}_s{spec.n_sampled}_t{spec.temperature}_n{spec.max_new}_k{spec.top_k}_b{spec.batch}_seed{spec.seed}" + (
        f"_p{spec.part}" if spec.part else "") + (f"_by{answerer_digest(spec.answerer)}" if spec.answerer else "")
    store = AnswerStore(answers_dir / f"{tag}.npz") if answers_dir is not None else None
    model = server = drafter = None
    records: list[dict] = []
    t0 = time.time()
    bar = tqdm(batches, desc="target answers", unit="batch")
    try:
        for bi, members in enumerate(bar):
            path = cache_dir / f"{tag}_batch_{bi:04d}.pt"
            if path.is_file():
                recs = torch.load(path)
            elif store is not None and bi in store.batches:
                if model is None:
                    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
                recs = store.rebuild(bi, [ids[j] for j in members], model, spec.top_k, tokenizer.pad_token_id)
                for r, j in zip(recs, members):
                    r["temperature"], r["prompt_text"] = jobs[j][1], jobs[j][0]
                _save(path, recs)
            elif cached_only:
                continue
            else:
                cpu0, wall0 = time.process_time(), time.time()
                temp = jobs[members[0]][1]
                batch_seed = spec.seed * 100_003 + spec.part * 1_000 + bi
                if spec.answerer:
                    drafter = drafter or load_draft(spec.answerer)
                    model = model or AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
                    recs = on_policy_batch(drafter, model, [ids[j] for j in members], spec, temp, batch_seed,
                                           tokenizer.eos_token_id, tokenizer.pad_token_id)  # fmt: skip
                elif spec.route == "server":
                    server = server or _start_server(target_dir, spec.batch, spec.max_prompt + spec.max_new)
                    recs = server_batch(server, [ids[j] for j in members], spec.max_new, temp, spec.top_k, batch_seed)
                else:
                    if model is None:
                        model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
                    gen = torch.Generator().manual_seed(batch_seed)
                    recs = generate_batch(model, [ids[j] for j in members], spec.max_new, temp, spec.top_k,
                                          tokenizer.eos_token_id, tokenizer.pad_token_id, gen)  # fmt: skip
                for r, j in zip(recs, members):
                    r["temperature"] = temp
                    r["prompt_text"] = jobs[j][0]
                    r["gen_cpu_s"] = (time.process_time() - cpu0) / len(recs)  # this batch's CPU, shared out
                    r["gen_wall_s"] = (time.time() - wall0) / len(recs)
                _save(path, recs)
            if store is not None and bi not in store.batches:
                store.add(bi, recs)
            records.extend(recs)
            n_tok = sum(len(r["answer"]) for r in records)
            bar.set_postfix(tokens=n_tok, tok_s=f"{n_tok / max(time.time() - t0, 1e-9):.0f}")
    finally:
        if server is not None:
            server.stop()
    return records


def answerer_digest(folder: str) -> str:
    """Eight hex digits naming a draft folder's weights (draft_build's stamp, else the file's hash)."""
    import json

    from sglang_ssd.tools.draft_build import STAMP, file_digest

    stamp = Path(folder) / STAMP
    if stamp.is_file():
        return json.loads(stamp.read_text())["weights_sha256"][:8]
    return file_digest(Path(folder) / "model.safetensors")[:8]


def on_policy_batch(drafter, target, prompts: list[list[int]], spec: DataSpec, temperature: float, seed: int,
                    eos_id: int, pad_id: int) -> list[dict]:
    """The draft's answers (greedy at temperature 0, else sampled), each position scored by the target:
    its top-k logits at the position that predicts the draft's token."""
    gen = torch.Generator().manual_seed(seed)
    recs = generate_batch(drafter, prompts, spec.max_new, temperature, spec.top_k, eos_id, pad_id, gen)
    tops = teacher_tops(target, prompts, [r["answer"].tolist() for r in recs], spec.top_k, pad_id)
    for r, (ti, tv) in zip(recs, tops):
        r.update(top_ids=ti, top_logits=tv, top_kind="logit")
    return recs


def _save(path: Path, records: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(records, tmp)
    tmp.rename(path)


def parse_parts(text: str) -> list[int]:
    """Part numbers from '0', '0-7', '0,2,5' or '' (none)."""
    parts: list[int] = []
    for item in filter(None, text.split(",")):
        lo, _, hi = item.partition("-")
        if not lo.isdigit() or not (hi or lo).isdigit() or int(hi or lo) < int(lo):
            raise ValueError(f"parts must look like '0', '0-7' or '0,2,5', got {text!r}")
        parts += list(range(int(lo), int(hi or lo) + 1))
    return parts


def main(argv: list[str] | None = None) -> int:
    """Generate (or finish generating) parts of the data ahead of training; prints the token count."""
    import argparse

    ap = argparse.ArgumentParser(description="Generate the draft's distillation data (resumable, cached)")
    ap.add_argument("--target", type=Path, default=Path("models/target"))
    ap.add_argument("--data", type=Path, default=Path("models/draft_data"))
    ap.add_argument("--answers", type=Path, default=ANSWERS, help="the committed answer store")
    ap.add_argument("--source", choices=SOURCES, default="sharegpt")
    ap.add_argument("--parts", default="0", help="part numbers: '0', '0-7' or '0,2,5'")
    ap.add_argument("--n-greedy", type=int, default=DataSpec.n_greedy)
    ap.add_argument("--n-sampled", type=int, default=DataSpec.n_sampled)
    ap.add_argument("--max-new", type=int, default=DataSpec.max_new)
    ap.add_argument("--batch", type=int, default=DataSpec.batch)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--route", choices=("hf", "server"), default="server",
                    help="server: an AR SGLang server answers each batch (bench/datagen_routes.py: 3x the hf loop)")
    ap.add_argument("--answerer", default="", help="a draft folder that answers instead of the target, the "
                    "target scoring its answers (on-policy data)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    total = 0
    for part in parse_parts(args.parts):
        spec = DataSpec(n_greedy=args.n_greedy, n_sampled=args.n_sampled, max_new=args.max_new, batch=args.batch,
                        seed=args.seed, part=part, source=args.source, route=args.route,
                        answerer=args.answerer)  # fmt: skip
        records = build_dataset(args.target, args.data, spec, answers_dir=args.answers)
        n_tok = sum(len(r["answer"]) for r in records)
        total += n_tok
        print(f"part {part}: {len(records)} answers, {n_tok} tokens (total so far {total})", flush=True)
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
