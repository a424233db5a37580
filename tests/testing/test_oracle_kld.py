"""KL-divergence statistics as llama-perplexity reports them, on cases worked out by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from refllm.testing import Checkpoint, refllm_contiguous, refllm_float64, refllm_paged
from refllm.testing.configs import tiny_config_json
from refllm.testing.kld import kl_divergence, kl_statistics


def test_identical_or_shifted_logits_are_at_zero_distance():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(20, 16))
    stats = kl_statistics(logits + 3.0, logits, rng.integers(0, 16, 20))  # a constant shift changes no probability
    assert stats.mean == pytest.approx(0, abs=1e-12) and stats.max == pytest.approx(0, abs=1e-12)
    assert stats.same_top == 1.0 and stats.rms_dp == pytest.approx(0, abs=1e-12) and stats.ppl_ratio == pytest.approx(1)


def test_a_two_token_case_worked_by_hand():
    reference = np.log([[0.5, 0.5], [0.5, 0.5]])
    backend = np.log([[0.25, 0.75], [0.25, 0.75]])
    stats = kl_statistics(backend, reference, [0, 1])
    kl = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # sum p log(p / q)
    assert stats.mean == pytest.approx(kl) and stats.median == pytest.approx(kl) and stats.stderr == pytest.approx(0)
    assert stats.rms_dp == pytest.approx(0.25) and stats.max_dp == pytest.approx(0.25)  # Δp: -0.25 and +0.25
    assert stats.same_top == 0.0  # the reference tie resolves to id 0; the backend puts id 1 first at both positions
    # perplexity ratio: exp(mean NLL backend) / exp(mean NLL reference) = sqrt(1/0.25 * 1/0.75) / 2
    assert stats.ppl_ratio == pytest.approx(math.sqrt(4 * 4 / 3) / 2)


def test_refllm_paths_against_float64_truth_are_tiny_and_a_wrong_model_is_not():
    checkpoint = Checkpoint.random(tiny_config_json("qwen3"), 1)
    prompts = [list(range(3, 20)), [0, 1, 2, 5, 9]]
    truth = refllm_float64(checkpoint)
    assert kl_divergence(refllm_paged(checkpoint), truth, prompts).max < 1e-9
    other = Checkpoint.random(tiny_config_json("qwen3"), 2)
    assert kl_divergence(refllm_contiguous(other), truth, prompts).mean > 1e-3
