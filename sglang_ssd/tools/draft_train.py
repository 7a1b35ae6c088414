"""Train the draft model: the deterministic script that produced the shipped weights.

    python -m sglang_ssd.tools.draft_train --target models/target \\
        [--data models/draft_data] [--parts 2] [--layers 0,1,29] [--vocab 8192] [--freeze head] \\
        [--steps 600] [--holdout N] [--sharegpt-parts 8] [--val-sharegpt 256] [--resume] \\
        [--init models/runs/prev.safetensors] \\
        [--out sglang_ssd/tools/weights/draft_weights.safetensors]

Pipeline (one thread, fixed seeds; the same arguments give the same weights):
1. Data (draft_data.py): the target answers training prompts of four kinds (chat/instructions,
   arithmetic word problems, code, opinion/feedback) through its chat template, greedy and at T = 0.7,
   batched; its top-32 logits at every answer position are kept. Cached under --data, so a rerun (or an
   interrupted run) skips what is done.
2. Draft: the target's embedding (frozen: the draft's lookup costs nothing and keeps the vocabulary),
   the target layers named by --layers as the initial student layers, the target's final norm, and a head
   over the --vocab most frequent answer tokens (rows start as the target's tied embedding rows).
   --freeze keeps parts as exact target copies (head rows, attention, MLP): not trained, not shipped.
   --init starts instead from a trained draft's weights file (its layers, norm, head rows and head
   vocabulary), so a new run on more data goes on from the shipped draft rather than from target copies;
   --layers may add target layers around the file's (a deeper draft grown from the shipped one), and a
   --vocab above the file's head rows adds the next most frequent answer tokens after them.
3. Distillation, teacher-forced on prompt + answer: cross-entropy between the target's top-k
   distribution restricted to the head's subset and the draft's distribution, on answer positions only.
   AdamW, linear warm-up then cosine decay, fp32 (`--bf16`: bf16 autocast matmuls, fp32 master weights).
4. Writes every trained tensor (layers, norm, head unless frozen) and the token ids in bf16 to --out;
   the embedding and frozen parts are not written (draft_build.py takes them from the target).
Shipped configuration: weights/draft_weights.json holds the exact command and its report (target
layers 0, 1, 2, 29 as four trained student layers, a trained 8192-row head, fp32, 16 sequences a step with
the last 64 prompt tokens each): 600 steps on the cached ShareGPT parts, warm-started with --init from
the previous draft (700 steps on the template and the ShareGPT parts cached then).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm import tqdm

from sglang_ssd.tools.draft_data import ANSWERS, DataSpec, build_dataset, parse_parts
from sglang_ssd.tools.draft_model import DRAFT_TOKEN_IDS, HEAD_FROM_EMBEDDING, SubsetHead, draft_config

DEFAULT_OUT = Path(__file__).parent / "weights" / "draft_weights.safetensors"


def choose_vocab(records: list[dict], size: int, vocab_size: int, must: list[int]) -> torch.Tensor:
    """Head subset (int64 [size]): `must` ids, then answer tokens by frequency, then tokens seen in the
    target's top-5, then the lowest ids (BPE merge order, a proxy for corpus frequency)."""
    if not 0 < size <= vocab_size:
        raise ValueError(f"size must be in (0, {vocab_size}], got {size}")
    answers = Counter()
    tops = Counter()
    for r in records:
        answers.update(r["answer"].tolist())
        tops.update(r["top_ids"][:, :5].reshape(-1).tolist())
    order: list[int] = []
    seen: set[int] = set()
    ranked = (list(must) + [t for t, _ in sorted(answers.items(), key=lambda kv: (-kv[1], kv[0]))]
              + [t for t, _ in sorted(tops.items(), key=lambda kv: (-kv[1], kv[0]))] + list(range(vocab_size)))
    for t in ranked:
        if t not in seen:
            seen.add(t)
            order.append(t)
        if len(order) == size:
            break
    return torch.tensor(order, dtype=torch.long)


FREEZE_GROUPS = ("head", "attn", "mlp")


