"""The kit's draws reach what backends get wrong, and raise no false alarm on refllm's own paths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refllm.nn.moe_grouped import sigmoid
from refllm.testing import PROPERTIES, Checkpoint, refllm_llm, refllm_paged
from refllm.testing.checks import check, check_batch, check_logits
from refllm.testing.configs import tiny_config_json
from refllm.testing.factories import refllm_contiguous
from refllm.testing.history import chunking_matters
from refllm.testing.mechanisms import LEAST_EXPECTED, MECHANISMS, expected_cases, main
from refllm.testing.strategies import LONG_HORIZON_MAX, hf_configs, long_horizon_cuts, token_ids, weight_options
from refllm.testing.suite import property_args

CACHED = ("chunked_prefill", "decode", "batch", "branches", "schedule", "truncate", "memory", "errors", "greedy")


@st.composite
def dynamic_ntk_cases(draw):
    """A dynamic-NTK model (inputs run past its max_position_embeddings of 16) and a cached property's inputs."""
    config = draw(hf_configs(("llama", "mistral", "qwen2", "qwen3")))
    config["rope_scaling"] = {"rope_type": "dynamic", "factor": draw(st.sampled_from([2.0, 4.0]))}
    config["max_position_embeddings"] = 16
    name = draw(st.sampled_from(CACHED))
    args = draw(property_args(name, config["vocab_size"], window=config.get("sliding_window")))
    return name, Checkpoint.random(config, draw(st.integers(0, 2**16)), **draw(weight_options())), args


@pytest.mark.slow
@pytest.mark.parametrize("factory", [refllm_paged, refllm_llm])
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=dynamic_ntk_cases())
def test_dynamic_ntk_raises_no_false_alarm_on_refllm_paths(factory, case):
    name, checkpoint, args = case
    assert chunking_matters(refllm_contiguous(checkpoint))
    check(name, factory(checkpoint), checkpoint, **args)


@settings(max_examples=8, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(case=dynamic_ntk_cases())
def test_dynamic_ntk_raises_no_false_alarm_on_the_runtime(case):
    """The quick version of the test above, in the default run."""
    name, checkpoint, args = case
    check(name, refllm_llm(checkpoint), checkpoint, **args)


def test_a_one_shot_prefill_and_a_cached_decode_differ_by_design_under_dynamic_ntk():
    """Why the kit replays calls on the reference: the cached and one-shot forwards really differ."""
    config = tiny_config_json("llama") | {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}, "max_position_embeddings": 16}
    checkpoint = Checkpoint.random(config, 0, std=1.0)
    reference, tokens = refllm_contiguous(checkpoint), list(range(3, 27))
    one_shot = reference.last_logits(tokens)
    cached = reference.replay([("prefill", tokens[:-1]), ("prefill", tokens[-1:])])
    assert np.abs(one_shot - cached).max() > 1e-3 * one_shot.std()


@settings(max_examples=200, deadline=None, database=None)
@given(data=st.data())
def test_long_horizon_cuts_are_valid(data):
    window = data.draw(st.none() | st.integers(2, 8))
    length, cuts = data.draw(long_horizon_cuts(window))
    assert 32 < length <= LONG_HORIZON_MAX and cuts == sorted(set(cuts)) and 1 <= cuts[0] and cuts[-1] < length


def test_draws_cover_what_the_old_draws_missed():
    lengths, ids, stds = [], set(), set()

    @settings(max_examples=150, deadline=None, database=None, derandomize=True)
    @given(long_horizon_cuts(4), token_ids(48), weight_options())
    def collect(cuts, tokens, options):
        lengths.append(cuts[0])
        ids.update(tokens)
        stds.add(options["std"])

    collect()
    assert np.mean(np.array(lengths) > 100) > 0.5  # most long-horizon cases pass position 100
    assert {0, 1, 2, 47} <= ids  # the special ids and the last id
    assert max(stds) / min(stds) >= 100  # weight scales over two orders of magnitude


