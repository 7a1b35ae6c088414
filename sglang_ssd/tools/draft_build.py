"""Assemble the draft model folder from the shipped weights and the target's embedding.

    python -m sglang_ssd.tools.draft_build --target models/target --out models/draft \\
        [--weights sglang_ssd/tools/weights/draft_weights.safetensors]

The shipped file (bf16) holds only what training produced: the student layers, the final norm, the
reduced head `lm_head.weight` [V_sub, H] and `draft_token_ids` [V_sub]; its metadata carries the draft
config and the parts that training kept as exact target copies (`target_copies`: student key → target
key; a frozen head is the target's embedding rows of `draft_token_ids`), which are copied from the target. The folder gets those in fp32 (fastest on CPU) plus the target's embedding, the target's
tokenizer files and chat template. Idempotent: a folder built from the same inputs is left as it is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import torch

from sglang_ssd.tools.draft_model import DRAFT_TOKEN_IDS, HEAD_FROM_EMBEDDING

DEFAULT_WEIGHTS = Path(__file__).parent / "weights" / "draft_weights.safetensors"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                   "special_tokens_map.json")
STAMP = "draft_build.json"


def file_digest(path: Path) -> str:
    """sha256 of a file, read in 1 MB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_weights(weights: Path) -> tuple[dict, dict, dict]:
    """(draft config, tensors, {student key: target key} copies) of a draft weights file written by
    draft_train; the token ids stay int64, every other tensor comes back fp32."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(weights), "pt") as fh:
        meta = fh.metadata() or {}
    if "draft_config" not in meta:
        raise ValueError(f"{weights} has no draft_config metadata")
    tensors = {k: (v if k == DRAFT_TOKEN_IDS else v.to(torch.float32)) for k, v in load_file(str(weights)).items()}
    return json.loads(meta["draft_config"]), tensors, json.loads(meta.get("target_copies", "{}"))


def build(target: Path, out: Path, weights: Path = DEFAULT_WEIGHTS) -> Path:
    """Write the draft folder `out`; returns it. Raises ValueError on missing or inconsistent inputs."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    target, out, weights = Path(target), Path(out), Path(weights)
    if not (target / "model.safetensors").is_file() or not (target / "config.json").is_file():
        raise ValueError(f"target folder is missing or incomplete: {target}")
    if not weights.is_file():
        raise ValueError(f"draft weights file not found: {weights}")
    stamp = {"weights_sha256": file_digest(weights),
             "target_config_sha256": file_digest(target / "config.json"),
             "target_weights_size": (target / "model.safetensors").stat().st_size}
    if (out / STAMP).is_file() and json.loads((out / STAMP).read_text()) == stamp:
        return out
    cfg, tensors, copies = read_weights(weights)
    target_cfg = json.loads((target / "config.json").read_text())
    for key in ("hidden_size", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim"):
        if cfg.get(key) != target_cfg.get(key):
            raise ValueError(f"draft {key}={cfg.get(key)} does not match the target's {target_cfg.get(key)}")
    with safe_open(str(target / "model.safetensors"), "pt") as fh:
        emb = fh.get_tensor("model.embed_tokens.weight").to(torch.float32)
        tensors["model.embed_tokens.weight"] = emb
        for key, source in copies.items():
            if source == HEAD_FROM_EMBEDDING:
                tensors[key] = emb[tensors[DRAFT_TOKEN_IDS]].clone()
            else:
                tensors[key] = fh.get_tensor(source).to(torch.float32)
    if tensors["lm_head.weight"].shape[0] != cfg["draft_vocab_size"]:
        raise ValueError("lm_head rows do not match draft_vocab_size")
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"),
              metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (target / name).is_file():
            shutil.copy2(target / name, tmp / name)
    (tmp / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, default=Path("models/target"))
    ap.add_argument("--out", type=Path, default=Path("models/draft"))
    ap.add_argument("--weights", type=Path, default=DEFAULT_WEIGHTS)
    args = ap.parse_args(argv)
    try:
        path = build(args.target, args.out, args.weights)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"draft model folder: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