def build_student(target, layers: list[int], token_ids: torch.Tensor, freeze: tuple[str, ...] = ()):
    """A `LlamaForCausalLM` with len(layers) decoder layers copied from `target`, the target's (frozen)
    embedding and final norm, and a `SubsetHead` whose rows are the target's embedding rows.

    `freeze` names parts kept as exact target copies (not trained, not shipped; draft_build.py copies
    them from the target): "head" (rows stay the tied embedding's), "attn" (attention and its input
    norm), "mlp" (MLP and its input norm). Returns (student, config dict, {student key: target key}).
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    n_target = target.config.num_hidden_layers
    if not layers or any(not 0 <= i < n_target for i in layers):
        raise ValueError(f"layers must be indices in [0, {n_target}), got {layers}")
    if any(f not in FREEZE_GROUPS for f in freeze):
        raise ValueError(f"freeze must name groups among {FREEZE_GROUPS}, got {freeze}")
    cfg = draft_config(target.config.to_dict(), len(layers), len(token_ids), layers)
    config = LlamaConfig(**{k: v for k, v in cfg.items() if k != "draft_vocab_size"})
    torch.manual_seed(0)
    student = LlamaForCausalLM(config)
    student.model.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
    student.model.embed_tokens.weight.requires_grad_(False)
    copies: dict[str, str] = {}
    for j, i in enumerate(layers):
        student.model.layers[j].load_state_dict(target.model.layers[i].state_dict())
        for name, param in student.model.layers[j].named_parameters():
            group = "attn" if name.startswith(("self_attn.", "input_layernorm.")) else "mlp"
            if group in freeze:
                param.requires_grad_(False)
                copies[f"model.layers.{j}.{name}"] = f"model.layers.{i}.{name}"
    student.model.norm.load_state_dict(target.model.norm.state_dict())
    emb = target.model.embed_tokens.weight.data
    student.lm_head = SubsetHead(emb[token_ids].clone(), token_ids, config.vocab_size)
    if "head" in freeze:
        student.lm_head.weight.requires_grad_(False)
        copies["lm_head.weight"] = HEAD_FROM_EMBEDDING
    return student, cfg, copies


def read_init(path: Path, layers: list[int]) -> tuple[torch.Tensor, dict, dict]:
    """(head token ids, trained tensors in fp32, its frozen target copies) of a draft weights file, with
    its layer keys renumbered to this run's student. The file's layers must all appear in --layers, in
    the same order: a run may grow the draft (see load_init for the added layers), not reshuffle it."""
    from sglang_ssd.tools.draft_build import read_weights

    cfg, tensors, copies = read_weights(path)
    src = cfg.get("draft_source_layers") or []
    pos = {i: j for j, i in enumerate(layers)}
    kept = [pos.get(i) for i in src]
    if DRAFT_TOKEN_IDS not in tensors or not src or None in kept or kept != sorted(kept):
        raise ValueError(f"--init {path} has layers {src}: each must appear in --layers {layers}, in that order")
    renumber = {f"model.layers.{j}.": f"model.layers.{kept[j]}." for j in range(len(src))}

    def move(key: str) -> str:
        prefix = ".".join(key.split(".")[:3]) + "."
        return renumber[prefix] + key[len(prefix):] if prefix in renumber else key

    ids = tensors.pop(DRAFT_TOKEN_IDS).long()
    return ids, {move(k): v for k, v in tensors.items()}, {move(k): v for k, v in copies.items()}


# The two projections that write an added layer's result into the residual stream.
ADDED_LAYER_OUTPUTS = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def _from_init(key: str, init_layers: set[int]) -> bool:
    """Whether a student key is one a grown run takes from the --init file (not a layer it added)."""
    parts = key.split(".")
    return not key.startswith("model.layers.") or int(parts[2]) in init_layers


def load_init(student, init: dict, init_copies: dict, copies: dict, path: Path) -> None:
    """Overwrite the student's trained tensors with the --init file's: for the layers it holds, it must
    hold exactly the tensors save_weights would write for this run (same --freeze parts, nothing missing,
    nothing extra). Layers the run adds start as target copies with their trained output projections
    zeroed: a residual no-op, so the grown draft begins as exactly the init draft (a plain target layer
    dropped into a trained stack first undoes its training)."""
    layers = {int(k.split(".")[2]) for k in [*init, *init_copies] if k.startswith("model.layers.")}
    if init_copies != {k: v for k, v in copies.items() if _from_init(k, layers)}:
        raise ValueError(f"--init {path} was trained with other --freeze parts than this run")
    expected = {k for k in trained_keys(student) if k not in copies and _from_init(k, layers)}
    if set(init) != expected:
        odd = sorted(set(init) ^ expected)[:3]
        raise ValueError(f"--init {path} does not hold this run's trained tensors (e.g. {odd})")
    head = init.pop("lm_head.weight", None)
    student.load_state_dict(init, strict=False)
    for name, p in student.named_parameters():
        if p.requires_grad and not _from_init(name, layers) and name.endswith(ADDED_LAYER_OUTPUTS):
            p.data.zero_()
    if head is not None:  # a grown head keeps its added rows as the target's embedding rows
        student.lm_head.weight.data[: head.shape[0]] = head


def trained_keys(student) -> list[str]:
    """The state-dict keys a weights file carries: layers, final norm and head (not the embedding)."""
    return [k for k in student.state_dict() if k.startswith(("model.layers.", "model.norm.")) or k == "lm_head.weight"]


def make_examples(records: list[dict], token_ids: torch.Tensor, vocab_size: int, max_context: int = 0) -> list[dict]:
    """Per record: `ids` (prompt + answer[:-1]), `start` (first position predicting an answer token),
    teacher top-k mapped to head rows `rows` (int64 [N, k], −1 outside the subset) and `logits`.
    ``max_context`` > 0 keeps only the prompt's last tokens: a step's cost is its sequence length."""
    row_of = torch.full((vocab_size,), -1, dtype=torch.long)
    row_of[token_ids] = torch.arange(len(token_ids))
    out = []
    for r in records:
        prompt = r["prompt"][-max_context:] if max_context > 0 else r["prompt"]
        ids = torch.cat([prompt, r["answer"][:-1]])
        out.append({"ids": ids, "start": len(prompt) - 1, "rows": row_of[r["top_ids"].long()],
                    "logits": r["top_logits"].float()})
    return out


def collate(batch: list[dict], pad_id: int):
    """Right-padded batch: ids/attention [B, T]; teacher rows/logits [B, T, k] (rows −1 = no loss)."""
    width = max(len(e["ids"]) for e in batch)
    k = batch[0]["rows"].shape[1]
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(batch), width), dtype=torch.long)
    rows = torch.full((len(batch), width, k), -1, dtype=torch.long)
    logits = torch.zeros((len(batch), width, k))
    for b, e in enumerate(batch):
        n = len(e["ids"])
        ids[b, :n] = e["ids"]
        att[b, :n] = 1
        s = e["start"]
        rows[b, s: s + len(e["rows"])] = e["rows"]
        logits[b, s: s + len(e["rows"])] = e["logits"]
    return ids, att, rows, logits


def distill_loss(sub_logits: torch.Tensor, rows: torch.Tensor, t_logits: torch.Tensor,
                 hard_weight: float, tv_weight: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Soft cross-entropy to the teacher's top-k restricted to the subset (+ hard CE on its argmax,
    + the total-variation distance TV(p, q) = 1 − Σ min(p, q): a sampled draft token is accepted with
    probability 1 − TV, so this term aims at acceptance itself rather than at likelihood).

    sub_logits [..., V_sub]; rows [..., k] (−1 = not in subset / no target); t_logits [..., k].
    Returns (loss, top-1 agreement rate on positions whose teacher argmax is in the subset).
    """
    valid = rows >= 0
    pos = valid.any(-1)
    logq = torch.log_softmax(sub_logits.float(), dim=-1)
    gathered = logq.gather(-1, rows.clamp(min=0))
    p = torch.softmax(t_logits.masked_fill(~valid, float("-inf")), dim=-1).nan_to_num(0.0)
    soft = -(p * gathered).sum(-1)
    loss = soft[pos].mean()
    top_ok = pos & (rows[..., 0] >= 0)
    if hard_weight > 0:
        loss = loss + hard_weight * (-gathered[..., 0][top_ok]).mean()
    if tv_weight > 0:  # p is zero outside the teacher's top-k rows, so Σ min(p, q) runs over those rows only
        overlap = torch.minimum(p, gathered.exp() * valid).sum(-1)
        loss = loss + tv_weight * (1.0 - overlap[pos]).mean()
    agree = (sub_logits.argmax(-1) == rows[..., 0])[top_ok].float().mean()
    return loss, agree


