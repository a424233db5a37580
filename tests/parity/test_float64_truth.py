"""refllm in float64 is ground truth: it agrees with an independent float64 forward to 1e-9.

On the random-weight checkpoint of every claimed architecture (tests/data/hf),
``load_model(dir, dtype="float64")`` on the contiguous cache must agree with
``tests/helpers/float64_reference.py`` (written apart, one token at a time) to 1e-9 of
the largest logit: through ``prefill_all_logits``, and through ``prefill`` then
``decode`` one token at a time past the sliding windows (8) and the dynamic
RoPE's 16 positions. Rounding anywhere to float32, including float32 RoPE
tables as transformers keeps them, shows as 1e-8 to 1e-6: the last test proves
the bound can see it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import refllm
from refllm.kernels.rope import RopeTable
from refllm.kv import CacheConfig
from refllm.models.decoder import DecoderModel
from refllm.models.ops import SPEC_OPS
from refllm.testing.truth import relative_error
from tests.helpers.float64_reference import reference_logits
from tests.helpers.paths import HF_DATA

CHECKPOINTS = sorted(p for p in HF_DATA.iterdir() if (p / "config.json").exists())
TOKENS = [int(t) for t in np.random.default_rng(7).integers(0, 128, size=26)]
PROMPT = 12  # then 14 decode steps: positions 12 .. 25
TRUTH_BOUND = 1e-9  # relative to the largest logit


@pytest.fixture(scope="module", params=CHECKPOINTS, ids=lambda p: p.name)
def checkpoint(request) -> Path:
    return request.param


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_prefill_all_logits_is_float64_truth(checkpoint, kind):
    model = refllm.load_model(checkpoint, dtype="float64")
    logits = model.prefill_all_logits(np.array([TOKENS]), model.create_kv_cache(CacheConfig(kind=kind)), range(26))
    assert logits.dtype == np.float64
    truth = reference_logits(checkpoint, TOKENS, [len(TOKENS)])
    assert relative_error(logits[0], truth) <= TRUTH_BOUND


@pytest.mark.parametrize("kind", ["contiguous", "paged"])
def test_prefill_then_decode_is_float64_truth_past_the_windows(checkpoint, kind):
    model = refllm.load_model(checkpoint, dtype="float64")
    cache = model.create_kv_cache(CacheConfig(kind=kind, block_size=4))
    rows = [model.prefill(np.array([TOKENS[:PROMPT]]), cache, range(PROMPT))[0]]
    for token in TOKENS[PROMPT:]:
        rows.append(model.decode(np.array([[token]]), cache)[0])
    truth = reference_logits(checkpoint, TOKENS, [PROMPT] + [1] * (len(TOKENS) - PROMPT))
    assert np.stack(rows).dtype == np.float64
    assert relative_error(np.stack(rows), truth[PROMPT - 1 :]) <= TRUTH_BOUND


def test_the_bound_sees_float32_rope_tables():
    """Rotating with float32 cos/sin tables, as transformers keeps them, breaks the 1e-9 bound."""
    checkpoint = next(p for p in CHECKPOINTS if p.name == "llama")
    truth_model = refllm.load_model(checkpoint, dtype="float64")

    def float32_table(params, head_dim, max_position_embeddings, dtype):
        return RopeTable(params, head_dim, max_position_embeddings, np.float32).lookup

    model = DecoderModel(
        truth_model.config, truth_model.weights, dtype="float64", ops=replace(SPEC_OPS, rope_angles=float32_table)
    )
    logits = model.prefill_all_logits(np.array([TOKENS]), model.create_kv_cache(), range(26))
    error = relative_error(logits[0], reference_logits(checkpoint, TOKENS, [len(TOKENS)]))
    assert 1e-8 <= error <= 1e-5
