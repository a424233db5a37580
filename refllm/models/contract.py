"""The model-level contracts: what a model offers, and where its weights come from.

``GenerativeModel`` is what the runtime (and any backend checked against
refllm) talks to. ``x`` is either token ids ``[B, T]`` (any integer dtype) or
embeddings ``[B, T, D]`` in the model's dtype (``metadata.dtype``: float32, or
float64 for ground truth), as returned by ``embed``; a cache holds the
batch's sequences under ids ``0 .. B-1``; ``pos`` is the range of positions
``x`` occupies, starting at the cache's length, so a prompt can arrive in
chunks.

The runtime (``LLM``, the executors, ``Engine``, speculative decoding, the
server) talks to a model through this protocol alone. Its one ragged call,
``forward_step``, runs sequences of different lengths in one step (a batched
decode, a chunk appended to one sequence among many), each named by its own
id in the cache; ``logits`` turns its hidden states into logits.

``ModelSource`` is the seam between files and models: a config, named
tensors in Hugging Face naming and layout (float32 or float64), and an optional
tokenizer. ``refllm/io`` implements it for Hugging Face directories and GGUF
files; a test can hand a model an ``InMemorySource``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from refllm.config import ModelConfig
from refllm.kv.base import CacheConfig, KVCache


@dataclass(frozen=True)
class VisionInfo:
    """What a vision-language model takes: images [N, *image_shape] whose N tiles (or crops) each fill a run of
    ``tokens_per_tile`` image tokens; with ``bidirectional`` (Gemma 3), the tokens of one run attend to each
    other, so no step may end inside a run."""

    image_token_id: int
    tokens_per_tile: int
    image_shape: tuple[int, int, int]  # channels, height, width of one tile
    bidirectional: bool = False


@dataclass(frozen=True)
class ModelMetadata:
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    context_length: int
    num_parameters: int
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    dtype: str = "float32"
    vision: VisionInfo | None = None  # a vision-language model's images; None for a text-only model


@runtime_checkable
class GenerativeModel(Protocol):
    supports_decode_all_logits: bool
    supports_hidden_states: bool

    @property
    def metadata(self) -> ModelMetadata: ...

    def create_kv_cache(self, config: CacheConfig | None = None) -> KVCache: ...

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        """[B, T] int -> [B, T, D]."""

    def embed_multimodal(self, tokens: np.ndarray, images: list[Any]) -> np.ndarray:
        """[B, T] int, images -> [B, T, D]: each image's features spliced into its runs of image tokens.
        images: preprocessed pixel batches [N, channels, H, W], one per image in prompt order, N its tiles
        (or crops), each filling one run; text-only models keep the default, which rejects non-empty media."""

    def prefill(self, x: np.ndarray, cache: KVCache, pos: range, image_spans=None) -> np.ndarray:
        """x at positions ``pos`` -> logits of the last position, [B, V]. image_spans: per row, the (start,
        end) runs of image tokens among the positions (``metadata.vision``); a model whose image tokens
        attend to each other needs them, and refuses a step that ends inside one."""

    def decode(self, x: np.ndarray, cache: KVCache) -> np.ndarray:
        """One new position per sequence -> [B, V]."""

    def prefill_all_logits(self, x: np.ndarray, cache: KVCache, pos: range, image_spans=None) -> np.ndarray:
        """-> logits at every position, [B, T, V] (perplexity)."""

    def decode_all_logits(self, x: np.ndarray, cache: KVCache) -> np.ndarray:
        """n new positions -> [B, n, V] (speculative verification)."""

    def prefill_hidden(self, x: np.ndarray, cache: KVCache, pos: range, image_spans=None) -> np.ndarray:
        """-> final hidden states (after the final norm), [B, T, D] (embeddings)."""

    def forward_step(self, x: np.ndarray, cache: KVCache, seq_ids: Sequence[int], image_spans=None) -> np.ndarray:
        """The ragged step. x: [B, T, D] embeddings (from ``embed``); row b continues sequence
        ``seq_ids[b]`` of ``cache`` at its own length (an id the cache does not hold starts empty)
        -> final hidden states (after the final norm), [B, T, D]. The cache's other sequences are
        untouched, and a step that fails leaves every sequence as it was. image_spans: per row, the
        image runs among the step's positions (as for ``prefill``)."""

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """Final hidden states [..., D] -> logits [..., V]."""


class ModelSource(Protocol):
    """Where a model's config, weights and tokenizer come from."""

    config: ModelConfig
    tokenizer: Any  # refllm.io.tokenizer.Tokenizer or None

    def tensor_names(self) -> list[str]: ...

    def tensor(self, name: str) -> np.ndarray:
        """The named tensor, in Hugging Face layout: float32 or float64 (a float64 model keeps the precision
        a source offers), or a quantized matrix."""

    def where(self, name: str | None) -> str:
        """Where ``name`` (or, for None, the checkpoint) is stored, for error messages."""


@dataclass
class InMemorySource:
    """A ModelSource over a dict of arrays: for tests and for models built in code."""

    config: ModelConfig
    tensors: dict[str, np.ndarray]
    tokenizer: Any = None

    def tensor_names(self) -> list[str]:
        return list(self.tensors)

    def tensor(self, name: str) -> np.ndarray:
        array = np.asarray(self.tensors[name])
        return array if array.dtype == np.float64 else np.asarray(array, np.float32)

    def where(self, name: str | None) -> str:
        return "the in-memory checkpoint"