def count_or_parts(text: str) -> list[int]:
    """Part numbers from a count ('10': parts 0-9, as the shipped drafts' commands say) or from the parts
    themselves ('8-11', '8,10'): a run from the shipped weights trains on the parts it has not seen."""
    return list(range(int(text))) if text.isdigit() else parse_parts(text)


def load_records(args) -> tuple[list[dict], list[dict]]:
    """(training records, validation records). Training: --parts template parts and --sharegpt-parts
    ShareGPT parts; validation: the target's greedy answers to --val-sharegpt held-out ShareGPT prompts
    (never trained on), else every --holdout-th training record."""
    specs = [DataSpec(n_greedy=args.n_greedy, n_sampled=args.n_sampled, max_new=args.max_new, seed=args.seed,
                      part=part, route=args.route) for part in range(args.parts)]  # fmt: skip
    specs += [DataSpec(n_greedy=args.n_greedy, n_sampled=args.n_sampled, max_new=args.max_new, seed=args.seed,
                       part=part, source="templates-b", route=args.route) for part in args.templates_b_parts]  # fmt: skip
    specs += [DataSpec(n_greedy=args.sharegpt_n_greedy, n_sampled=args.sharegpt_n_sampled, max_new=args.max_new,
                       seed=args.seed, part=part, source=source, route=args.route)
              for source, parts in (("sharegpt", range(args.sharegpt_parts)), ("sharegpt-later", args.sharegpt_later_parts))
              for part in parts]  # fmt: skip
    # On-policy parts: the same kind of ShareGPT prompts, answered by --onpolicy-draft, scored by the target.
    specs += [DataSpec(n_greedy=args.sharegpt_n_greedy, n_sampled=args.sharegpt_n_sampled, max_new=args.max_new,
                       seed=args.seed, part=part, source="sharegpt", route="hf", answerer=str(args.onpolicy_draft))
              for part in args.onpolicy_parts]  # fmt: skip
    records = [r for spec in specs for r in build_dataset(args.target, args.data, spec, args.cached_only, args.answers)]
    if args.val_sharegpt:
        spec = DataSpec(n_greedy=args.val_sharegpt, n_sampled=0, max_new=args.max_new, seed=args.seed,
                        source="sharegpt-held-out", route=args.route)  # fmt: skip
        return records, build_dataset(args.target, args.data, spec, answers_dir=args.answers)
    held = records[args.holdout - 1 :: args.holdout] if args.holdout else []
    if args.holdout:
        records = [r for i, r in enumerate(records) if (i + 1) % args.holdout]
    return records, held


