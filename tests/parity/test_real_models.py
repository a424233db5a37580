"""The real GGUF models, loaded by refllm, decode as transformers decodes them.

The goldens in ``tests/data/gguf`` were recorded by ``tests/tools/make_gguf_goldens.py``
with transformers reading the same files in float32. Both sides run the same
dequantized weights in float32, so their logits differ only by summation order:
the first step's logits must agree within ``FIRST_STEP_ATOL``,
and greedy tokens must agree except at a near-tie (each side's token among the
other's top ``TOP_N``), after which comparison stops. A near-tie is reported as
a warning; a real divergence fails.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import refllm
from refllm import CacheConfig
from refllm.testing.greedy import compare_greedy_outputs, top_candidates
from tests.helpers.paths import GGUF_GOLDENS
from tests.helpers.real_models import CHAT_MESSAGES, GEMMA3, SMOLLM2, real_model_or_skip

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

# The first step's logits (magnitudes up to ~30) differed from transformers' by at most 4e-5 when the
# goldens were recorded: float32 summed in another order over 18-30 layers. 2e-4 leaves a fivefold
# margin; a misplaced norm, RoPE pair or scale moves them by 1e-1 or more.
FIRST_STEP_ATOL = 2e-4
TOP_N = 2  # float32 on both sides: only an exact-to-1e-4 tie can swap the winner, so the runner-up suffices

GOLDENS = {name: json.loads((GGUF_GOLDENS / f"{name}.json").read_text()) for name in (SMOLLM2, GEMMA3)}
CASES = [(name, prompt["name"]) for name, golden in GOLDENS.items() for prompt in golden["prompts"]]


@pytest.fixture(scope="module")
def models():
    """Models loaded once per module, by catalog name."""
    loaded = {}

    def get(name: str):
        if name not in loaded:
            loaded[name] = refllm.load_model(real_model_or_skip(name))
        return loaded[name]

    return get


def golden_prompt(name: str, prompt: str) -> dict:
    return next(p for p in GOLDENS[name]["prompts"] if p["name"] == prompt)


def greedy_with_candidates(model, prompt_ids: list[int], new_tokens: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """-> (greedy tokens [N], top TOP_N candidates per step [N, TOP_N], first step's logits [V])."""
    cache = model.create_kv_cache(CacheConfig(kind="contiguous"))
    logits = model.prefill(np.array([prompt_ids]), cache, range(len(prompt_ids)))[0]
    first_logits, tokens, tops = logits, [], []
    for step in range(new_tokens):
        tops.append(top_candidates(logits, TOP_N))
        tokens.append(int(tops[-1][0]))
        if step + 1 < new_tokens:
            logits = model.decode(np.array([[tokens[-1]]]), cache)[0]
    return tokens, np.array(tops), first_logits


@pytest.mark.parametrize("name, prompt", CASES)
def test_greedy_decoding_matches_transformers(models, name, prompt):
    golden = golden_prompt(name, prompt)
    model = models(name)
    tokens, tops, first_logits = greedy_with_candidates(model, golden["prompt_ids"], len(golden["greedy_ids"]))

    ids = np.array(golden["first_step"]["ids"])
    expected = np.array(golden["first_step"]["logits"], dtype=np.float64)
    np.testing.assert_allclose(
        first_logits[ids], expected, rtol=0, atol=FIRST_STEP_ATOL,
        err_msg=f"{name} {prompt}: first-step logits differ from transformers'",
    )  # fmt: skip

    comparison = compare_greedy_outputs(tokens, tops, golden["greedy_ids"], np.array(golden["top_ids"]), TOP_N)
    report = f"{name} {prompt}: " + comparison.describe("refllm", "transformers")
    assert comparison.ok, report
    if comparison.step is not None:
        warnings.warn(report, stacklevel=1)


@pytest.mark.parametrize("name, prompt", CASES)
def test_gguf_tokenizer_encodes_the_golden_prompts_as_transformers_did(models, name, prompt):
    golden = golden_prompt(name, prompt)
    tokenizer = models(name).tokenizer
    if golden["kind"] == "chat":
        assert tokenizer.apply_chat_template(CHAT_MESSAGES) == golden["text"]
        assert tokenizer.encode(golden["text"], add_special_tokens=False) == golden["prompt_ids"]
    else:
        assert tokenizer.encode(golden["text"]) == golden["prompt_ids"]
    assert tokenizer.decode(golden["greedy_ids"]) == golden["greedy_text"]


def test_real_models_carry_their_special_tokens(models):
    smollm2, gemma3 = models(SMOLLM2).config, models(GEMMA3).config
    assert (smollm2.bos_token_id, smollm2.eos_token_ids) == (1, (2,))  # <|im_start|>, <|im_end|>
    assert (gemma3.bos_token_id, gemma3.eos_token_ids) == (2, (1,))  # <bos>, <eos>
    assert smollm2.tie_word_embeddings and gemma3.tie_word_embeddings
