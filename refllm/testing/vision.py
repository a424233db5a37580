"""The oracle kit for images: draw tiny vision-language checkpoints and prompts with images, check a backend.

A backend here is a ``GenerativeModel`` with images (``embed_multimodal`` and the forward methods'
``image_spans``), built from a ``VisionCheckpoint``; refllm's spec path on the same checkpoint is
the reference. The properties:

    check_image_embeddings   embed_multimodal: features spliced into the right runs, within the profile
    check_image_logits       the logits at every position, the backend fed in chunks whose boundaries
                             move out of image runs (``image_prompts.chunk_ends``), against the whole prompt
    check_pixels             a preprocessor's pixel values against refllm's, within a stated number of
                             8-bit levels (refllm equals transformers' PIL processors; docs/layers/vision.md)

and golden files that carry their images (``dump_vision_golden``, ``check_vision_golden``;
docs/golden-format.md). Strategies: ``vision_configs`` (both families, odd patch grids, shuffle
and pooling factors, sliding windows shorter than an image), ``vision_checkpoints`` and
``image_prompts`` (several images per prompt, tiles or crops of any count, text between them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import strategies as st

from refllm.families.vision import MultimodalConfig, read_multimodal
from refllm.config import ModelConfig
from refllm.kv import CacheConfig
from refllm.models.connector import connector_shapes
from refllm.models.contract import InMemorySource
from refllm.models.multimodal import VisionLanguageModel
from refllm.models.random import random_tensors
from refllm.models.vision_tower import vision_tower_shapes
from refllm.runtime.image_prompts import chunk_ends
from refllm.testing.configs import tiny_config_json
from refllm.testing.tolerances import Tolerance, get_profile

FAMILIES = ("idefics3", "gemma3")


@st.composite
def vision_configs(draw: st.DrawFn, families: tuple[str, ...] = FAMILIES) -> dict[str, Any]:
    """A tiny vision-language config.json: a patch grid of side S = tokens_side * scale, S * patch pixels."""
    family = draw(st.sampled_from(families))
    scale, tokens_side, patch = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    heads = draw(st.integers(1, 3))
    vision = dict(hidden_size=heads * draw(st.integers(2, 5)), intermediate_size=draw(st.integers(3, 17)),
                  num_hidden_layers=draw(st.integers(1, 2)), num_attention_heads=heads, num_channels=3,
                  image_size=tokens_side * scale * patch, patch_size=patch, layer_norm_eps=1e-6)  # fmt: skip
    if family == "idefics3":
        text = tiny_config_json("llama") | {"max_position_embeddings": 512}  # room for several images
        return dict(model_type="idefics3", text_config=text, vision_config=vision, scale_factor=scale,
                    image_token_id=text["vocab_size"] - 1, tie_word_embeddings=False)  # fmt: skip
    window = draw(st.integers(2, 6))  # often shorter than an image
    text = tiny_config_json("gemma3_text", sliding_window=window) | {"max_position_embeddings": 512}
    return dict(model_type="gemma3", text_config=text, vision_config=vision | {"model_type": "siglip_vision_model"},
                mm_tokens_per_image=tokens_side**2, image_token_index=text["vocab_size"] - 1)  # fmt: skip


@dataclass
class VisionCheckpoint:
    """A vision-language model's config.json and its weights (Hub names), as a backend would be built from."""

    config_json: dict[str, Any]
    tensors: dict[str, np.ndarray]
    seed: int

    @property
    def config(self) -> ModelConfig:
        return ModelConfig.from_hf(self.config_json)

    @property
    def multimodal(self) -> MultimodalConfig:
        return read_multimodal(self.config_json, self.config.hidden_size)

    def source(self) -> InMemorySource:
        return InMemorySource(self.config, self.tensors)

    def reference(self, dtype: str = "float32") -> VisionLanguageModel:
        """refllm's spec path on these weights (float64: the truth)."""
        tensors = {name: value.astype(dtype) for name, value in self.tensors.items()}
        return VisionLanguageModel.load(InMemorySource(self.config, tensors), self.multimodal, dtype, reference=True)

    def save(self, directory: str | Path) -> Path:
        from safetensors.numpy import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(self.config_json, indent=2))
        save_file(self.tensors, str(directory / "model.safetensors"))
        return directory


def random_vision_checkpoint(config_json: dict[str, Any], seed: int = 0, std: float = 0.2) -> VisionCheckpoint:
    """Seeded N(0, std) weights for every tensor of the text model, the tower and the connector (norms near 1)."""
    config = ModelConfig.from_hf(config_json)
    multimodal = read_multimodal(config_json, config.hidden_size)
    tensors = random_tensors(config, seed, std)
    rng = np.random.default_rng(seed + 1)
    tower, connector = multimodal.tower_prefixes[0], multimodal.connector_prefixes[0]  # as the Hub's files name them
    shapes = {tower + k: v for k, v in vision_tower_shapes(multimodal.vision).items()}
    shapes |= {connector + k: v for k, v in connector_shapes(multimodal).items()}
    for name, shape in shapes.items():
        values = rng.normal(0.0, std, size=shape)
        if name.endswith(("layer_norm1.weight", "layer_norm2.weight", "post_layernorm.weight")):
            values += 1.0  # LayerNorm weights near 1; Gemma's soft-embedding norm stores w - 1, near 0
        tensors[name] = values.astype(np.float32)
    return VisionCheckpoint(dict(config_json), tensors, seed)