def lr_schedule(args):
    """Linear warm-up over the first 5 % of steps, then cosine decay to zero."""
    warm = max(1, args.steps // 20)

    def lr_at(step: int) -> float:
        if step < warm:
            return args.lr * (step + 1) / warm
        return args.lr * 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm)))

    return lr_at


def scored_loss(student, ids, att, rows, t_logits, bf16: bool, hard_weight: float, tv_weight: float = 0.0):
    """The student's forward and distill_loss, with the head run on scored (answer) positions only:
    most positions are prompt, and the head is the largest matrix."""
    scored = (rows >= 0).any(-1)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        hidden = student.model(input_ids=ids, attention_mask=att).last_hidden_state
        sub = student.lm_head.sub_logits(hidden[scored])
    return distill_loss(sub, rows[scored], t_logits[scored], hard_weight, tv_weight)


def train_step(student, opt, params, batch: list[dict], pad_id: int, lr: float, args) -> tuple[float, float]:
    ids, att, rows, t_logits = collate(batch, pad_id)
    for g in opt.param_groups:
        g["lr"] = lr
    loss, agree = scored_loss(student, ids, att, rows, t_logits, args.bf16, args.hard_weight, args.tv_weight)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()
    return loss.item(), agree.item()


def checkpoint_path(args) -> Path:
    return args.out.with_suffix(".ckpt.pt")


def save_checkpoint(args, step: int, student, opt, order: list[int], rng: random.Random, log: dict) -> None:
    """Everything the loop needs to go on from `step` as if it had never stopped (atomic write)."""
    state = {"step": step, "student": student.state_dict(), "opt": opt.state_dict(), "order": order,
             "token_ids": student.lm_head.token_ids.clone(),
             "rng": rng.getstate(), "torch_rng": torch.get_rng_state(), "log": log}  # fmt: skip
    path = checkpoint_path(args)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)