def test_a_tied_checkpoint_may_carry_a_stray_lm_head_that_the_reference_ignores():
    config = tiny_config_json("llama") | {"tie_word_embeddings": True}
    plain, stray = Checkpoint.random(config, 4), Checkpoint.random(config, 4, lm_head=True)
    assert "lm_head.weight" in stray.tensors and "lm_head.weight" not in plain.tensors
    tokens = [0, 1, 2, 5]
    np.testing.assert_array_equal(refllm_contiguous(stray).all_logits(tokens), refllm_contiguous(plain).all_logits(tokens))


def test_every_mechanism_is_reached_at_least_5_times_by_a_default_run():
    """Deterministic: the draws of default runs under fixed seeds (mechanisms.py)."""
    expected = expected_cases()
    short = {f"{m.family}: {m.name}": round(n, 1) for m, n in expected.items() if n < LEAST_EXPECTED}
    assert short == {}


def test_the_mechanisms_command_prints_a_line_per_mechanism(capsys):
    assert main(["--examples", "2", "--runs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("expected cases per run of 2 cases") and len(lines) == 1 + len(MECHANISMS)
    assert {line.split(None, 2)[2].split("   <")[0] for line in lines[1:]} == {m.name for m in MECHANISMS}


def test_the_mechanisms_command_refuses_a_run_of_no_cases(capsys):
    with pytest.raises(SystemExit):
        main(["--examples", "0"])
    assert "--examples and --runs must be at least 1; got 0 and" in capsys.readouterr().err


ROUTER_WEIGHT = {  # the first sparse layer's router in each tiny config
    "mixtral": "model.layers.0.block_sparse_moe.gate.weight",
    "qwen3_moe": "model.layers.0.mlp.gate.weight",
    "gpt_oss": "model.layers.0.mlp.router.weight",
    "deepseek_v3": "model.layers.1.mlp.gate.weight",
}


@pytest.mark.parametrize("model_type", sorted(ROUTER_WEIGHT))
def test_duplicated_routers_score_experts_in_pairs_exactly(model_type):
    checkpoint = Checkpoint.random(tiny_config_json(model_type), 3, router="duplicated")
    router = checkpoint.tensors[ROUTER_WEIGHT[model_type]]
    np.testing.assert_array_equal(router[1::2], router[0::2][: len(router) // 2])
    assert len(np.unique(router, axis=0)) == (len(router) + 1) // 2  # the pairs differ from each other
    assert "duplicated router rows" in checkpoint.description


def test_saturated_routers_tie_deepseeks_sigmoid_scores_at_1():
    checkpoint = Checkpoint.random(tiny_config_json("deepseek_v3"), 3, router="saturated")
    router = checkpoint.tensors[ROUTER_WEIGHT["deepseek_v3"]]
    x = np.random.default_rng(0).normal(size=(16, router.shape[1])).astype(np.float32)  # [T, D], normed-sized
    for dtype in (np.float32, np.float64):  # the spec and the truth both tie
        scores = sigmoid((x @ router.T).astype(dtype))
        assert ((scores == 1.0).sum(axis=-1) >= 2).all()
    assert not checkpoint.tensors["model.layers.1.mlp.gate.e_score_correction_bias"].any()  # a bias would break ties


def test_a_router_that_names_no_tie_pattern_is_refused():
    with pytest.raises(ValueError, match="router must be one of random, duplicated, saturated; got 'tied'"):
        Checkpoint.random(tiny_config_json("mixtral"), 0, router="tied")


@pytest.mark.parametrize("router", ["duplicated", "saturated"])
@pytest.mark.parametrize("model_type", sorted(ROUTER_WEIGHT))
@pytest.mark.parametrize("factory", [refllm_paged, refllm_llm])
def test_refllms_own_paths_break_router_ties_as_the_spec_does(factory, model_type, router):
    """Tied scores are computed bit for bit alike on every path, so each picks the lower expert index."""
    config = tiny_config_json(model_type) | {"num_experts_per_tok": 1 if model_type != "deepseek_v3" else 3}
    checkpoint = Checkpoint.random(config, 5, router=router)
    check_logits(factory(checkpoint), checkpoint, tokens=list(range(3, 15)))
    check_batch(factory(checkpoint), checkpoint, prompts=[[3, 4, 5], [6, 7, 8, 9]], steps=[[10, 11], [12, 13]])


def test_every_property_says_what_it_claims():
    assert all(p.claim for p in PROPERTIES.values())
