"""Regenerate ``tests/data/hf/``: every case of tests/helpers/hf_fixtures.py, saved with its reference outputs.

    python tests/tools/make_hf_fixtures.py [CASE ...]

Needs torch and transformers. Each case's tiny transformers model is saved as the Hub lays it out
(``save_pretrained``, in the case's storage dtype) beside ``reference.npz``: the prompt's ids, the
logits at every position and the greedy continuation; a case with a long-standing config.json
spelling also gets ``config.legacy.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.helpers

from tests.helpers.hf_fixtures import CASES, LEGACY_CONFIGS, build_hf_model, hf_reference, prompt_ids
from tests.helpers.paths import HF_DATA  # noqa: E402


def write_case(name: str) -> None:
    import torch

    model = build_hf_model(name)
    out = HF_DATA / name
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[CASES[name][2]]
    if dtype != torch.float32:
        # Round the weights (not the RoPE buffers) to the storage dtype first, so the
        # reference is computed from exactly the weights refllm will read back.
        with torch.no_grad():
            for param in model.parameters():
                param.copy_(param.to(dtype).to(torch.float32))
    reference = hf_reference(model, prompt_ids())
    model.to(dtype).save_pretrained(out, safe_serialization=True)  # buffers are not saved
    np.savez_compressed(out / "reference.npz", **reference)
    if name in LEGACY_CONFIGS:
        config = json.loads((out / "config.json").read_text())
        for key in ("rope_parameters", "layer_types", "no_rope_layers"):
            config.pop(key, None)
        config |= LEGACY_CONFIGS[name]
        (out / "config.legacy.json").write_text(json.dumps(config, indent=2))
    for stray in ("generation_config.json",):
        (out / stray).unlink(missing_ok=True)
    print(f"{name}: logits {reference['logits'].shape}, greedy {reference['greedy'][:8]}...")


def main(names: list[str]) -> None:
    for name in names or list(CASES):
        write_case(name)


if __name__ == "__main__":
    main(sys.argv[1:])
