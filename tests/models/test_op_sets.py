"""The two op sets of the one forward pass: the spec (refllm/nn alone) and its kernel twins.

- The spec path imports no Numba, so it calls no compiled function, and importing
  refllm sets no environment variable (both checked in a fresh process).
- Spec ops against fast ops in float32, on both caches, property-tested within a
  bound derived from float32 rounding: each path's error against the float64
  truth is rounding of the same operations in another order, so their
  difference stays within a small multiple of the spec's own error against truth.
- The combinations that cannot run are refused before anything is computed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refllm
from refllm.config import ModelConfig
from refllm.models.contract import InMemorySource
from refllm.models.decoder import DecoderModel, ModelDtypeError
from refllm.models.random import random_tensors
from refllm.testing.truth import relative_error
from tests.helpers.op_sets import ROUNDING_MULTIPLE, ULP_FLOOR, logits_over, random_weights_model
from tests.helpers.paths import HF_DATA, ROOT

ARCHITECTURES = sorted(p.name for p in HF_DATA.iterdir() if (p / "config.json").exists())


def run_fresh(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_import_loads_no_numba_and_sets_no_environment_variable():
    out = run_fresh(
        "import os, sys; before = dict(os.environ); import refllm, refllm.nn, refllm.config;"
        " print('numba' in sys.modules, dict(os.environ) == before)"
    )
    assert out.split() == ["False", "True"]


def test_a_spec_forward_calls_no_compiled_function():
    """A spec-ops forward on the contiguous cache never imports Numba: no compiled function can run."""
    out = run_fresh(
        "import sys, numpy as np, refllm; from refllm.kv import CacheConfig;"
        f" m = refllm.load_model({str(HF_DATA / 'gemma3_text')!r}, reference=True);"
        " c = m.create_kv_cache(CacheConfig(kind='contiguous'));"
        " m.prefill(np.array([[1, 2, 3]]), c, range(3)); m.decode(np.array([[4]]), c);"
        " print(m.ops.name, 'numba' in sys.modules)"
    )
    assert out.split() == ["spec", "False"]


@settings(max_examples=12, deadline=None)
@given(
    name=st.sampled_from(ARCHITECTURES),
    kind=st.sampled_from(["contiguous", "paged"]),
    seed=st.integers(0, 3),
    tokens=st.lists(st.integers(0, 127), min_size=2, max_size=21),
    data=st.data(),
)
def test_spec_and_fast_ops_agree_within_float32_rounding(name, kind, seed, tokens, data):
    prompt = data.draw(st.integers(1, len(tokens)), label="prompt")
    truth = logits_over(random_weights_model(name, "float64", seed=seed), "contiguous", tokens, prompt)
    spec = logits_over(random_weights_model(name, reference=True, seed=seed), kind, tokens, prompt)
    fast = logits_over(random_weights_model(name, reference=False, seed=seed), kind, tokens, prompt)
    bound = ROUNDING_MULTIPLE * max(relative_error(spec, truth), ULP_FLOOR)
    assert relative_error(fast, spec) <= bound


def test_the_rounding_bound_catches_a_dropped_bias():
    """The bound is tight enough to see a real bug: the fast path without q/k/v biases."""
    tokens = [3, 17, 99, 5, 64, 2, 8]
    truth = logits_over(random_weights_model("qwen2", "float64"), "contiguous", tokens, 4)
    spec = logits_over(random_weights_model("qwen2", reference=True), "contiguous", tokens, 4)
    broken = random_weights_model("qwen2", reference=False)
    for layer in broken.weights.layers:
        layer.attention.q_proj_bias = layer.attention.k_proj_bias = layer.attention.v_proj_bias = None
    broken = broken.with_ops(broken.ops)  # the blocks built again over the changed weights (the fused layers' too)
    fast = logits_over(broken, "paged", tokens, 4)
    assert relative_error(fast, spec) > 100 * ROUNDING_MULTIPLE * relative_error(spec, truth)


def test_float64_runs_every_step_in_float64():
    m = random_weights_model("gemma3_text", "float64")
    assert m.ops.name == "spec" and m.metadata.dtype == "float64"
    assert m.embed(np.array([[1, 2]])).dtype == np.float64
    cache = m.create_kv_cache()
    assert m.prefill_hidden(np.array([[1, 2]]), cache, range(2)).dtype == np.float64
    assert m.decode_all_logits(np.array([[3, 4]]), cache).dtype == np.float64
    assert m.layers[0].attention.rotation.angles(np.array([[5]]))[0].dtype == np.float64


def test_float64_runs_under_the_runtime():
    llm = refllm.LLM(random_weights_model("llama", "float64"))
    first = llm.prefill(0, [1, 2, 3])
    assert first.dtype == np.float64
    assert llm.decode(0, int(np.argmax(first)), 3).dtype == np.float64


@pytest.mark.parametrize(
    "keywords",
    [
        {"dtype": "float64", "reference": False},  # the kernels compute in float32
        {"dtype": "float16"},
        {"dtype": "float64", "quantize": "q8_0"},
        {"reference": True, "quantize": "q8_0"},  # the spec reads dequantized weights
    ],
)
def test_combinations_that_cannot_run_are_refused_before_loading(keywords):
    with pytest.raises(ModelDtypeError):
        refllm.load_model(HF_DATA / "llama", **keywords)


def test_a_float64_model_refuses_float32_weights():
    config = ModelConfig.from_hf(json.loads((HF_DATA / "llama" / "config.json").read_text()))
    weights = DecoderModel.load(InMemorySource(config, random_tensors(config))).weights
    with pytest.raises(ModelDtypeError, match="float64 weights"):
        DecoderModel(config, weights, dtype="float64")


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_spec_and_fast_ops_agree_on_every_architecture(name):
    """Each claimed architecture at least once (the draws above sample a few): the mixtures of experts too."""
    tokens = [3, 17, 99, 5, 64, 2, 8, 120, 41]
    truth = logits_over(random_weights_model(name, "float64"), "contiguous", tokens, 5)
    spec = logits_over(random_weights_model(name, reference=True), "contiguous", tokens, 5)
    fast = logits_over(random_weights_model(name, reference=False), "paged", tokens, 5)
    assert relative_error(fast, spec) <= ROUNDING_MULTIPLE * max(relative_error(spec, truth), ULP_FLOOR)
