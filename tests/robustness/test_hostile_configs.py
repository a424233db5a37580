"""Hostile config.json values of every family: refused in < 2 s and < 200 MB as a ConfigError naming file, field, value.

Each case copies a tiny checkpoint of its family (tests/data/hf, as transformers'
``save_pretrained`` wrote it: one tensor per expert for Mixtral, Qwen3-MoE and
DeepSeek-V3), changes one config.json value and loads it under a cap of 200 MB of
address space beyond the process and 2 s (``capped`` of tests/helpers/fuzz_loaders.py, which
also reads the peak of resident memory the load added). Beside each, the unchanged
checkpoint loads under the same caps: the caps are not what refuses.
"""

from __future__ import annotations

import json
import math
import shutil

import pytest

import refllm
from refllm.config import ConfigError, ModelConfig
from tests.helpers.fuzz_loaders import Stats, capped, with_json_field
from tests.helpers.paths import HF_DATA

MEMORY_CAP = 200 << 20
TIME_CAP = 2.0
NAN, INF = math.nan, math.inf

# (family, the key's path in config.json, the hostile value, what the refusal must name: the field and the value)
CASES = [
    # per-expert checkpoints: a name per expert was built before any tensor was compared (30 s and gigabytes)
    ("mixtral", ("num_local_experts",), 10**7, ["num_local_experts", "10000000"]),
    ("mixtral", ("num_local_experts",), 2**31 - 1, ["num_local_experts", "2147483647"]),
    ("qwen3_moe", ("num_experts",), 10**7, ["num_experts", "10000000"]),
    ("deepseek_v3", ("n_routed_experts",), 2**30, ["n_routed_experts", "1073741824"]),
    # RoPE scalings: NaN went through to the logits; 0 or -1 became the default through ``x or default``
    ("deepseek_v3", ("rope_parameters", "mscale"), NAN, ["mscale", "nan"]),
    ("deepseek_v3", ("rope_parameters", "mscale_all_dim"), NAN, ["mscale_all_dim", "nan"]),
    ("deepseek_v3", ("rope_parameters", "mscale_all_dim"), -1.0, ["mscale_all_dim", "-1.0"]),
    ("gpt_oss", ("rope_parameters", "attention_factor"), NAN, ["attention_factor", "nan"]),
    ("gpt_oss", ("rope_parameters", "attention_factor"), -1, ["attention_factor", "-1"]),
    ("gpt_oss", ("rope_parameters", "beta_fast"), NAN, ["beta_fast", "nan"]),
    ("gpt_oss", ("rope_parameters", "beta_slow"), 0, ["beta_slow", "0"]),
    ("gpt_oss", ("rope_parameters", "beta_fast"), 0.5, ["beta_fast", "0.5"]),  # below beta_slow (1)
    ("gpt_oss", ("rope_parameters", "factor"), 0, ["factor", "0"]),
    ("gpt_oss", ("rope_parameters", "original_max_position_embeddings"), 0, ["original_max_position_embeddings", "0"]),
    ("gpt_oss", ("rope_parameters", "truncate"), "no", ["truncate", "'no'"]),
    ("gpt_oss", ("rope_parameters", "rope_theta"), 1.0, ["theta", "1.0"]),
    ("llama3-rope", ("rope_parameters", "low_freq_factor"), 4.0, ["low_freq_factor", "4.0"]),  # = high_freq_factor
    ("llama3-rope", ("rope_parameters", "high_freq_factor"), INF, ["high_freq_factor", "inf"]),
    ("llama3-rope", ("rope_parameters", "factor"), -8.0, ["factor", "-8.0"]),
    ("olmo2", ("rope_parameters", "partial_rotary_factor"), 0, ["partial_rotary_factor", "0"]),
    # soft-caps, scales, multipliers, eps
    ("gemma2", ("attn_logit_softcapping",), 0, ["attn_logit_softcapping", "0"]),
    ("gemma2", ("final_logit_softcapping",), NAN, ["final_logit_softcapping", "nan"]),
    ("gemma3_text", ("final_logit_softcapping",), -30.0, ["final_logit_softcapping", "-30.0"]),
    ("gemma2", ("query_pre_attn_scalar",), 0, ["query_pre_attn_scalar", "0"]),
    ("olmo2", ("rms_norm_eps",), 0, ["rms_norm_eps", "0"]),
    ("smollm3", ("rms_norm_eps",), INF, ["rms_norm_eps", "inf"]),
    ("gpt_oss", ("swiglu_limit",), NAN, ["swiglu_limit", "nan"]),
    ("gpt_oss", ("swiglu_alpha",), True, ["swiglu_alpha", "True"]),
    ("deepseek_v3", ("routed_scaling_factor",), INF, ["routed_scaling_factor", "inf"]),
    # layer types from a known set, layer indices within range, flags that are flags
    ("gpt_oss", ("layer_types",), ["chunked_attention", "full_attention"], ["layer_types", "'chunked_attention'"]),
    ("gemma2", ("layer_types",), ["sliding_attention", "banana"], ["layer_types", "'banana'"]),
    ("smollm3", ("layer_types",), ["full_attention"] * 3 + ["banana"], ["layer_types", "'banana'"]),
    ("gemma2", ("layer_types",), [], ["layer_types", "0 entries"]),
    ("qwen3_moe", ("mlp_only_layers",), [99], ["mlp_only_layers", "99"]),
    ("qwen3_moe", ("mlp_only_layers",), [-1], ["mlp_only_layers", "-1"]),
    ("qwen3_moe", ("mlp_only_layers",), [1, 1], ["mlp_only_layers", "1 twice"]),
    ("qwen3_moe", ("mlp_only_layers",), [True], ["mlp_only_layers", "True"]),
    ("qwen3_moe", ("decoder_sparse_step",), 0, ["decoder_sparse_step", "0"]),
    ("smollm3", ("no_rope_layers",), [1, 1, 1, 2], ["no_rope_layers", "2"]),
    ("qwen2", ("max_window_layers",), -1, ["max_window_layers", "-1"]),
    ("mixtral", ("tie_word_embeddings",), "false", ["tie_word_embeddings", "'false'"]),
    ("qwen3_moe", ("norm_topk_prob",), 3, ["norm_topk_prob", "3"]),
    ("mixtral", ("eos_token_id",), 2.5, ["eos_token_id", "2.5"]),
]


