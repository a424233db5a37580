"""Bad input gets a clear exception naming what was wrong, and leaves the cache as it was."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import refllm
from refllm import CacheConfig
from refllm.config import ConfigError, ModelConfig, UnsupportedArchitectureError
from refllm.errors import (
    ContextLengthError,
    InvalidInputError,
    MissingTensorError,
    PositionError,
    TokenOutOfRangeError,
    WeightError,
)
from tests.helpers.paths import HF_DATA
from tests.helpers.random_models import model_for
from tests.helpers.state import assert_same_state, snapshot

CACHE_KINDS = ["contiguous", "paged"]


@pytest.fixture(params=CACHE_KINDS)
def primed(request):
    """A model and a cache already holding 5 positions of one sequence."""
    model = model_for("llama")
    cache = model.create_kv_cache(CacheConfig(kind=request.param, block_size=4))
    model.prefill(np.arange(5)[None], cache, range(5))
    return model, cache


BAD_CALLS = {
    "token id past the vocabulary": (
        lambda m, c: m.prefill(np.array([[1, 64]]), c, range(5, 7)),
        TokenOutOfRangeError,
        "64",
    ),
    "negative token id": (lambda m, c: m.decode(np.array([[-1]]), c), TokenOutOfRangeError, "-1"),
    "pos not at the cache length": (
        lambda m, c: m.prefill(np.array([[1, 2]]), c, range(4, 6)),
        PositionError,
        "starts at 4",
    ),
    "pos longer than x": (lambda m, c: m.prefill(np.array([[1, 2]]), c, range(5, 8)), PositionError, "3 positions"),
    "pos with a step": (lambda m, c: m.prefill(np.array([[1, 2]]), c, range(5, 9, 2)), PositionError, "step"),
    "past the context length": (
        lambda m, c: m.prefill(np.zeros((1, 60), np.int64), c, range(5, 65)),
        ContextLengthError,
        "context length 64",
    ),
    "float64 embeddings": (
        lambda m, c: m.decode(np.zeros((1, 1, 32)), c),
        InvalidInputError,
        "float64",
    ),
    "rank-1 token ids": (lambda m, c: m.decode(np.array([3]), c), InvalidInputError, "shape (1,)"),
    "wrong hidden size": (
        lambda m, c: m.decode(np.zeros((1, 1, 31), np.float32), c),
        InvalidInputError,
        "[batch, seq, 32]",
    ),
    "empty x": (lambda m, c: m.prefill(np.zeros((1, 0), np.int64), c, range(5, 5)), InvalidInputError, "at least"),
    "batch size other than the cache's": (
        lambda m, c: m.decode(np.array([[1], [2]]), c),
        InvalidInputError,
        "holds sequences [0]",
    ),
    "images for a text-only model": (
        lambda m, c: m.embed_multimodal(np.array([[1]]), [object()]),
        InvalidInputError,
        "text-only",
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_input_is_refused_and_changes_nothing(primed, case):
    model, cache = primed
    call, error, message = BAD_CALLS[case]
    before = snapshot(cache)
    with pytest.raises(error, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        call(model, cache)
    assert_same_state(before, cache)
    assert issubclass(error, (ValueError, KeyError))


def test_unsupported_model_type_lists_the_supported_ones():
    with pytest.raises(UnsupportedArchitectureError, match="supported: llama, mistral"):
        ModelConfig.from_hf({"model_type": "gpt2"})


def test_missing_config_key_is_named():
    with pytest.raises(ConfigError, match="'intermediate_size'"):
        ModelConfig.from_hf(
            dict(model_type="llama", vocab_size=8, hidden_size=8, num_hidden_layers=1, num_attention_heads=2)
        )


def _copy_fixture(tmp_path, name="llama"):
    for file in (HF_DATA / name).iterdir():
        shutil.copy(file, tmp_path / file.name)
    return tmp_path


def test_missing_tensor_is_named_with_file_and_shape(tmp_path):
    directory = _copy_fixture(tmp_path)
    tensors = load_file(directory / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(MissingTensorError, match=r"model.layers.1.mlp.up_proj.weight.*\(96, 64\).*model.safetensors"):
        refllm.load_model(directory)


def test_unexpected_tensor_is_named(tmp_path):
    directory = _copy_fixture(tmp_path)
    tensors = load_file(directory / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = np.zeros(64, np.float32)
    save_file(tensors, directory / "model.safetensors")
    with pytest.raises(WeightError, match=r"unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"):
        refllm.load_model(directory)


def test_shape_disagreeing_with_config_is_named(tmp_path):
    directory = _copy_fixture(tmp_path)
    config = json.loads((directory / "config.json").read_text())
    config["intermediate_size"] = 100
    (directory / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightError, match=r"gate_proj.weight.*has shape \(96, 64\); config.json implies \(100, 64\)"):
        refllm.load_model(directory)


def test_sharded_checkpoint_loads_like_one_file(tmp_path):
    directory = _copy_fixture(tmp_path)
    tensors = load_file(directory / "model.safetensors")
    (directory / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    weight_map = {}
    for file, shard_names in shards.items():
        save_file({n: tensors[n] for n in shard_names}, directory / file)
        weight_map |= {n: file for n in shard_names}
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    sharded = refllm.load_model(directory)
    reference = np.load(HF_DATA / "llama" / "reference.npz")
    cache = sharded.create_kv_cache(CacheConfig(kind="contiguous"))
    logits = sharded.prefill_all_logits(reference["input_ids"], cache, range(reference["input_ids"].shape[1]))
    np.testing.assert_allclose(logits, reference["logits"], rtol=1e-4, atol=1e-4)


def test_directory_without_tokenizer_loads_with_none():
    assert refllm.load_model(HF_DATA / "llama").tokenizer is None


def test_float32_weights_are_memory_mapped_not_copied():
    model = refllm.load_model(HF_DATA / "llama")
    weight = model.weights.layers[0].attention.q_proj
    assert not weight.flags.owndata and not weight.flags.writeable