def train(args) -> dict:
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    t_start, cpu_start = time.time(), time.process_time()
    if args.init:  # read first, so a wrong file or --layers fails before the data loads; its vocabulary wins
        token_ids, init, init_copies = read_init(args.init, args.layers)
    records, held = load_records(args)
    data_wall, data_cpu = time.time() - t_start, time.process_time() - cpu_start
    target = AutoModelForCausalLM.from_pretrained(str(args.target), dtype=torch.float32)
    eos = int(target.config.eos_token_id)
    if not args.init:
        token_ids = choose_vocab(records, args.vocab, target.config.vocab_size, must=[eos])
    elif args.vocab > len(token_ids):  # grow the head: the file's rows first, then the next most frequent
        token_ids = choose_vocab(records, args.vocab, target.config.vocab_size, must=token_ids.tolist())
    covered = torch.zeros(target.config.vocab_size, dtype=torch.bool)
    covered[token_ids] = True
    answer_cov = torch.cat([covered[r["answer"]] for r in records]).float().mean().item()
    student, cfg, copies = build_student(target, args.layers, token_ids, tuple(args.freeze))
    del target
    if args.init:
        load_init(student, init, init_copies, copies, args.init)
        del init
    examples = make_examples(records, token_ids, cfg["vocab_size"], args.max_context)
    val = make_examples(held, token_ids, cfg["vocab_size"])
    params = [p for p in student.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0)
    rng, order, start = random.Random(args.seed), [], 0
    log = {"ema_loss": None, "ema_agree": None, "val": []}
    if args.resume and checkpoint_path(args).is_file():
        state = torch.load(checkpoint_path(args), weights_only=False)
        # The examples were mapped onto this run's head vocabulary: a checkpoint of another one would
        # train every teacher row against the wrong head row.
        if "token_ids" in state and not torch.equal(state["token_ids"], student.lm_head.token_ids):
            raise ValueError(f"{checkpoint_path(args)} has another head vocabulary than this run "
                             "(other data, --vocab or --init): delete it or use another --out")
        student.load_state_dict(state["student"])
        opt.load_state_dict(state["opt"])
        start, order, log = state["step"], state["order"], state["log"]
        rng.setstate(state["rng"])
        torch.set_rng_state(state["torch_rng"])
        tqdm.write(f"resumed at step {start} from {checkpoint_path(args)}")
    lr_at = lr_schedule(args)
    if val and start == 0:  # the starting point's figure, so a warm-started run is compared on one scale
        vloss, vtop1 = validate(student, val, eos, args.bf16)
        log["val"].append((0, round(vloss, 4), round(vtop1, 4)))
        tqdm.write(f"step 0: held-out loss {vloss:.3f} top-1 agreement {vtop1:.3f}")
    student.train()
    bar = tqdm(range(start, args.steps), desc="distill", unit="step", initial=start, total=args.steps)
    for step in bar:
        if len(order) < args.batch:
            perm = list(range(len(examples)))
            rng.shuffle(perm)
            order.extend(perm)
        batch = [examples[i] for i in order[: args.batch]]
        del order[: args.batch]
        loss, agree = train_step(student, opt, params, batch, eos, lr_at(step), args)
        log["ema_loss"] = loss if log["ema_loss"] is None else 0.95 * log["ema_loss"] + 0.05 * loss
        log["ema_agree"] = agree if log["ema_agree"] is None else 0.95 * log["ema_agree"] + 0.05 * agree
        bar.set_postfix(loss=f"{log['ema_loss']:.3f}", top1=f"{log['ema_agree']:.3f}", lr=f"{lr_at(step):.1e}")
        if (step + 1) % args.val_every == 0 or step + 1 == args.steps:
            if val:
                vloss, vtop1 = validate(student, val, eos, args.bf16)
                log["val"].append((step + 1, round(vloss, 4), round(vtop1, 4)))
                tqdm.write(f"step {step + 1}: held-out loss {vloss:.3f} top-1 agreement {vtop1:.3f}")
            if args.resume:
                save_checkpoint(args, step + 1, student, opt, order, rng, log)
    wall, cpu = time.time() - t_start, time.process_time() - cpu_start
    save_weights(student, cfg, copies, args.out)
    report = {
        "layers": args.layers, "vocab": len(token_ids), "freeze": args.freeze,
        "trained_params": sum(p.numel() for p in params), "steps": args.steps, "batch": args.batch, "lr": args.lr,
        "records": len(records), "answer_tokens": int(sum(len(r["answer"]) for r in records)),
        "answer_coverage_of_head": round(answer_cov, 4), "final_train_top1_ema": round(log["ema_agree"], 4),
        "final_loss_ema": round(log["ema_loss"], 4), "data_wall_s": round(data_wall), "data_cpu_s": round(data_cpu),
        "total_wall_s": round(wall), "total_cpu_s": round(cpu), "out": str(args.out),
        "generation_cpu_s_recorded": round(sum(r.get("gen_cpu_s", 0.0) for r in records + held)),
        "holdout_every": args.holdout, "val_sharegpt": args.val_sharegpt, "val_log": log["val"],
        "sharegpt_parts": args.sharegpt_parts, "sharegpt_later_parts": args.sharegpt_later_parts,
        "templates_b_parts": args.templates_b_parts,
        "onpolicy_parts": args.onpolicy_parts,
        "onpolicy_draft": str(args.onpolicy_draft) if args.onpolicy_parts else None, "hard_weight": args.hard_weight, "tv_weight": args.tv_weight,
        "init": str(args.init) if args.init else None,
    }  # fmt: skip
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    return report