def hostile_copy(tmp_path, family: str, keys: tuple, value: object):
    directory = tmp_path / family
    shutil.copytree(HF_DATA / family, directory)
    if keys == ("num_experts",):  # the fixture spells it num_local_experts, which wins when both are given
        document = json.loads((directory / "config.json").read_text())
        document.pop("num_local_experts")
        (directory / "config.json").write_text(json.dumps(document))
    with_json_field(directory / "config.json", keys, value)
    return directory


def load_within_caps(path) -> Stats:
    stats = Stats()
    with capped(stats, str(path), MEMORY_CAP, TIME_CAP):
        refllm.load_model(path)
    return stats


@pytest.mark.parametrize("family", sorted({case[0] for case in CASES}))
def test_each_family_checkpoint_loads_within_the_caps(family):
    assert load_within_caps(HF_DATA / family).worst_peak_bytes < MEMORY_CAP


@pytest.mark.parametrize(("family", "keys", "value", "named"), CASES, ids=lambda x: str(x)[:40])
def test_a_hostile_value_is_refused_naming_file_field_and_value(tmp_path, family, keys, value, named):
    directory = hostile_copy(tmp_path, family, keys, value)
    with pytest.raises(ConfigError) as refused:
        load_within_caps(directory)
    message = str(refused.value)
    assert str(directory / "config.json") in message
    for part in named:
        assert part in message, message
    assert "\n" not in message


@pytest.mark.parametrize("count", [10**7, 2**31 - 1])
def test_an_expert_count_past_the_tensors_is_refused_before_anything_per_expert(tmp_path, count):
    stats = Stats()
    directory = hostile_copy(tmp_path, "mixtral", ("num_local_experts",), count)
    with pytest.raises(ConfigError, match=f"gives {count} experts per sparse layer, but its tensors hold 4 experts"):
        with capped(stats, "mixtral", MEMORY_CAP, TIME_CAP):
            refllm.load_model(directory)
    assert stats.worst_peak_bytes < 50 << 20  # nothing was built per expert


def test_a_zero_is_a_value_not_a_missing_key():
    """``x or default`` read 0 as absent; absent or null still takes the default."""
    config = json.loads((HF_DATA / "gpt_oss" / "config.json").read_text())
    rope = config["rope_parameters"]
    for key in ("beta_slow", "factor"):
        with pytest.raises(ConfigError, match=f"{key} must be a finite number"):
            ModelConfig.from_hf(config | {"rope_parameters": rope | {key: 0}})
    without = {key: value for key, value in rope.items() if key != "beta_slow"}
    defaulted = ModelConfig.from_hf(config | {"rope_parameters": without | {"beta_fast": None}})
    assert (defaulted.rope["full_attention"].beta_slow, defaulted.rope["full_attention"].beta_fast) == (1.0, 32.0)
