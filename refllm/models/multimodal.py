"""VisionLanguageModel: a text model with a vision tower in front (SmolVLM, Gemma 3 with vision).

One step comes before the text model's token path:

    images [N, C, S, S] -> vision tower (vision_tower.py) -> connector (connector.py) -> [N, L, D]
    token ids -> embed -> the image tokens' rows replaced by the features, in order -> the text model

``embed_multimodal(tokens, images)`` does it: ``images`` are preprocessed pixel batches, one
per image, in the order the images appear; image i of N_i tiles (or crops) fills the next
N_i runs of image tokens, each run L = ``tokens_per_image`` long. A count or a length that
does not match is refused, naming both.

Gemma 3's image tokens attend to each other within their image: the forward methods take
``image_spans``, per row the (start, end) runs of image tokens a step holds, and refuse a
step that ends inside one (``image_spans.spans_in_step``). SmolVLM's text model is causal
throughout; it ignores them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from refllm.config import ModelConfig
from refllm.errors import InvalidInputError, TokenOutOfRangeError
from refllm.families.vision import MultimodalConfig
from refllm.kv import KVCache
from refllm.models.attention import Spans
from refllm.models.connector import connector_block, load_connector
from refllm.models.contract import ModelMetadata, ModelSource, VisionInfo
from refllm.models.decoder import DecoderModel, dtype_name
from refllm.models.image_spans import check_images, image_token_runs, spans_in_step
from refllm.models.ops import OpSet
from refllm.models.vision_tower import VisionTowerWeights, load_vision_tower, vision_tower
from refllm.models.weights import ModelWeights, assemble

class VisionLanguageModel(DecoderModel):
    """The text model's whole contract, plus images through ``embed_multimodal``."""

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        multimodal: MultimodalConfig,
        tower: VisionTowerWeights,
        connector: dict[str, np.ndarray],
        tokenizer: Any = None,
        dtype: str = "float32",
        reference: bool | None = None,
        image_processor: Any = None,
    ):
        """The text model's arguments (``DecoderModel``), the tower's and connector's weights in the same
        dtype, and the checkpoint's image processor (``refllm.io.image_processing``), if it has one."""
        self.multimodal = multimodal
        self.tower = tower
        self.connector_tensors = connector
        self.image_processor = image_processor
        super().__init__(config, weights, tokenizer, dtype, reference)

    def _build(self, ops: OpSet, weights: ModelWeights) -> None:
        """The text model's blocks, and the connector its family names (``with_ops`` builds them anew)."""
        super()._build(ops, weights)
        self.connector = connector_block(self.connector_tensors, self.multimodal, ops)

    @classmethod
    def load(
        cls, source: ModelSource, multimodal: MultimodalConfig, dtype: str = "float32", reference: bool | None = None
    ) -> VisionLanguageModel:
        """The text model, the tower and the connector, all from ``source``."""
        float_type = np.dtype(dtype_name(dtype))
        weights = assemble(source.config, source, float_type)
        names = set(source.tensor_names())
        tower_prefix = _prefix(multimodal.tower_prefixes, "embeddings.patch_embedding.weight", names)
        connector_prefix = _prefix(multimodal.connector_prefixes, "", names)
        tower = load_vision_tower(source, multimodal.vision, tower_prefix, float_type)
        connector = load_connector(source, multimodal, connector_prefix, float_type)
        processor = getattr(source, "image_processor", None)
        return cls(source.config, weights, multimodal, tower, connector, source.tokenizer, dtype, reference, processor)

    @property
    def vision(self) -> VisionInfo:
        m = self.multimodal
        shape = (m.vision.num_channels, m.vision.image_size, m.vision.image_size)
        return VisionInfo(m.image_token_id, m.tokens_per_image, shape, m.bidirectional_image_attention)

    @property
    def metadata(self) -> ModelMetadata:
        text = super().metadata
        parameters = text.num_parameters + self.multimodal.num_parameters
        return replace(text, architecture=self.multimodal.model_type, num_parameters=parameters, vision=self.vision)

    # ---- images ---------------------------------------------------------------------------------

    def image_features(self, pixels: np.ndarray) -> np.ndarray:
        """pixels: [N, C, S, S] (checked by ``embed_multimodal``) -> the image tokens' embeddings [N, L, D]."""
        features = vision_tower(pixels, self.tower, self.multimodal.vision, self.ops)  # [N, P, Dv]
        return self.connector(features)

    def embed_multimodal(self, tokens: np.ndarray, images: Sequence[np.ndarray] | None) -> np.ndarray:
        """tokens [B, T] int, images: one pixel batch [N_i, C, S, S] per image, in prompt order (rows in
        turn) -> embeddings [B, T, D] with each run of image tokens holding its tile's features."""
        tokens = self._check_prompt(tokens)
        runs = [image_token_runs(row, self.multimodal.image_token_id) for row in tokens]
        images = check_images(images, [run for row in runs for run in row], self.vision)
        is_image = tokens == self.multimodal.image_token_id
        x = self.embed(np.where(is_image, 0, tokens))  # the placeholder's id may lie past the vocabulary
        if images:
            pixels = np.concatenate(images).astype(self.dtype, copy=False)
            x[is_image] = self.image_features(pixels).reshape(-1, x.shape[-1])  # row-major: the runs' order
        return x

    def image_spans(self, tokens: Sequence[int]) -> list[tuple[int, int]]:
        """tokens: [T] -> the (start, end) runs of image tokens in it."""
        return image_token_runs(tokens, self.multimodal.image_token_id)

    # ---- the forward methods, with the image spans of the step --------------------------------

    def prefill(self, x: np.ndarray, cache: KVCache, pos: range, image_spans: Spans = None) -> np.ndarray:
        return super().prefill(x, cache, pos, self._spans_at(image_spans, x, [pos.start] * len(x)))

    def prefill_all_logits(self, x: np.ndarray, cache: KVCache, pos: range, image_spans: Spans = None) -> np.ndarray:
        return super().prefill_all_logits(x, cache, pos, self._spans_at(image_spans, x, [pos.start] * len(x)))

    def prefill_hidden(self, x: np.ndarray, cache: KVCache, pos: range, image_spans: Spans = None) -> np.ndarray:
        return super().prefill_hidden(x, cache, pos, self._spans_at(image_spans, x, [pos.start] * len(x)))

    def forward_step(
        self, x: np.ndarray, cache: KVCache, seq_ids: Sequence[int], image_spans: Spans = None
    ) -> np.ndarray:
        starts = [cache.length(s) if s in cache else 0 for s in seq_ids]
        return super().forward_step(x, cache, seq_ids, self._spans_at(image_spans, x, starts))

    # ---- validation -------------------------------------------------------------------------------

    def _spans_at(self, image_spans: Spans, x: Any, starts: list[int]) -> Spans:
        """The spans the attention needs for a step whose rows start at ``starts``, checked to end within the
        step, when an image's tokens see each other; None for a causal text model or a step without images."""
        if image_spans is None or not self.multimodal.bidirectional_image_attention:
            return None
        x = self._check_x(x)
        if not isinstance(image_spans, Sequence) or len(image_spans) != len(starts):
            raise InvalidInputError(f"image_spans must hold one list of (start, end) per row ({len(starts)})")
        steps = []
        for start, row in zip(starts, image_spans):
            runs = [_span(span) for span in row]
            steps.append(spans_in_step(runs, start, start + x.shape[1]))
        return steps if any(steps) else None

    def _check_prompt(self, tokens: Any) -> np.ndarray:
        """Token ids [B, T], the image token allowed even past the text vocabulary."""
        tokens = np.asarray(tokens)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer):
            raise InvalidInputError(f"tokens must be an integer array [batch, seq]; got {tokens.dtype} {tokens.shape}")
        bad = ((tokens < 0) | (tokens >= self.config.vocab_size)) & (tokens != self.multimodal.image_token_id)
        if bad.any():
            raise TokenOutOfRangeError(f"token id {tokens[bad][0]} is outside the vocabulary [0, {self.config.vocab_size})")
        return tokens


def _span(span: Any) -> tuple[int, int]:
    if not (isinstance(span, Sequence) and len(span) == 2 and all(isinstance(v, (int, np.integer)) for v in span)):
        raise InvalidInputError(f"an image span is a (start, end) pair of positions; got {span!r:.60}")
    start, end = int(span[0]), int(span[1])
    if not 0 <= start < end:
        raise InvalidInputError(f"an image span must have 0 <= start < end; got ({start}, {end})")
    return start, end


def _prefix(candidates: tuple[str, ...], probe: str, names: set[str]) -> str:
    """The first prefix under which the checkpoint holds tensors (one holding ``probe``, when given)."""
    for prefix in candidates:
        if any(name.startswith(prefix + probe) for name in names):
            return prefix
    return candidates[0]  # absent: the loader names the tensor it misses
