"""A SmolLM2-135M-shaped model with seeded random weights, as a Hugging Face folder.

The GPU check (experiments/device/cuda_check.sh) runs on a machine that has neither the internet nor room to
carry the embedded GGUF (98 MB over the 64 MiB a device call takes), so it benches the same shapes
(30 layers, 576 hidden, GQA 9:3, 49,152-token vocabulary, tied head) with random weights: speed and
memory are the model's, rewards are not (a random model's answers score 0).

    python3 tools/random_smollm2.py SOURCE TARGET

SOURCE holds SmolLM2's config.json and tokenizer files (copied from ``$SPARSERL_CACHE/smollm2-135m-instruct``);
TARGET receives them with a float32 ``model.safetensors`` (seed 0).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main(source: str, target: str) -> None:
    src, dst = Path(source), Path(target)
    dst.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(src), dtype=torch.float32)
    model.save_pretrained(dst)
    for f in src.iterdir():
        if f.name != "config.json":
            shutil.copy(f, dst / f.name)
    print(f"{dst}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters (random, seed 0)")


if __name__ == "__main__":
    main(*sys.argv[1:3])
