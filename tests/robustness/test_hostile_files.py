"""Corrupt files that once allocated gigabytes, recursed without end or escaped as the wrong exception.

Each is refused as a ValueError (or KeyError) naming the file and the field, within the
memory and time caps of tests/helpers/fuzz_loaders.py.
"""

from __future__ import annotations

import json
import shutil
import struct

import pytest

import refllm
from refllm.cli import main
from refllm.config import ConfigError, ModelConfig
from refllm.io.gguf import GGUFFileError
from refllm.io.safetensors import CheckpointError
from tests.helpers.fuzz_loaders import Seeds, Stats, capped, gguf_with, make_seeds, safetensors_with, with_json_field

U32, U64, STRING, ARRAY = 4, 10, 8, 9  # GGUF value types


def string(text: str) -> bytes:
    return struct.pack("<Q", len(text)) + text.encode()


def raw_gguf(metadata: bytes = b"", num_values: int = 0, tensors: bytes = b"", num_tensors: int = 0) -> bytes:
    """A GGUF file written by hand: the header fields as given, then padding to 32 bytes."""
    data = b"GGUF" + struct.pack("<IQQ", 3, num_tensors, num_values) + metadata + tensors
    return data + bytes(-len(data) % 32 + 128)


def tensor_row(name: str, dims: list[int], ggml_type: int = 0, offset: int = 0, num_dims: int | None = None) -> bytes:
    count = len(dims) if num_dims is None else num_dims
    return string(name) + struct.pack("<I", count) + struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", ggml_type, offset)


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> Seeds:
    return make_seeds(tmp_path_factory.mktemp("seeds"))


def refused(path, error=ValueError, match: str = "") -> str:
    """Load ``path`` under the caps; it must be refused as ``error`` whose message matches; return the message."""
    with pytest.raises(error, match=match) as caught, capped(Stats(), str(path)):
        refllm.load_model(path)
    return str(caught.value)


# --- GGUF ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_dims", [0xFFFFFFFF, 2**26, 5, 0])
def test_a_tiny_gguf_with_a_huge_n_dims_is_refused_at_once(tmp_path, num_dims):
    path = tmp_path / "dims.gguf"
    path.write_bytes(raw_gguf(tensors=tensor_row("token_embd.weight", [4, 4], num_dims=num_dims), num_tensors=1))
    assert len(path.read_bytes()) < 300
    refused(path, GGUFFileError, f"{path}.*n_dims = {num_dims}")


@pytest.mark.parametrize("count", [2**40, 2**62])
def test_counts_past_the_file_are_refused_before_looping(tmp_path, count):
    path = tmp_path / "counts.gguf"
    path.write_bytes(raw_gguf(num_values=count))
    refused(path, GGUFFileError, f"{count} metadata entries.*cannot fit")
    path.write_bytes(raw_gguf(metadata=string("k") + struct.pack("<IIQ", ARRAY, STRING, count), num_values=1))
    refused(path, GGUFFileError, f"{count} STRING items.*cannot fit")


def test_arrays_nested_thousands_deep_are_refused(tmp_path):
    path = tmp_path / "nested.gguf"
    nested = struct.pack("<IQ", ARRAY, 1) * 5000 + struct.pack("<IQ", U32, 1) + bytes(4)
    path.write_bytes(raw_gguf(metadata=string("k") + struct.pack("<I", ARRAY) + nested, num_values=1))
    refused(path, GGUFFileError, "nested more than")


def test_duplicate_metadata_keys_and_tensor_names_are_refused(tmp_path):
    path = tmp_path / "twice.gguf"
    entry = string("general.architecture") + struct.pack("<I", STRING) + string("llama")
    path.write_bytes(raw_gguf(metadata=entry * 2, num_values=2))
    refused(path, GGUFFileError, "'general.architecture' appears twice")
    row = tensor_row("token_embd.weight", [32])
    path.write_bytes(raw_gguf(entry, 1, row * 2, 2))
    refused(path, GGUFFileError, "'token_embd.weight' appears twice")


def test_overlapping_tensors_are_refused(tmp_path):
    path = tmp_path / "overlap.gguf"
    rows = tensor_row("output_norm.weight", [8], offset=0) + tensor_row("token_embd.weight", [4, 4], offset=16)
    path.write_bytes(raw_gguf(tensors=rows, num_tensors=2))
    refused(path, GGUFFileError, "'token_embd.weight' overlaps tensor 'output_norm.weight'")


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("llama.block_count", 2**28, "block_count gives 268435456 layers, but its tensors hold 2 layers"),
        ("llama.block_count", 2**40, r"block_count must be an integer in \[1, "),
        ("llama.attention.head_count", 0, "head_count must be an integer"),
        ("llama.context_length", 0, "context_length must be an integer"),
        ("llama.embedding_length", -4, "embedding_length must be an integer"),
        ("llama.rope.dimension_count", 2**26, r"partial_rotary_factor must be a finite number in \(0, 1\]"),
        ("llama.attention.head_count", 2**26, "rows"),
    ],
)
def test_metadata_out_of_bounds_is_refused_by_name(seeds, tmp_path, key, value, match):
    path = tmp_path / "bad.gguf"
    gguf_with(seeds.gguf, path, key, value)
    assert str(path) in refused(path, GGUFFileError, match)


