"""Models whose matrices stay quantized against the same models dequantized to float32.

A quantized model (``load_model(gguf, quantized=True)``, or a float checkpoint
loaded with ``quantize="q8_0"``) multiplies by exactly the weights that the
dequantize-then-float32 model holds; the two differ only in the order each
projection sums its products. So their logits agree to float32 rounding
carried through the layers, and their greedy tokens agree (at a near-tie,
under the top-n rule of ``refllm.testing.greedy``).

Tolerances, measured and then given a margin:

- the small fixtures of ``tests/data/hf`` (two layers, D = 64): logits within
  ``ATOL = RTOL = 1e-5``, as the GGUF source tests compare float models;
- SmolLM2-135M and Gemma 3 270M: the quantized path's logits differed from
  the float32 path's by at most 7e-5 (magnitudes up to ~35), and from the
  transformers goldens (float32 on the dequantized weights) by as little as
  the float32 path does, so the goldens' ``FIRST_STEP_ATOL = 2e-4`` holds.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import gguf
import numpy as np
import pytest

import refllm
from refllm import CacheConfig, DecoderModel
from refllm.io.safetensors import HFDirectorySource
from refllm.models.weights import ModelWeights, assemble, weight_bytes_by_format
from refllm.quant.formats import UnsupportedFormatError
from refllm.quant.linear import QuantizedTensor, RequantizedSource
from refllm.testing.greedy import compare_greedy_outputs, top_candidates
from tests.helpers.gguf_convert import convert
from tests.helpers.paths import GGUF_GOLDENS, HF_DATA
from tests.helpers.real_models import GEMMA3, SMOLLM2, real_model_or_skip

ATOL = RTOL = 1e-5
NEW_TOKENS = 8
FIRST_STEP_ATOL = 2e-4
TOP_N = 2
PROMPT = np.array([[3, 17, 42, 99, 5, 64, 7, 21]])


def dequantized(weights: ModelWeights) -> ModelWeights:
    """The same weights with every QuantizedTensor dequantized by the spec (a tied table stays tied)."""

    def plain(value):  # a weight, or a dataclass or list of them
        if isinstance(value, QuantizedTensor):
            return value.dequantize()
        if isinstance(value, list):
            return [plain(item) for item in value]
        if dataclasses.is_dataclass(value):
            parts = {field.name: plain(getattr(value, field.name)) for field in dataclasses.fields(value)}
            return dataclasses.replace(value, **parts)
        return value

    layers = [plain(layer) for layer in weights.layers]
    embed = plain(weights.embed_tokens)
    lm_head = embed if weights.lm_head is weights.embed_tokens else plain(weights.lm_head)
    return ModelWeights(embed_tokens=embed, norm=weights.norm, lm_head=lm_head, layers=layers)


def all_logits(model, ids: np.ndarray) -> np.ndarray:
    cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
    return model.prefill_all_logits(ids, cache, range(ids.shape[1]))


def greedy(model, ids: np.ndarray, new_tokens: int) -> list[int]:
    """Greedy tokens through the paged arena (the Numba attention path a quantized model runs with)."""
    cache = model.create_kv_cache()
    logits, tokens = model.prefill(ids, cache, range(ids.shape[1])), []
    for _ in range(new_tokens):
        tokens.append(int(np.argmax(logits[0])))
        logits = model.decode(np.array([[tokens[-1]]]), cache)
    return tokens


def assert_same_model(quantized, plain) -> None:
    np.testing.assert_allclose(all_logits(quantized, PROMPT), all_logits(plain, PROMPT), rtol=RTOL, atol=ATOL)
    assert greedy(quantized, PROMPT, NEW_TOKENS) == greedy(plain, PROMPT, NEW_TOKENS)


# ---- GGUF files kept quantized ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "case, tensor_type",
    [
        ("llama", "Q8_0"),  # q/k rows permuted in the file: undone on the blocks
        ("llama-bias-tied", "Q4_1"),  # biases, and the embedding doubling as LM head
        ("phi3", "Q5_0"),  # fused qkv and gate_up: split as row slices of the blocks
        ("gemma3_text", "Q4_0"),  # scaled embedding lookup, sandwich norms stored + 1
        ("qwen3", "Q5_1"),  # q/k norms
    ],
)
def test_gguf_model_kept_quantized_matches_its_dequantized_self(case, tensor_type, tmp_path):
    path = convert(case, tmp_path / "model.gguf", tensor_type)
    quantized = refllm.load_model(path, quantized=True)
    plain = refllm.load_model(path)
    assert isinstance(quantized.weights.layers[0].mlp.down_proj, QuantizedTensor)
    assert isinstance(quantized.weights.embed_tokens, QuantizedTensor)
    assert quantized.weights.nbytes() < plain.weights.nbytes() / 2
    assert_same_model(quantized, plain)


def test_weight_bytes_by_format_counts_what_the_file_stores(tmp_path):
    path = convert("llama-bias-tied", tmp_path / "model.gguf", "Q8_0")
    model = refllm.load_model(path, quantized=True)
    stored = {}
    for tensor in gguf.GGUFReader(path).tensors:
        stored[tensor.tensor_type.name] = stored.get(tensor.tensor_type.name, 0) + int(tensor.n_bytes)
    assert weight_bytes_by_format(model.weights) == stored


# ---- float checkpoints quantized at load ----------------------------------------------------------------


@pytest.mark.parametrize("case", ["llama", "phi3", "gemma3_text"])
@pytest.mark.parametrize("quantize", ["q8_0", "q4_0"])
def test_requantized_checkpoint_matches_its_dequantized_self(case, quantize):
    quantized = refllm.load_model(HF_DATA / case, quantize=quantize)
    source = RequantizedSource(HFDirectorySource(HF_DATA / case), quantize)
    assert set(weight_bytes_by_format(quantized.weights)) == {quantize.upper(), "F32"}
    plain = DecoderModel(source.config, dequantized(assemble(source.config, source)))
    assert_same_model(quantized, plain)


def test_requantized_q8_0_stays_close_to_the_float_model():
    """Quantization error itself, not a rounding bound: a sanity check that the right tensors were
    quantized the right way. On this fixture Q8_0 moved the logits by 2.3% of their largest magnitude."""
    quantized = all_logits(refllm.load_model(HF_DATA / "llama", quantize="q8_0"), PROMPT)
    original = all_logits(refllm.load_model(HF_DATA / "llama"), PROMPT)
    assert np.abs(quantized - original).max() <= 0.05 * np.abs(original).max()


def test_an_unknown_quantize_format_is_refused_before_loading():
    with pytest.raises(UnsupportedFormatError, match="q5_k"):
        refllm.load_model("/no/such/model", quantize="q5_k")


# ---- the real published files ---------------------------------------------------------------------------

GOLDENS = {name: json.loads((GGUF_GOLDENS / f"{name}.json").read_text()) for name in (SMOLLM2, GEMMA3)}


@pytest.fixture(scope="module")
def quantized_models():
    loaded = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = refllm.load_model(real_model_or_skip(name), quantized=True)
        return loaded[name]

    return get


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize("name", [SMOLLM2, GEMMA3])
def test_real_model_kept_quantized_decodes_as_the_float32_path(quantized_models, name):
    """Every golden prompt: first-step logits within FIRST_STEP_ATOL of the goldens (float32 on the
    dequantized weights), and greedy tokens equal to theirs up to a near-tie."""
    model = quantized_models(name)
    assert set(weight_bytes_by_format(model.weights)) >= {"Q8_0", "F32"}
    golden = GOLDENS[name]
    for prompt in golden["prompts"]:
        cache = model.create_kv_cache()
        logits = model.prefill(np.array([prompt["prompt_ids"]]), cache, range(len(prompt["prompt_ids"])))[0]
        first = np.array(prompt["first_step"]["ids"])
        np.testing.assert_allclose(
            logits[first], prompt["first_step"]["logits"], rtol=0, atol=FIRST_STEP_ATOL,
            err_msg=f"{name} {prompt['name']}: first-step logits",
        )  # fmt: skip
        tokens, tops = [], []
        for step in range(len(prompt["greedy_ids"])):
            tops.append(top_candidates(logits, TOP_N))
            tokens.append(int(tops[-1][0]))
            if step + 1 < len(prompt["greedy_ids"]):
                logits = model.decode(np.array([[tokens[-1]]]), cache)[0]
        comparison = compare_greedy_outputs(
            tokens, np.array(tops), prompt["greedy_ids"], np.array(prompt["top_ids"]), TOP_N
        )
        report = f"{name} {prompt['name']} quantized: " + comparison.describe("quantized", "float32")
        assert comparison.ok, report
        if comparison.step is not None:
            warnings.warn(report, stacklevel=1)
