"""Regenerate the vision-language fixtures of ``tests/data/hf`` (tests/helpers/hf_vision_fixtures.py).

    python tests/tools/make_hf_vision_fixtures.py [idefics3] [gemma3_vision]

Needs torch, transformers and Pillow. Each case's tiny model, tokenizer and processor are saved as
the Hub lays them out, with the drawn images in ``images/`` and, for every scenario, what
transformers' processor and model make of them in ``reference.npz``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.helpers

from tests.helpers.hf_vision_fixtures import BUILDERS, IMAGES, SCENARIOS, SEED, hf_reference
from tests.helpers.paths import HF_DATA  # noqa: E402


def draw_images(directory: Path) -> None:
    """Gradients under noise, so resampling has edges and smooth parts to get right."""
    from PIL import Image

    rng = np.random.default_rng(SEED)
    directory.mkdir(parents=True, exist_ok=True)
    for name, (height, width, mode) in IMAGES.items():
        y, x = np.mgrid[0:height, 0:width]
        channels = [255 * x / width, 255 * y / height, 127 + 100 * np.sin(x / 3.0 + y / 5.0), 64 + 3 * (x + y)]
        pixels = np.stack(channels, axis=-1) + rng.normal(0, 30, size=(height, width, 4))
        pixels = np.clip(pixels, 0, 255).astype(np.uint8)
        image = Image.fromarray(pixels, "RGBA").convert(mode) if mode != "RGBA" else Image.fromarray(pixels, "RGBA")
        image.save(directory / name)


def write_case(case: str) -> None:
    model, processor = BUILDERS[case]()
    out = HF_DATA / case
    model.save_pretrained(out, safe_serialization=True)
    processor.save_pretrained(out)
    if case == "idefics3":  # the Hub's long-standing layout: the image processor in a file of its own
        nested = json.loads((out / "processor_config.json").read_text())
        (out / "preprocessor_config.json").write_text(json.dumps(nested.pop("image_processor"), indent=2))
        (out / "processor_config.json").write_text(json.dumps(nested, indent=2))
    (out / "generation_config.json").unlink(missing_ok=True)
    draw_images(out / "images")
    reference = {}
    for scenario, (content, options) in SCENARIOS[case].items():
        for key, value in hf_reference(case, model, processor, out, content, options).items():
            reference[f"{scenario}.{key}"] = value
        print(f"{case}/{scenario}: {len(reference[f'{scenario}.input_ids'])} tokens,"
              f" greedy {reference[f'{scenario}.greedy'][:6]}...")  # fmt: skip
    np.savez_compressed(out / "reference.npz", **reference)


def main(names: list[str]) -> None:
    for case in names or list(BUILDERS):
        write_case(case)


if __name__ == "__main__":
    main(sys.argv[1:])
