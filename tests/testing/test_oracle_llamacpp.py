"""llama.cpp through the kit: drawn checkpoints written as GGUF and run by llama-cpp-python (skips without it)."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

import numpy as np  # noqa: E402

from refllm.testing import Checkpoint, ConformanceFailure, check_logits, run_conformance  # noqa: E402
from refllm.testing.backends import Unsupported  # noqa: E402
from refllm.testing.configs import tiny_config_json  # noqa: E402
from refllm.testing.llamacpp import llamacpp_backend, llamacpp_float16  # noqa: E402

ARCHES = ("llama", "qwen2", "qwen3", "phi3")
TOKENS = [0, 5, 9, 17, 3, 63, 1]


@pytest.mark.parametrize("arch", ARCHES)
def test_a_written_gguf_gives_the_reference_logits_in_llama_cpp(arch):
    config = tiny_config_json(arch) | {"use_sliding_window": False, "attention_bias": arch != "qwen3"}
    checkpoint = Checkpoint.random(config, 0)
    check_logits(llamacpp_backend(checkpoint), checkpoint, [0, 5, 9, 17, 3, 63, 1])
    check_logits(llamacpp_float16(checkpoint), checkpoint, [0, 5, 9, 17, 3, 63, 1], profile="float16")


def test_llama_cpp_hidden_states_match_the_reference_at_every_layer_and_op():
    from refllm.testing.explain import first_divergent_layer
    from refllm.testing.factories import refllm_contiguous
    from refllm.testing.tolerances import get_profile

    checkpoint = Checkpoint.random(tiny_config_json("qwen2") | {"use_sliding_window": False}, 0)
    backend, reference = llamacpp_backend(checkpoint), refllm_contiguous(checkpoint)
    got, want, profile = backend.sublayer_states(TOKENS), reference.sublayer_states(TOKENS), get_profile("float32")
    assert [set(inside) for inside in got] == [set(expected) for expected in want]
    for inside, expected in zip(got, want):
        assert all(profile.close(inside[point], expected[point]) for point in expected)
    assert "every layer matches" in first_divergent_layer(backend, reference, TOKENS, profile)


@pytest.mark.parametrize(("node", "layer", "op"), [("attn_out", 1, "the attention"), ("ffn_out", 2, "the MLP")])
def test_a_broken_op_in_a_llama_cpp_run_is_reported_at_its_layer_and_op(node, layer, op):
    checkpoint = Checkpoint.random(tiny_config_json("llama") | {"num_hidden_layers": 4, "attention_bias": False}, 0)
    backend = llamacpp_backend(checkpoint)
    check_logits(backend, checkpoint, TOKENS)  # as it is, it conforms
    # the product's output scaled by 1.01 as llama.cpp computes it, before the residual add reads it
    backend.alter = lambda n: n.value * np.float32(1.01) if (n.name, n.op) == (f"{node}-{layer}", "MUL_MAT") else None
    with pytest.raises(ConformanceFailure) as failure:
        check_logits(backend, checkpoint, TOKENS)
    report = str(failure.value)
    assert f"first diverge at the output of layer {layer} " in report
    assert f"in layer {layer} the first op to diverge is {op}" in report


def test_what_llama_cpp_cannot_express_is_refused_not_failed():
    with pytest.raises(Unsupported, match="sliding windows"):
        llamacpp_backend(Checkpoint.random(tiny_config_json("mistral"), 0))


@pytest.mark.slow
def test_llama_cpp_conformance_run():
    results = run_conformance(llamacpp_backend, max_examples=10, architectures=ARCHES, seed=0, threads=1)
    failed = [r for r in results if r.status == "failed"]
    assert not failed, "\n\n".join(r.detail for r in failed)
