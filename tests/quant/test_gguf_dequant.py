"""refllm's dequantization spec equals gguf's own, bit for bit, for every format refllm reads.

Tensors are written with ``gguf.GGUFWriter`` and read back with ``gguf.GGUFReader``,
then dequantized by both. Formats gguf can quantize are made with
``gguf.quants.quantize``; for the K-quants (which gguf only dequantizes) the
blocks are random bytes whose float16 scale fields are set to finite values.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.quant import FORMATS, UnsupportedFormatError, block_format, dequantize

QUANTIZABLE = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"]
K_QUANTS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
# Byte offsets of each format's float16 fields (scales, mins) within a block.
F16_FIELDS = {
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}  # fmt: skip


def qtype(name: str) -> gguf.GGMLQuantizationType:
    return gguf.GGMLQuantizationType[name]


def random_blocks(name: str, num_blocks: int, rng: np.random.Generator) -> np.ndarray:
    """[num_blocks, type_size] random bytes, with finite float16 scales where the format has them."""
    fmt = block_format(name)
    blocks = rng.integers(0, 256, size=(num_blocks, fmt.type_size), dtype=np.uint8)
    for offset in F16_FIELDS.get(name, []):
        scales = (rng.standard_normal(num_blocks) * 0.05).astype(np.float16)
        blocks[:, offset : offset + 2] = scales.view(np.uint8).reshape(num_blocks, 2)
    return blocks


def stored_tensor(name: str, rows: int, blocks_per_row: int, rng: np.random.Generator) -> np.ndarray:
    """A [rows, cols] tensor in format ``name``, as GGUFWriter takes it (floats, or raw bytes)."""
    fmt = block_format(name)
    cols = blocks_per_row * fmt.block_size * (32 if fmt.block_size == 1 else 1)
    if name in QUANTIZABLE:
        values = rng.standard_normal((rows, cols)).astype(np.float32)
        return values if name == "F32" else gguf.quants.quantize(values, qtype(name))
    return random_blocks(name, rows * blocks_per_row, rng).reshape(rows, -1)


def write_and_read(path, tensors: dict[str, tuple[str, np.ndarray]]) -> gguf.GGUFReader:
    writer = gguf.GGUFWriter(path, "llama")
    for tensor_name, (name, data) in tensors.items():
        raw_dtype = None if name in ("F32", "F16") else qtype(name)
        writer.add_tensor(tensor_name, data, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return gguf.GGUFReader(path)


def assert_bitwise_equal(ours: np.ndarray, theirs: np.ndarray) -> None:
    assert ours.dtype == np.float32 and theirs.dtype == np.float32
    assert ours.shape == theirs.shape
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_block_table_matches_gguf():
    for name, fmt in FORMATS.items():
        assert (fmt.block_size, fmt.type_size) == gguf.GGML_QUANT_SIZES[qtype(name)], name


@pytest.mark.parametrize("rows", [1, 3, 7])
@pytest.mark.parametrize("name", QUANTIZABLE + K_QUANTS)
def test_written_tensor_dequantizes_like_gguf(name, rows, tmp_path):
    rng = np.random.default_rng([rows, *name.encode()])
    reader = write_and_read(tmp_path / "t.gguf", {"t": (name, stored_tensor(name, rows, 3, rng))})
    tensor = reader.tensors[0]
    assert tensor.tensor_type.name == name
    shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists dims innermost first
    assert shape[0] == rows
    theirs = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
    assert_bitwise_equal(dequantize(tensor.data, name, shape), theirs)


def test_many_tensors_in_one_file_each_dequantize_like_gguf(tmp_path):
    rng = np.random.default_rng(0)
    names = QUANTIZABLE + K_QUANTS
    reader = write_and_read(tmp_path / "t.gguf", {f"t.{n}": (n, stored_tensor(n, 5, 2, rng)) for n in names})
    for tensor in reader.tensors:
        shape = tuple(int(n) for n in reversed(tensor.shape))
        theirs = gguf.quants.dequantize(tensor.data, tensor.tensor_type).reshape(shape)
        assert_bitwise_equal(dequantize(tensor.data, tensor.tensor_type.name, shape), theirs)


@pytest.mark.parametrize("name", [n for n in FORMATS if n not in ("F32", "F16", "BF16")])
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), blocks_per_row=st.integers(1, 4), seed=st.integers(0, 2**32 - 1))
def test_random_blocks_dequantize_like_gguf(name, rows, blocks_per_row, seed):
    fmt = block_format(name)
    raw = random_blocks(name, rows * blocks_per_row, np.random.default_rng(seed)).reshape(rows, -1)
    shape = (rows, blocks_per_row * fmt.block_size)
    theirs = gguf.quants.dequantize(raw, qtype(name)).reshape(shape)
    assert_bitwise_equal(dequantize(raw, name, shape), theirs)


@pytest.mark.parametrize("name", ["F32", "F16", "BF16"])
@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 9), cols=st.integers(1, 40), seed=st.integers(0, 2**32 - 1))
def test_float_formats_keep_every_bit_pattern(name, rows, cols, seed):
    """Any bits, NaN and infinity included, widen to float32 exactly as gguf widens them."""
    width = block_format(name).type_size
    raw = np.random.default_rng(seed).integers(0, 256, size=(rows, cols * width), dtype=np.uint8)
    theirs = gguf.quants.dequantize(raw, qtype(name))
    assert_bitwise_equal(dequantize(raw, name, (rows, cols)), theirs.reshape(rows, cols))


def test_unsupported_format_is_refused_by_name():
    with pytest.raises(UnsupportedFormatError, match="IQ2_XXS"):
        dequantize(np.zeros(66, np.uint8), "IQ2_XXS", (256,))
    assert issubclass(UnsupportedFormatError, ValueError)


def test_wrong_byte_count_or_partial_block_is_refused():
    with pytest.raises(ValueError, match="takes 68 bytes; got 34"):
        dequantize(np.zeros(34, np.uint8), "Q8_0", (2, 32))
    with pytest.raises(UnsupportedFormatError, match="whole number of 32-weight blocks"):
        dequantize(np.zeros(34, np.uint8), "Q8_0", (1, 16))
