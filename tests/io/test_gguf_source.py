"""GGUFSource: metadata, names and converter quirks mapped back to Hugging Face's, and refusals.

The Hugging Face fixtures of ``tests/data/hf`` are converted to GGUF
(``tests/helpers/gguf_convert.py``) the way llama.cpp's ``convert_hf_to_gguf.py``
converts a checkpoint: its metadata keys, gguf's own tensor-name map, the q/k row
permutation of ``llama`` files and the +1 on Gemma's norm weights. Loading the
result must give back the model that transformers' reference outputs were
recorded from.
"""

from __future__ import annotations

import re
from pathlib import Path

import gguf
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refllm
from refllm import DecoderModel
from refllm.errors import MissingTensorError, WeightError
from refllm.families.gemma import GEMMA3_LOCAL_ROPE_THETA
from refllm.io.gguf import (
    GGUFFileError,
    GGUFSource,
    hf_name,
    permute,
    reverse_permute,
)
from refllm.io.safetensors import HFDirectorySource
from refllm.loading import ModelNotFoundError
from refllm.quant.linear import QuantizedTensor
from refllm.recipe import NormPlacement, QKNorm
from tests.helpers.gguf_convert import convert, float32_eps
from tests.helpers.hf_fixtures import NEW_TOKENS
from tests.helpers.parity import ATOL, RTOL, all_logits, greedy
from tests.helpers.paths import HF_DATA

# Fixtures whose every hyper-parameter a GGUF file can carry, with the tensor type to store them in
# (the dtype the fixture's safetensors hold, so storing loses nothing).
EXACT_CASES = {
    "llama": "F32",
    "llama-bias-tied": "F32",
    "llama-linear-rope": "F32",
    "qwen2": "BF16",
    "qwen3": "F16",
    "phi3": "F32",
}
GEMMA_CASES = ["gemma3_text", "gemma3_text-softcap"]


# ---- round trips through the converter ----------------------------------------------------------------


@pytest.mark.parametrize("case", list(EXACT_CASES))
def test_converted_fixture_is_the_hugging_face_model(case, tmp_path):
    model = refllm.load_model(convert(case, tmp_path / f"{case}.gguf", EXACT_CASES[case]))
    hf_model = refllm.load_model(HF_DATA / case)
    # GGUF stores the epsilon as a float32; the norm computes in float32 either way.
    assert model.config == float32_eps(hf_model.config)
    reference = np.load(HF_DATA / case / "reference.npz")
    ids = reference["input_ids"]
    np.testing.assert_array_equal(all_logits(model, ids), all_logits(hf_model, ids))
    if EXACT_CASES[case] == "F32":  # transformers' outputs were recorded from float32 weights
        np.testing.assert_allclose(all_logits(model, ids), reference["logits"], ATOL, RTOL)
        assert greedy(model, ids, NEW_TOKENS) == reference["greedy"].tolist()


