"""The vision tower on one 512 x 512 image: refllm (spec and fast op sets) against transformers, in one run.

SmolVLM-256M's tower shape (SigLIP base, patch 16: 1024 patches, width 768, 12 layers), random
weights (no vision-language weights are published as a package): transformers' Idefics3 vision
transformer in float32 eager, and refllm's tower and connector built from the same state dict.
Prints the machine, the thread settings and, per path, the median seconds for one image and
patches/s over ``--runs`` runs, after one warm-up each; and the largest difference of refllm's
features from transformers' (the check that both computed the same thing).

    python benchmarks/bench_vision.py [--runs 5] [--size 512] [--layers 12]
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
from machine import median_seconds  # benchmarks/machine.py

from refllm.families.vision import VisionConfig
from refllm.machine import cpu_name, thread_settings, vector_extensions
from refllm.models.ops import SPEC_OPS, fast_ops
from refllm.models.vision_tower import load_vision_tower, vision_tower


class StateDictSource:
    """A ModelSource's tensor methods over a torch state dict (only what the tower loader reads)."""

    def __init__(self, state: dict):
        self.tensors = {name: value.detach().numpy() for name, value in state.items()}

    def tensor_names(self) -> list[str]:
        return list(self.tensors)

    def tensor(self, name: str) -> np.ndarray:
        return self.tensors[name]

    def where(self, name: str | None) -> str:
        return "the transformers model"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--size", type=int, default=512, help="image side in pixels (a multiple of 16)")
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()

    import torch
    from transformers.models.idefics3.configuration_idefics3 import Idefics3VisionConfig
    from transformers.models.idefics3.modeling_idefics3 import Idefics3VisionTransformer

    shape = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=args.layers, num_attention_heads=12,
                 image_size=args.size, patch_size=16)  # fmt: skip
    torch.manual_seed(0)
    hf = Idefics3VisionTransformer(Idefics3VisionConfig(**shape, _attn_implementation="eager")).eval()
    config = VisionConfig(**shape)
    weights = load_vision_tower(StateDictSource(hf.state_dict()), config, "", np.dtype(np.float32))
    pixels = np.random.default_rng(0).uniform(-1, 1, (1, 3, args.size, args.size)).astype(np.float32)

    with torch.no_grad():
        expected = hf(torch.tensor(pixels)).last_hidden_state.numpy()

        def transformers_tower():
            hf(torch.tensor(pixels))

        seconds = {"transformers float32 eager": median_seconds(transformers_tower, args.runs)}
    for name, ops in (("refllm spec", SPEC_OPS), ("refllm fast", fast_ops())):
        got = vision_tower(pixels, weights, config, ops)
        difference = float(np.abs(got - expected).max())
        seconds[name] = median_seconds(lambda ops=ops: vision_tower(pixels, weights, config, ops), args.runs)
        print(f"{name}: features within {difference:.1e} of transformers'")

    print(
        f"cpu: {cpu_name()}; vectors: {' '.join(vector_extensions()) or '-'}; cores: {os.cpu_count()};"
        f" {thread_settings()}; torch threads: {torch.get_num_threads()}"
    )
    patches = (args.size // 16) ** 2
    figures = {name: {"seconds": round(s, 4), "patches_per_second": round(patches / s, 1)} for name, s in seconds.items()}
    base = seconds["transformers float32 eager"]
    for name in figures:
        figures[name]["vs_transformers"] = round(base / seconds[name], 2)
    print(json.dumps({"image": f"{args.size}x{args.size}", "patches": patches, "layers": args.layers, **figures}, indent=2))


if __name__ == "__main__":
    main()
