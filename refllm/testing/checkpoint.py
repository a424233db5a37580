"""Checkpoint: one model's config and weights, handed to the reference and to the backend under test.

A Checkpoint is a ``ModelSource`` (so ``DecoderModel.load(checkpoint)``
builds the reference from it) that also offers what a foreign backend needs
to build the same model: the ``config.json`` dict and the weights in Hugging
Face naming and layout, in memory (``tensors``) or as files (``path``, a
directory with ``config.json`` and ``model.safetensors``).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from refllm.config import ModelConfig
from refllm.models.random import random_tensors
from refllm.models.weights import canonical_name

# A sparse layer's router rows, as each family names them (refllm/families/experts.py): [X, D] or [X].
ROUTER_TENSORS = (
    ".mlp.gate.weight",
    ".block_sparse_moe.gate.weight",
    ".mlp.router.weight",
    ".mlp.router.bias",
    ".mlp.gate.e_score_correction_bias",
)
ROUTERS = {
    "random": "",
    "duplicated": "duplicated router rows",  # experts 2j and 2j + 1 score the same, as after sparse upcycling
    "saturated": "saturated router scores",  # the duplicated rows scaled up: DeepSeek's sigmoids tie at 1 as well
}
SATURATED_ROUTER_STD = 100.0  # the saturated routers' std: logits of std ~100 sqrt(D), past where sigmoid rounds to 1


def tie_routers(tensors: dict[str, np.ndarray], router: str, std: float) -> dict[str, np.ndarray]:
    """``tensors`` with every router's scores made to tie exactly, as ``router`` says (ROUTERS)."""
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}; got {router!r}")
    tied = dict(tensors)
    for name, array in tensors.items():
        if router == "random" or not name.endswith(ROUTER_TENSORS):
            continue
        tied[name] = array[np.arange(len(array)) // 2 * 2]  # row i becomes row 2 (i // 2)
        if router == "saturated" and name.endswith("e_score_correction_bias"):  # a uniform bias: it breaks no tie
            tied[name] = np.zeros_like(array)
        elif router == "saturated" and name.endswith(".weight"):
            tied[name] = (tied[name] * np.float32(SATURATED_ROUTER_STD / std)).astype(np.float32)
    return tied


class Checkpoint:
    """config + named float32 tensors (+ the config.json they came from, + an optional tokenizer)."""

    def __init__(
        self, config_json: dict[str, Any] | None, source, description: str, seed: int | None = None, dtype="float32"
    ):
        self.config_json = config_json
        self.dtype = dtype  # of the tensors the source hands out (a GGUF file dequantizes in it)
        self.seed = seed  # of random weights; None for weights read from files
        self.config: ModelConfig = source.config
        self.tokenizer = getattr(source, "tokenizer", None)
        self.description = description
        self._source = source
        self._path: Path | None = getattr(source, "directory", None)
        self._models: dict[str, Any] = {}  # the reference models, by dtype
        self.weight_options: dict[str, Any] = {}  # Checkpoint.random's std, lm_head and router, to rebuild a drawn case

    @classmethod
    def random(
        cls, config_json: dict[str, Any], seed: int = 0, std: float = 0.1, lm_head: bool = False, router: str = "random"
    ) -> Checkpoint:
        """Seeded N(0, std) weights (norm weights near 1) for a config.json dict.

        ``lm_head``: a tied config's checkpoint also carries an ``lm_head.weight`` of its own, which
        a correct backend ignores (tied means the LM head is the embedding table). ``router``: a
        mixture of experts' router scores tie exactly (ROUTERS), so the tie rule decides which experts run
        (refllm/nn/moe.py: the lower index wins).
        """
        from refllm.models.contract import InMemorySource

        config = ModelConfig.from_hf(config_json)
        tensors = tie_routers(random_tensors(config, seed, std), router, std)
        stray = lm_head and config.tie_word_embeddings
        if stray:
            rng = np.random.default_rng(seed + 1)
            tensors["lm_head.weight"] = rng.normal(0.0, std, tensors["model.embed_tokens.weight"].shape).astype(np.float32)
        description = f"random weights, seed {seed}" + (f", std {std:g}" if std != 0.1 else "")
        description += ", stray lm_head" if stray else ""
        description += f", {ROUTERS[router]}" if router != "random" and config.experts is not None else ""
        checkpoint = cls(dict(config_json), InMemorySource(config, tensors), description, seed)
        checkpoint.weight_options = {"std": std, "lm_head": lm_head, "router": router}
        return checkpoint

    @classmethod
    def open(cls, name_or_path: str | Path, dtype: str = "float32") -> Checkpoint:
        """A catalog name, a .gguf file or a Hugging Face model directory; ``dtype`` "float64" reads
        a GGUF file's blocks in float64, so the truth model sees no float32 rounding."""
        from refllm import catalog
        from refllm.loading import open_source

        path = catalog.pull(name_or_path) if str(name_or_path) in catalog.CATALOG else name_or_path
        source = open_source(path, dtype=dtype)
        config_file = Path(path) / "config.json"
        config_json = json.loads(config_file.read_text()) if config_file.is_file() else None
        return cls(config_json, source, str(name_or_path), dtype=dtype)

    # --- ModelSource -----------------------------------------------------------------

    def tensor_names(self) -> list[str]:
        return self._source.tensor_names()

    def tensor(self, name: str) -> np.ndarray:
        return self._source.tensor(name)

    def where(self, name: str | None) -> str:
        return self._source.where(name)

    # --- for backends --------------------------------------------------------------------

    @property
    def tensors(self) -> dict[str, np.ndarray]:
        """Every tensor a text model uses, by its Hugging Face name, float32."""
        return {canonical_name(n): self.tensor(n) for n in self.tensor_names() if canonical_name(n) is not None}

    @property
    def path(self) -> Path:
        """A directory with config.json and model.safetensors (written to a temporary one on first use)."""
        if self._path is None:
            if self.config_json is None:
                raise ValueError(f"checkpoint {self.description!r} has no config.json to write")
            directory = Path(tempfile.mkdtemp(prefix="refllm-checkpoint-"))
            weakref.finalize(self, shutil.rmtree, directory, ignore_errors=True)
            self.save(directory)
            self._path = directory
        return self._path

    def save(self, directory: str | Path) -> None:
        from safetensors.numpy import save_file

        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "config.json").write_text(json.dumps(self.config_json, indent=2))
        tensors = {name: np.ascontiguousarray(array) for name, array in self.tensors.items()}
        save_file(tensors, str(directory / "model.safetensors"), metadata={"format": "pt"})

    def reference(self, dtype: str = "float32"):
        """The reference: refllm's DecoderModel over these weights with the spec ops, in ``dtype``
        (float32; float64 is the truth every error is measured against). Built once per dtype."""
        if dtype not in self._models:
            from refllm.models.decoder import DecoderModel

            self._models[dtype] = DecoderModel.load(self, dtype=dtype, reference=True)
        return self._models[dtype]

    def weights_sha256(self) -> str:
        """sha256 over the tensors in name order: name, NUL, shape (int64 LE), float32 LE bytes."""
        digest = hashlib.sha256()
        for name, array in sorted(self.tensors.items()):
            digest.update(name.encode() + b"\0")
            digest.update(np.asarray(array.shape, "<i8").tobytes())
            digest.update(np.ascontiguousarray(array, "<f4").tobytes())
        return digest.hexdigest()