@torch.no_grad()
def validate(student, val: list[dict], pad_id: int, bf16: bool, batch: int = 16) -> tuple[float, float]:
    """Mean distillation loss and top-1 agreement over held-out examples (no gradient, eval mode)."""
    student.eval()
    losses, agrees = [], []
    for i in range(0, len(val), batch):
        ids, att, rows, t_logits = collate(val[i: i + batch], pad_id)
        loss, agree = scored_loss(student, ids, att, rows, t_logits, bf16, 0.0)
        losses.append(loss.item())
        agrees.append(agree.item())
    student.train()
    return sum(losses) / len(losses), sum(agrees) / len(agrees)


def save_weights(student, cfg: dict, copies: dict[str, str], out: Path) -> None:
    """bf16 safetensors of the trained tensors (not the embedding, not the frozen target copies); the
    metadata carries the draft config and the {student key: target key} copies draft_build.py fills in."""
    from safetensors.torch import save_file

    state = student.state_dict()
    tensors = {k: state[k].detach().to(torch.bfloat16).contiguous() for k in trained_keys(student) if k not in copies}
    tensors[DRAFT_TOKEN_IDS] = student.lm_head.token_ids.clone()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out), metadata={"draft_config": json.dumps(cfg), "target_copies": json.dumps(copies)})


