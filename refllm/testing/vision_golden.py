"""Golden files that carry their images: a vision-language model's outputs on prompts with images.

The same safetensors layout as the text golden files (docs/golden-format.md), with per prompt
``prompt.{i}.image.{j}``: image j's pixel batch [N, C, S, S] (F32), the logits at every position
(``prompt.{i}.logits`` [T, V]) and the greedy continuation. The metadata's ``images`` lists each
prompt's image count; ``refllm.testing.golden.check`` refuses such a file and points here.

    dump_vision_golden(checkpoint, prompts, out)        prompts: [(token ids, images)]
    check_vision_golden(path, backend)                  -> one line per prompt, and whether all passed
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import refllm
from refllm.kv import CacheConfig
from refllm.testing.golden import FORMAT, FORMAT_VERSION, Golden, GoldenFormatError, write_golden
from refllm.testing.tolerances import get_profile
from refllm.testing.vision import VisionCheckpoint, all_logits


def greedy_with_images(model, tokens: list[int], images: list[np.ndarray], new_tokens: int) -> list[int]:
    ids = np.asarray(tokens)[None]
    cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
    runs = [model.image_spans(tokens)] if images else None
    logits = model.prefill(model.embed_multimodal(ids, images), cache, range(len(tokens)), image_spans=runs)
    out = []
    for _ in range(new_tokens):
        out.append(int(np.argmax(logits[0])))
        logits = model.decode(np.array([[out[-1]]]), cache)
    return out


def dump_vision_golden(
    checkpoint: VisionCheckpoint,
    prompts: list[tuple[list[int], list[np.ndarray]]],
    out: str | Path,
    new_tokens: int = 8,
    profile: str = "float32",
    dtype: str = "float32",
) -> dict[str, str]:
    """The reference's logits and greedy tokens for each (tokens, images), written with the images to ``out``."""
    get_profile(profile)
    reference = checkpoint.reference(dtype)
    tensors: dict[str, np.ndarray] = {}
    for i, (tokens, images) in enumerate(prompts):
        tensors[f"prompt.{i}.token_ids"] = np.asarray(tokens, np.int64)
        for j, image in enumerate(images):
            tensors[f"prompt.{i}.image.{j}"] = np.asarray(image, np.float32)
        tensors[f"prompt.{i}.logits"] = all_logits(reference, tokens, images, None, CacheConfig(kind="contiguous"))
        tensors[f"prompt.{i}.greedy_ids"] = np.asarray(greedy_with_images(reference, tokens, images, new_tokens))
    metadata = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "refllm_version": refllm.__version__,
        "model": f"random weights, seed {checkpoint.seed}", "config": json.dumps(checkpoint.config_json),
        "dtype": dtype, "tolerance_profile": profile, "num_prompts": str(len(prompts)),
        "new_tokens": str(new_tokens), "images": json.dumps([len(images) for _, images in prompts]),
    }  # fmt: skip
    write_golden(tensors, metadata, out)
    return metadata


def golden_images(golden: Golden, i: int) -> list[np.ndarray]:
    counts = json.loads(golden.metadata.get("images") or "null")
    if counts is None:
        raise GoldenFormatError("this golden file carries no images; check it with refllm.testing.golden.check")
    return [golden.require(i, f"image.{j}") for j in range(counts[i])]


def check_vision_golden(path: str | Path, backend, profile: str | None = None) -> tuple[bool, list[str]]:
    """Each prompt of the golden file at ``path``, its images included, through ``backend`` (a model with
    ``embed_multimodal``): logits at every position under the profile, and the greedy tokens."""
    golden = Golden.load(path)
    tolerance = get_profile(profile or golden.metadata["tolerance_profile"])
    lines, ok = [], True
    for i in range(golden.num_prompts):
        tokens, images = golden.require(i, "token_ids").tolist(), golden_images(golden, i)
        expected = golden.require(i, "logits")
        got = all_logits(backend, tokens, images)
        greedy = greedy_with_images(backend, tokens, images, int(golden.metadata["new_tokens"]))
        logits_ok = got.shape == expected.shape and not np.any(tolerance.excess(got, expected) > 0)
        greedy_ok = greedy == golden.require(i, "greedy_ids").tolist()
        ok &= logits_ok and greedy_ok
        delta = np.abs(got - expected).max() if got.shape == expected.shape else float("nan")
        lines.append(f"prompt {i} ({len(tokens)} tokens, {len(images)} images) {'ok' if logits_ok and greedy_ok else 'FAIL'}:"
                     f" logits max |Δ| {delta:.2g}, greedy {'agrees' if greedy_ok else 'differs'}")  # fmt: skip
    return ok, lines