def test_an_expert_count_without_its_expert_tensors_is_refused_before_anything_per_expert(seeds, tmp_path):
    with_used, path = tmp_path / "used.gguf", tmp_path / "experts.gguf"
    gguf_with(seeds.gguf, with_used, "llama.expert_used_count", 2)
    gguf_with(with_used, path, "llama.expert_count", 10**7)  # a dense llama file: a Mixtral of one tensor per expert
    message = refused(path, GGUFFileError, "metadata llama.expert_count gives 10000000 experts per sparse layer, but")
    assert str(path) in message and "its tensors hold no expert tensors" in message


def test_info_on_a_file_of_2_to_the_28_layers_is_one_sentence(seeds, tmp_path, capsys):
    path = tmp_path / "layers.gguf"
    gguf_with(seeds.gguf, path, "llama.block_count", 2**28)
    assert main(["info", str(path)]) != 0
    err = capsys.readouterr().err
    assert "268435456 layers" in err and "Traceback" not in err and "parameters" not in err


# --- Hugging Face directories ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "match"),
    [
        ("num_hidden_layers", 2**28, r"num_hidden_layers must be an integer in \[1, 1024\]"),
        ("num_hidden_layers", 3, "gives 3 layers, but its tensors hold 2 layers"),
        ("num_attention_heads", 0, "num_attention_heads must be an integer"),
        ("num_key_value_heads", 3, "must be a multiple of num_key_value_heads"),
        ("max_position_embeddings", 0, "max_position_embeddings must be an integer"),
        ("hidden_size", -32, "hidden_size must be an integer"),
        ("rms_norm_eps", "small", "rms_norm_eps must be a finite number"),
        ("rope_scaling", [1, 2], "rope_scaling must be an object; got \\[1, 2\\]"),
    ],
)
def test_config_values_out_of_bounds_are_refused_by_name(seeds, tmp_path, key, value, match):
    directory = tmp_path / "model"
    shutil.copytree(seeds.hf, directory)
    with_json_field(directory / "config.json", (key,), value)
    assert "config.json" in refused(directory, ConfigError, match)


def test_a_config_that_is_a_list_or_nested_deep_is_refused(seeds, tmp_path):
    with pytest.raises(ConfigError, match="must hold a JSON object; got list"):
        ModelConfig.from_hf([1, 2])
    directory = tmp_path / "deep"
    shutil.copytree(seeds.hf, directory)
    (directory / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    refused(directory, CheckpointError, "config.json nests its JSON too deep")
    (directory / "config.json").write_text('{"model_type": "llama", "model_type": "qwen2"}')
    refused(directory, CheckpointError, "gives the key 'model_type' twice")


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        (None, 2**62, "header length 4611686018427387904 is past"),
        ("shape", [2**40, 2**40], "takes .* bytes; its data_offsets"),
        ("shape", [-1, 4], "not a list of at most 8 sizes >= 0"),
        ("data_offsets", [0, 2**62], "not \\[begin, end\\] within"),
        ("data_offsets", [8, 4], "not \\[begin, end\\] within"),
        ("dtype", "I64", "has dtype 'I64'"),
    ],
)
def test_safetensors_header_values_are_refused_naming_file_and_tensor(seeds, tmp_path, field, value, match):
    directory = tmp_path / "model"
    shutil.copytree(seeds.hf, directory)
    safetensors_with(directory / "model.safetensors", None if field is None else "model.norm.weight", field, value)
    message = refused(directory, CheckpointError, match)
    assert "model.safetensors" in message and (field is None or "model.norm.weight" in message)


def test_a_safetensors_header_that_is_a_list_or_overlaps_is_refused(seeds, tmp_path):
    directory = tmp_path / "model"
    shutil.copytree(seeds.hf, directory)
    weights = directory / "model.safetensors"
    data = weights.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    first, second = sorted(header, key=lambda n: header[n]["data_offsets"][0])[:2]
    nbytes = header[second]["data_offsets"][1] - header[second]["data_offsets"][0]
    shift = header[first]["data_offsets"][0]
    header[second]["data_offsets"] = [shift, shift + nbytes]  # on top of the first
    encoded = json.dumps(header).encode()
    weights.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + length :])
    refused(directory, CheckpointError, "overlaps tensor")
    encoded = b"[1, 2]"
    weights.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data[8 + length :])
    refused(directory, CheckpointError, "must hold a JSON object; got list")