def parse_args(argv: list[str] | None = None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, default=Path("models/target"))
    ap.add_argument("--data", type=Path, default=Path("models/draft_data"))
    ap.add_argument("--answers", type=Path, default=ANSWERS,
                    help="the committed answer store: batches missing from --data are rebuilt from it")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--layers", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 29])
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--freeze", type=lambda s: [x for x in s.split(",") if x], default=["head"],
                    help=f"comma list of parts kept as target copies: {','.join(FREEZE_GROUPS)}")
    ap.add_argument("--hard-weight", type=float, default=0.0)
    ap.add_argument("--tv-weight", type=float, default=0.0,
                    help="weight of the total-variation (acceptance) term beside the soft cross-entropy")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the same weights for any count "
                    "only up to float rounding: 1 is the reproducible default)")
    # bf16 autocast is opt-in: on this AVX2 CPU (no native bf16) a step took 24x the fp32 time
    # (120 s against 5 s for 8 sequences, torch 2.13).
    ap.add_argument("--bf16", dest="bf16", action="store_true", default=False)
    ap.add_argument("--no-bf16", dest="bf16", action="store_false")
    ap.add_argument("--max-context", type=int, default=0,
                    help="train on the last N prompt tokens only (0: the whole prompt); validation keeps all")
    ap.add_argument("--n-greedy", type=int, default=DataSpec.n_greedy)
    ap.add_argument("--n-sampled", type=int, default=DataSpec.n_sampled)
    ap.add_argument("--max-new", type=int, default=DataSpec.max_new)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", type=int, default=2, help="data parts (each n-greedy + n-sampled prompts)")
    ap.add_argument("--holdout", type=int, default=0,
                    help="experiments: keep every N-th record out of training and report loss/agreement on it")
    ap.add_argument("--val-every", type=int, default=100)
    ap.add_argument("--sharegpt-parts", type=int, default=0,
                    help="ShareGPT data parts added to the template parts (sglang_ssd/sharegpt.py's train split)")
    ap.add_argument("--sharegpt-later-parts", type=count_or_parts, default=[],
                    help="ShareGPT later-turn parts added too (sglang_ssd/sharegpt.py's train_later part): a count "
                    "N (parts 0 to N-1) or the parts themselves ('8-11', '8,10')")
    ap.add_argument("--templates-b-parts", type=count_or_parts, default=[],
                    help="parts of the second template family (a count, or the parts: '1-2')")
    ap.add_argument("--sharegpt-n-greedy", type=int, default=512)
    ap.add_argument("--sharegpt-n-sampled", type=int, default=512)
    ap.add_argument("--val-sharegpt", type=int, default=0,
                    help="validate on the target's greedy answers to this many held-out ShareGPT prompts")
    ap.add_argument("--route", choices=("hf", "server"), default="server",
                    help="how the data was (or is to be) generated: its cache tag (draft_data.py)")
    ap.add_argument("--onpolicy-parts", type=parse_parts, default=[],
                    help="ShareGPT train-split parts ('8' or '8-9') answered by --onpolicy-draft and scored by the "
                    "target (on-policy data), added to the training data")
    ap.add_argument("--onpolicy-draft", type=Path, default=Path("models/draft"),
                    help="the draft folder that answers the on-policy parts (the shipped draft's: models/draft)")
    ap.add_argument("--cached-only", action="store_true",
                    help="generate no new target answers (generation still running elsewhere); a batch whose "
                    "logits cache is missing is still rebuilt from the answer store (data/draft_answers)")
    ap.add_argument("--init", type=Path, default=None,
                    help="start from this draft weights file instead of target copies (same --freeze; its layers "
                    "must appear in --layers in order; added layers start as target copies with their output "
                    "projections zeroed, so the grown draft begins as this one); "
                    "its head rows come first; a larger --vocab adds rows (target copies) after them")
    ap.add_argument("--resume-from-shipped", action="store_true",
                    help="--init from the committed draft weights (copied under --out's folder first), with "
                    "their layers unless --layers is given: training goes on from what was shipped")
    ap.add_argument("--resume", action="store_true",
                    help="checkpoint at every validation next to --out, and go on from one if it is there")
    args = ap.parse_args(argv)
    if args.resume_from_shipped:
        args.init = shipped_copy(args.out.parent, layers_given="--layers" in (argv or sys.argv[1:]), args=args)
    if args.steps <= 0 or args.batch <= 0 or args.lr <= 0 or args.parts < 0 or args.holdout < 0:
        raise ValueError("--steps, --batch and --lr must be positive, --parts and --holdout non-negative")
    if args.init is not None and args.init.resolve() == args.out.resolve():
        raise ValueError("--init and --out are the same file: the run would overwrite its own starting point")
    if args.sharegpt_parts < 0:
        raise ValueError("--sharegpt-parts must be >= 0")
    if args.parts + args.sharegpt_parts + len(args.sharegpt_later_parts + args.templates_b_parts + args.onpolicy_parts) == 0:
        raise ValueError("no training data: --parts, --sharegpt-parts, --sharegpt-later-parts, --templates-b-parts and "
                         "--onpolicy-parts are all empty")
    if not 0 <= args.val_sharegpt <= 256:
        raise ValueError("--val-sharegpt must be in [0, 256] (the held-out slice)")
    return args


def shipped_copy(folder: Path, layers_given: bool, args) -> Path:
    """A copy of the committed draft weights in `folder` (the run may write its --out over the committed
    file), and its layers as --layers unless they were given."""
    import shutil

    from sglang_ssd.tools.draft_build import read_weights

    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / "shipped_init.safetensors"
    if copy.resolve() != DEFAULT_OUT.resolve():
        shutil.copyfile(DEFAULT_OUT, copy)
    if not layers_given:
        args.layers = list(read_weights(copy)[0]["draft_source_layers"])
    return copy


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    report = train(args)
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
