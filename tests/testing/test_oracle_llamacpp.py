"""llama.cpp through the kit: drawn checkpoints written as GGUF and run by llama-cpp-python (skips without it)."""

from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp")

from refllm.testing import Checkpoint, check_logits, run_conformance  # noqa: E402
from refllm.testing.backends import Unsupported  # noqa: E402
from refllm.testing.configs import tiny_config_json  # noqa: E402
from refllm.testing.llamacpp import llamacpp_backend, llamacpp_float16  # noqa: E402

ARCHES = ("llama", "qwen2", "qwen3", "phi3")


@pytest.mark.parametrize("arch", ARCHES)
def test_a_written_gguf_gives_the_reference_logits_in_llama_cpp(arch):
    config = tiny_config_json(arch) | {"use_sliding_window": False, "attention_bias": arch != "qwen3"}
    checkpoint = Checkpoint.random(config, 0)
    check_logits(llamacpp_backend(checkpoint), checkpoint, [0, 5, 9, 17, 3, 63, 1])
    check_logits(llamacpp_float16(checkpoint), checkpoint, [0, 5, 9, 17, 3, 63, 1], profile="float16")


def test_what_llama_cpp_cannot_express_is_refused_not_failed():
    with pytest.raises(Unsupported, match="sliding windows"):
        llamacpp_backend(Checkpoint.random(tiny_config_json("mistral"), 0))


@pytest.mark.slow
def test_llama_cpp_conformance_run():
    results = run_conformance(llamacpp_backend, max_examples=10, architectures=ARCHES, seed=0, threads=1)
    failed = [r for r in results if r.status == "failed"]
    assert not failed, "\n\n".join(r.detail for r in failed)
