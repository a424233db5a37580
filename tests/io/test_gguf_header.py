"""refllm's GGUF header reader against gguf's own reader (``gguf.GGUFReader``), the oracle.

Files are written by gguf's writer, of either byte order, with metadata drawn at random;
every value ``read_header`` gives must be what the reader's ``contents()`` gives, and every
row of the tensor table must name the bytes the reader's tensor does.
"""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm.io.gguf_header import GGUFHeaderError, read_header
from tests.helpers.gguf_convert import GGUF_ARCHITECTURES, convert
from tests.helpers.paths import TOKENIZER_SUITE

INTEGER_TYPES = {
    gguf.GGUFValueType.UINT8: (0, 2**8 - 1), gguf.GGUFValueType.INT8: (-(2**7), 2**7 - 1),
    gguf.GGUFValueType.UINT16: (0, 2**16 - 1), gguf.GGUFValueType.INT16: (-(2**15), 2**15 - 1),
    gguf.GGUFValueType.UINT32: (0, 2**32 - 1), gguf.GGUFValueType.INT32: (-(2**31), 2**31 - 1),
    gguf.GGUFValueType.UINT64: (0, 2**64 - 1), gguf.GGUFValueType.INT64: (-(2**63), 2**63 - 1),
}  # fmt: skip


@st.composite
def values(draw: st.DrawFn) -> tuple[gguf.GGUFValueType, object, gguf.GGUFValueType | None]:
    """(value type, value, item type of an array) as gguf's writer takes them."""
    others = ("FLOAT32", "FLOAT64", "BOOL", "STRING", "ARRAY")
    kind = draw(st.sampled_from([*INTEGER_TYPES, *(gguf.GGUFValueType[name] for name in others)]))
    if kind in INTEGER_TYPES:
        return kind, draw(st.integers(*INTEGER_TYPES[kind])), None
    if kind == gguf.GGUFValueType.FLOAT32:
        return kind, draw(st.floats(width=32)), None
    if kind == gguf.GGUFValueType.FLOAT64:
        return kind, draw(st.floats()), None
    if kind == gguf.GGUFValueType.BOOL:
        return kind, draw(st.booleans()), None
    if kind == gguf.GGUFValueType.STRING:
        return kind, draw(st.text()), None
    item = draw(st.sampled_from([gguf.GGUFValueType.INT32, gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.STRING]))
    items = {
        gguf.GGUFValueType.INT32: st.integers(*INTEGER_TYPES[gguf.GGUFValueType.INT32]),
        gguf.GGUFValueType.FLOAT32: st.floats(width=32),
        gguf.GGUFValueType.STRING: st.text(),
    }[item]
    return kind, draw(st.lists(items, min_size=1, max_size=20)), item  # the writer refuses empty arrays


def same(ours: object, theirs: object) -> bool:
    """Equal values of equal Python types, lists item by item; NaN is NaN."""
    if isinstance(theirs, list):
        return isinstance(ours, list) and len(ours) == len(theirs) and all(map(same, ours, theirs))
    if isinstance(theirs, float) and theirs != theirs:
        return isinstance(ours, float) and ours != ours
    return type(ours) is type(theirs) and ours == theirs


def assert_same_as_ggufs_reader(path) -> None:
    reader = gguf.GGUFReader(path)
    ours = read_header(np.memmap(path, mode="r"))
    expected = {name: field.contents() for name, field in reader.fields.items() if not name.startswith("GGUF.")}
    assert list(ours.metadata) == list(expected)
    for key, value in expected.items():
        assert same(ours.metadata[key], value), key
    assert ours.data_offset == reader.data_offset
    assert [t.name for t in ours.tensors] == [t.name for t in reader.tensors]
    for row, tensor in zip(ours.tensors, reader.tensors, strict=True):
        assert row.shape == tuple(int(n) for n in reversed(tensor.shape)) and row.type == tensor.tensor_type
        assert (row.offset, row.nbytes, row.num_elements) == (tensor.data_offset, tensor.n_bytes, tensor.n_elements)


@settings(max_examples=40, deadline=None)
@given(metadata=st.dictionaries(st.text(min_size=1), values(), max_size=8), big_endian=st.booleans())
def test_metadata_of_either_byte_order_reads_as_ggufs_reader_reads_it(metadata, big_endian, tmp_path_factory):
    path = tmp_path_factory.mktemp("header") / "random.gguf"
    writer = gguf.GGUFWriter(path, "llama", endianess=gguf.GGUFEndian.BIG if big_endian else gguf.GGUFEndian.LITTLE)
    for key, (kind, value, item) in metadata.items():
        if key not in ("general.architecture", "general.alignment"):
            writer.add_key_value(key, value, kind, sub_type=item)
    writer.add_tensor("a", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert_same_as_ggufs_reader(path)


@pytest.mark.parametrize("case", sorted(GGUF_ARCHITECTURES))
@pytest.mark.parametrize("tensor_type", ["F32", "Q8_0"])
def test_converted_checkpoints_read_as_ggufs_reader_reads_them(case, tensor_type, tmp_path):
    assert_same_as_ggufs_reader(convert(case, tmp_path / "model.gguf", tensor_type))


@pytest.mark.skipif(not TOKENIZER_SUITE.is_dir(), reason=f"no tokenizer suite at {TOKENIZER_SUITE}")
def test_the_tokenizer_suites_vocabularies_read_as_ggufs_reader_reads_them():
    paths = sorted(TOKENIZER_SUITE.glob("*.gguf"))
    assert paths
    for path in paths:
        assert_same_as_ggufs_reader(path)


def test_a_file_that_is_not_gguf_or_is_cut_short_is_refused(tmp_path):
    path = convert("llama", tmp_path / "model.gguf")
    data = path.read_bytes()
    with pytest.raises(GGUFHeaderError, match="magic"):
        read_header(b"GGUG" + data[4:])
    with pytest.raises(GGUFHeaderError, match="version 7"):
        read_header(data[:4] + (7).to_bytes(4, "little") + data[8:])
    header = read_header(data)
    with pytest.raises(GGUFHeaderError, match="past the end"):
        read_header(data[: header.data_offset])  # the table names bytes the file no longer has