@pytest.mark.parametrize("case", list(EXACT_CASES) + GEMMA_CASES)
def test_tensors_come_back_in_hugging_face_names_and_layout(case, tmp_path):
    hf = HFDirectorySource(HF_DATA / case)
    source = GGUFSource(convert(case, tmp_path / f"{case}.gguf", "F32"))
    assert sorted(source.tensor_names()) == sorted(hf.tensor_names())
    for name in hf.tensor_names():
        # Gemma's norms went through w + 1 - 1 in float32, which may round the last bit.
        np.testing.assert_allclose(source.tensor(name), hf.tensor(name), rtol=0, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("case", GEMMA_CASES)
def test_gemma3_takes_the_hyper_parameters_its_gguf_omits_from_the_architecture(case, tmp_path):
    """Gemma 3 GGUFs carry no layer pattern, local RoPE base or query scale; llama.cpp's values apply."""
    hf_config = HFDirectorySource(HF_DATA / case).config
    model = refllm.load_model(convert(case, tmp_path / f"{case}.gguf"))
    c = model.config
    assert c.layer_types == ("sliding_attention",) * 2  # every sixth layer is global; these two are not
    assert c.rope["sliding_attention"].theta == GEMMA3_LOCAL_ROPE_THETA
    assert c.rope["sliding_attention"].rope_type == "default"
    assert c.rope["full_attention"] == hf_config.rope["full_attention"]  # incl. linear scaling (softcap case)
    assert c.attention.scale == c.attention.head_dim**-0.5  # query_pre_attn_scalar = head_dim below 27B
    assert (c.norms.weight_offset, c.norms.placement) == (1.0, NormPlacement.SANDWICH)
    assert c.attention.qk_norm is QKNorm.PER_HEAD
    assert c.embedding_scale == hf_config.embedding_scale
    assert c.final_logit_softcapping == hf_config.final_logit_softcapping
    assert c.tie_word_embeddings
    # Everything else is the fixture's model: the same forward pass as its Hugging Face
    # checkpoint run with the hyper-parameters the GGUF implies.
    expected = DecoderModel.load(HFDirectorySource(HF_DATA / case))
    expected = DecoderModel(
        hf_config.with_overrides(layer_types=c.layer_types, rope=c.rope, attention=c.attention),
        expected.weights,
    )
    ids = np.load(HF_DATA / case / "reference.npz")["input_ids"]
    np.testing.assert_allclose(all_logits(model, ids), all_logits(expected, ids), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tensor_type", ["Q8_0", "Q4_0", "BF16"])
def test_quantized_tensors_load_as_their_dequantized_values(tensor_type, tmp_path):
    source = GGUFSource(convert("qwen3", tmp_path / "q.gguf", tensor_type))
    name = "model.layers.1.mlp.down_proj.weight"
    qtype = gguf.GGMLQuantizationType[tensor_type]
    raw = gguf.quants.quantize(HFDirectorySource(HF_DATA / "qwen3").tensor(name), qtype)
    expected = gguf.quants.dequantize(raw, qtype)
    np.testing.assert_array_equal(source.tensor(name), expected)
    assert source.tensor(name).dtype == np.float32


def test_a_quantized_load_releases_the_header_and_the_rows_it_copied(tmp_path, monkeypatch):
    """The kept blocks are views of the file, except llama's q/k rows, reordered into copies: their
    file pages, and the header's once parsed, are dropped from the resident set; no others."""
    released = []
    monkeypatch.setattr(GGUFSource, "release", lambda self, offset, size: released.append((offset, size)))
    source = GGUFSource(convert("llama", tmp_path / "q.gguf", "Q8_0"), quantized=True)
    assert released == [(0, source.header.data_offset)]
    kept = {True: 0, False: 0}  # quantized tensors checked, copied or not
    for name in source.tensor_names():
        released.clear()
        tensor = source.tensor(name)
        copied = ".self_attn.q_proj." in name or ".self_attn.k_proj." in name
        if isinstance(tensor, QuantizedTensor):
            kept[copied] += 1
            assert released == ([(source._tensors[name].offset, tensor.blocks.nbytes)] if copied else [])
    assert kept[True] and kept[False]


def test_tied_embeddings_follow_from_a_missing_output_tensor(tmp_path):
    untied = GGUFSource(convert("llama", tmp_path / "untied.gguf"))
    tied = GGUFSource(convert("llama", tmp_path / "tied.gguf", skip=("output.weight",)))
    assert not untied.config.tie_word_embeddings
    assert tied.config.tie_word_embeddings and "lm_head.weight" not in tied.tensor_names()


def test_end_of_generation_ids_gather_eos_eot_and_eom(tmp_path):
    path = convert("llama", tmp_path / "m.gguf", extra={"tokenizer.ggml.eot_token_id": 7})
    config = GGUFSource(path).config
    assert (config.bos_token_id, config.eos_token_ids) == (1, (2, 7))


def test_gguf_names_map_like_ggufs_own_tensor_map():
    for arch, layer_names in [("llama", ["attn_q", "ffn_norm"]), ("gemma3", ["ffn_norm", "post_ffw_norm"])]:
        names = gguf.get_tensor_name_map(gguf.MODEL_ARCH[arch.upper()], 4)
        for short in layer_names:
            hf = hf_name(f"blk.3.{short}.weight", arch)
            assert names.get_name(hf, try_suffixes=(".weight",)) == f"blk.3.{short}.weight"
    assert hf_name("rope_freqs.weight", "llama") is None


# ---- the q/k permutation --------------------------------------------------------------------------------


@st.composite
def attention_shapes(draw):
    kv_heads = draw(st.integers(1, 4))
    heads = kv_heads * draw(st.integers(1, 4))  # GQA: H a multiple of K
    return heads, kv_heads, 2 * draw(st.integers(1, 8)), draw(st.integers(1, 12))


@settings(max_examples=60, deadline=None)
@given(shapes=attention_shapes(), seed=st.integers(0, 2**32 - 1))
def test_permute_then_reverse_permute_is_the_identity(shapes, seed):
    heads, kv_heads, E, D = shapes
    rng = np.random.default_rng(seed)
    for n_heads in (heads, kv_heads):
        for shape in ((n_heads * E, D), (n_heads * E,)):  # a projection and its bias
            w = rng.standard_normal(shape).astype(np.float32)
            np.testing.assert_array_equal(reverse_permute(permute(w, n_heads), n_heads), w)
            np.testing.assert_array_equal(permute(reverse_permute(w, n_heads), n_heads), w)
            if E > 2:
                assert not np.array_equal(permute(w, n_heads), w)


def _rope_rotate_half(x: np.ndarray, pos: np.ndarray, theta: float = 10_000.0) -> np.ndarray:
    """x: [T, heads, E]: Hugging Face's RoPE, row i paired with i + E/2."""
    E = x.shape[-1]
    angles = pos[:, None, None] * theta ** (-np.arange(0, E, 2) / E)  # [T, 1, E/2]
    first, second = x[..., : E // 2], x[..., E // 2 :]
    cos, sin = np.cos(angles), np.sin(angles)
    return np.concatenate([first * cos - second * sin, second * cos + first * sin], axis=-1)


def _rope_interleaved(x: np.ndarray, pos: np.ndarray, theta: float = 10_000.0) -> np.ndarray:
    """x: [T, heads, E]: llama.cpp's ``llama`` RoPE, row 2i paired with 2i + 1."""
    E = x.shape[-1]
    angles = pos[:, None, None] * theta ** (-np.arange(0, E, 2) / E)
    even, odd = x[..., 0::2], x[..., 1::2]
    cos, sin = np.cos(angles), np.sin(angles)
    return np.stack([even * cos - odd * sin, odd * cos + even * sin], axis=-1).reshape(x.shape)


@settings(max_examples=30, deadline=None)
@given(shapes=attention_shapes(), seed=st.integers(0, 2**32 - 1))
def test_permuted_weights_under_interleaved_rope_score_like_the_originals_under_rotate_half(shapes, seed):
    """Why the converter permutes: llama.cpp's RoPE on GGUF rows gives Hugging Face's attention scores."""
    heads, kv_heads, E, D = shapes
    rng = np.random.default_rng(seed)
    x, pos = rng.standard_normal((5, D)), np.arange(5) * 7
    wq, wk = rng.standard_normal((heads * E, D)), rng.standard_normal((kv_heads * E, D))

    def scores(q, k):  # [T, H, E], [T, K, E] -> [H, T, T]
        k = np.repeat(k, heads // kv_heads, axis=1)
        return np.einsum("thd,shd->hts", q, k)

    def project(w, n):
        return (x @ w.T).reshape(5, n, E)

    hf = scores(_rope_rotate_half(project(wq, heads), pos), _rope_rotate_half(project(wk, kv_heads), pos))
    q = _rope_interleaved(project(permute(wq, heads), heads), pos)
    k = _rope_interleaved(project(permute(wk, kv_heads), kv_heads), pos)
    np.testing.assert_allclose(scores(q, k), hf, rtol=1e-9, atol=1e-9)


# ---- refusals -------------------------------------------------------------------------------------------


def _write(path, arch: str = "llama", tensors=(), metadata=None):
    writer = gguf.GGUFWriter(path, arch)
    for key, value in (metadata or {}).items():
        writer.add_string(key, value) if isinstance(value, str) else writer.add_uint32(key, value)
    for name, data, kwargs in tensors:
        writer.add_tensor(name, data, **kwargs)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def llama_gguf(tmp_path):
    return convert("llama", tmp_path / "llama.gguf")


@pytest.mark.parametrize("keep", [0, 3, 4, 10, 64, 0.5, -100, -1])
def test_truncated_file_is_refused_naming_the_file(llama_gguf, keep, tmp_path):
    data = llama_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: int(keep * len(data)) if isinstance(keep, float) else keep])
    with pytest.raises(GGUFFileError, match=f"{cut}.*(truncated or corrupt|cannot)") as refused:
        refllm.load_model(cut)
    assert not re.search("unpack|buffer|struct|codec", str(refused.value))  # what is wrong, in words


@pytest.mark.parametrize("offset", [0, 5, 30, 200])
def test_corrupt_bytes_are_refused_naming_the_file(llama_gguf, offset):
    data = bytearray(llama_gguf.read_bytes())
    data[offset : offset + 8] = b"\xff" * 8
    llama_gguf.write_bytes(bytes(data))
    with pytest.raises(GGUFFileError, match=str(llama_gguf)) as refused:
        GGUFSource(llama_gguf)
    assert not re.search("unpack|buffer|struct|codec", str(refused.value))  # what is wrong, in words


def test_not_a_gguf_file_is_refused(tmp_path):
    path = tmp_path / "model.gguf"
    path.write_text("this is not a model\n" * 10)
    with pytest.raises(GGUFFileError, match="is not a readable GGUF file"):
        refllm.load_model(path)


def test_big_endian_file_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "big.gguf"
    writer = gguf.GGUFWriter(path, "llama", endianess=gguf.GGUFEndian.BIG)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(GGUFFileError, match=f"{path}.*big-endian"):
        GGUFSource(path)


def test_missing_file(tmp_path):
    with pytest.raises(GGUFFileError, match="no such file"):
        GGUFSource(tmp_path / "absent.gguf")
    with pytest.raises(ModelNotFoundError, match="absent.gguf"):
        refllm.load_model(tmp_path / "absent.gguf")


def test_unsupported_architecture_is_refused_by_name(tmp_path):
    path = _write(tmp_path / "bert.gguf", "bert", [("token_embd.weight", np.zeros((8, 4), np.float32), {})])
    with pytest.raises(GGUFFileError, match=f"{path}: architecture 'bert' is not supported"):
        GGUFSource(path)


def test_unsupported_tensor_type_is_refused_naming_tensor_and_type(tmp_path):
    iq4 = gguf.GGMLQuantizationType.IQ4_NL  # 32 weights in 18 bytes
    tensors = [("token_embd.weight", np.zeros((8, 18), np.uint8), {"raw_dtype": iq4})]
    path = _write(tmp_path / "iq.gguf", tensors=tensors)
    with pytest.raises(GGUFFileError, match=f"{path}: tensor 'token_embd.weight' has type IQ4_NL"):
        GGUFSource(path)


def test_unknown_tensor_is_refused_by_name(tmp_path):
    tensors = [
        ("token_embd.weight", np.zeros((8, 4), np.float32), {}),
        ("rope_freqs.weight", np.ones(2, np.float32), {}),
    ]
    path = _write(tmp_path / "rope.gguf", tensors=tensors)
    with pytest.raises(GGUFFileError, match="tensor 'rope_freqs.weight' has no counterpart in refllm's llama model"):
        GGUFSource(path)


def test_missing_metadata_key_is_refused_by_name(tmp_path):
    path = _write(tmp_path / "bare.gguf", tensors=[("token_embd.weight", np.zeros((8, 4), np.float32), {})])
    with pytest.raises(GGUFFileError, match=f"{path} has no metadata key 'llama.embedding_length'"):
        GGUFSource(path)


def test_unsupported_rope_scaling_is_refused(tmp_path):
    path = convert("llama", tmp_path / "m.gguf", extra={"llama.rope.scaling.type": "longrope"})
    with pytest.raises(GGUFFileError, match="rope scaling type 'longrope' is not supported"):
        GGUFSource(path)


def test_missing_tensor_names_the_file(tmp_path):
    path = convert("llama", tmp_path / "m.gguf", skip=("blk.1.attn_v.weight",))
    with pytest.raises(MissingTensorError, match=f"v_proj.weight.*{path}"):
        refllm.load_model(path)


def test_metadata_that_disagrees_with_a_tensor_names_both(tmp_path):
    path = convert("llama", tmp_path / "m.gguf", extra={"llama.attention.head_count_kv": 4})
    with pytest.raises(WeightError, match=f"{path} \\(GGUF tensor 'blk.0.attn_k.weight'\\) has shape"):
        refllm.load_model(path)


def test_every_refusal_is_a_value_error():
    assert issubclass(GGUFFileError, ValueError)


# ---- mixtures of experts ------------------------------------------------------------------------------


def _all_sparse_qwen3_moe(directory: Path) -> Path:
    """Random weights for a Qwen3-MoE whose every layer is sparse, as llama.cpp's qwen3moe graph has them."""
    from refllm.testing import Checkpoint
    from refllm.testing.configs import tiny_config_json

    config = tiny_config_json("qwen3_moe") | dict(
        mlp_only_layers=[], norm_topk_prob=False, moe_intermediate_size=32, max_position_embeddings=128
    )  # rows of 32: Q8_0 blocks
    Checkpoint.random(config, seed=5, std=0.3).save(directory)
    return directory


@pytest.mark.parametrize("case", ["mixtral", "qwen3_moe"])
def test_a_mixture_of_experts_gguf_is_the_safetensors_model(case, tmp_path):
    """Experts stacked as ffn_{gate,up,down}_exps, the router as ffn_gate_inp: the same weights as the safetensors'."""
    directory = HF_DATA / case if case == "mixtral" else _all_sparse_qwen3_moe(tmp_path / "hf")
    path = convert(directory, tmp_path / f"{case}.gguf", "F32")
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    assert {"blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight", "blk.0.ffn_down_exps.weight"} <= names
    model = refllm.load_model(path)
    safetensors = refllm.load_model(directory)
    # llama files carry no sliding window (llama.cpp runs Mixtral without one): compare with the
    # safetensors' weights under the window the file implies
    c = safetensors.config
    expected_config = float32_eps(c).with_overrides(
        sliding_window=model.config.sliding_window, layer_types=model.config.layer_types, rope=model.config.rope
    )
    assert model.config == expected_config
    expected = DecoderModel(expected_config, safetensors.weights)
    ids = np.random.default_rng(0).integers(0, c.vocab_size, size=(1, 20))
    np.testing.assert_array_equal(all_logits(model, ids), all_logits(expected, ids))


def test_a_quantized_qwen3moe_gguf_keeps_its_router_in_blocks_and_dequantizes_its_stacked_experts(tmp_path):
    path = convert(_all_sparse_qwen3_moe(tmp_path / "hf"), tmp_path / "q.gguf", "Q8_0")
    quantized, dequantized = refllm.load_model(path, quantized=True), refllm.load_model(path)
    assert quantized.config.experts.norm_topk_prob is False  # the file's expert_weights_norm
    assert isinstance(quantized.weights.layers[0].mlp.router, QuantizedTensor)  # a matrix like any other
    assert isinstance(quantized.weights.layers[0].mlp.experts[0].gate_proj, np.ndarray)  # 3-D: dequantized
    ids = np.random.default_rng(1).integers(0, quantized.config.vocab_size, size=(1, 12))
    np.testing.assert_allclose(all_logits(quantized, ids), all_logits(dequantized, ids), rtol=1e-4, atol=1e-4)


def test_a_qwen3moe_gguf_names_its_dense_layers_by_their_missing_router(tmp_path):
    model = refllm.load_model(convert("qwen3_moe", tmp_path / "q.gguf", "F32"))
    assert [model.config.is_sparse(i) for i in range(3)] == [True, False, True]
    reference = np.load(HF_DATA / "qwen3_moe" / "reference.npz")
    np.testing.assert_allclose(all_logits(model, reference["input_ids"]), reference["logits"], ATOL, RTOL)
    assert greedy(model, reference["input_ids"], NEW_TOKENS) == reference["greedy"].tolist()