def vision_checkpoints(configs: st.SearchStrategy | None = None) -> st.SearchStrategy[VisionCheckpoint]:
    return st.builds(random_vision_checkpoint, configs or vision_configs(), st.integers(0, 2**16))


@st.composite
def image_prompts(draw: st.DrawFn, multimodal: MultimodalConfig, vocab_size: int,
                  max_images: int = 3) -> tuple[list[int], list[np.ndarray]]:  # fmt: skip
    """(token ids, images): text tokens, and between them 0 .. max_images images of 1 .. 3 tiles (crops), each
    tile a run of image tokens, each image random pixels of the model's shape."""
    image_token, L = multimodal.image_token_id, multimodal.tokens_per_image
    text = st.lists(st.integers(1, vocab_size - 2), min_size=0, max_size=5)
    tokens, images = draw(st.lists(st.integers(1, vocab_size - 2), min_size=1, max_size=5)), []
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    side, channels = multimodal.vision.image_size, multimodal.vision.num_channels
    for _ in range(draw(st.integers(0, max_images))):
        tiles = draw(st.integers(1, 3))
        for _ in range(tiles):
            tokens += [image_token] * L + draw(st.lists(st.integers(1, vocab_size - 2), min_size=1, max_size=3))
        images.append(rng.uniform(-1.0, 1.0, (tiles, channels, side, side)).astype(np.float32))
    return tokens + draw(text), images


# ---- properties ---------------------------------------------------------------------------------------------


def _runs(model, tokens: list[int]) -> list[tuple[int, int]]:
    return model.image_spans(tokens) if hasattr(model, "image_spans") else []


def all_logits(
    model, tokens: list[int], images: list[np.ndarray], chunk_tokens: int | None = None, cache_config=None
) -> np.ndarray:
    """[T, V] at every position, the prompt fed in steps that end only outside image runs, over the model's
    default cache (or ``cache_config``'s)."""
    ids = np.asarray(tokens)[None]
    x = model.embed_multimodal(ids, images)
    cache = model.create_kv_cache(cache_config)
    runs = [(a, b) for a, b in _runs(model, tokens)] if images else []
    rows, start = [], 0
    for end in chunk_ends(0, len(tokens), chunk_tokens or len(tokens), runs):
        rows.append(model.prefill_all_logits(x[:, start:end], cache, range(start, end), image_spans=[runs])[0])
        start = end
    return np.concatenate(rows)


def check_image_embeddings(backend, reference, tokens, images, profile: str | Tolerance = "float32") -> None:
    """The backend's ``embed_multimodal`` against the reference's; AssertionError naming the worst position."""
    ids = np.asarray(tokens)[None]
    got, want = np.asarray(backend.embed_multimodal(ids, images))[0], reference.embed_multimodal(ids, images)[0]
    if not get_profile(profile).close(got, want):
        worst = int(np.argmax(np.abs(got - want).max(axis=-1)))
        kind = "an image token" if tokens[worst] == reference.multimodal.image_token_id else "a text token"
        raise AssertionError(f"embeddings differ most at position {worst} ({kind}): max |Δ| {np.abs(got - want).max():.3g}")


def check_image_logits(backend, reference, tokens, images, chunk_tokens: int | None = None,
                       profile: str | Tolerance = "float32") -> None:  # fmt: skip
    """The backend's logits at every position, fed in chunks, against the reference's over the whole prompt."""
    contiguous = CacheConfig(kind="contiguous")
    got, want = all_logits(backend, tokens, images, chunk_tokens), all_logits(reference, tokens, images, None, contiguous)
    tolerance = get_profile(profile)
    excess = tolerance.excess(got, want)
    if np.any(excess > 0):
        worst = int(np.unravel_index(np.argmax(excess), excess.shape)[0])
        raise AssertionError(
            f"logits differ at position {worst} of {len(tokens)} (chunks of {chunk_tokens or len(tokens)}):"
            f" max |Δ| {np.abs(got - want).max():.3g}, allowed {tolerance.describe()}"
        )


def check_pixels(pixels: np.ndarray, expected: np.ndarray, levels: int = 0, std: float = 0.5) -> None:
    """A preprocessor's pixel values [N, C, S, S] against refllm's: within ``levels`` 8-bit levels (after
    normalisation by ``std``), the same shape and float32."""
    if np.shape(pixels) != np.shape(expected):
        raise AssertionError(f"pixel values have shape {np.shape(pixels)}, refllm's {np.shape(expected)}")
    worst = float(np.abs(np.asarray(pixels, np.float64) - expected).max()) * std * 255
    if worst > levels + 1e-3:
        raise AssertionError(f"pixel values differ by {worst:.2f} levels of 255; {levels} allowed")
