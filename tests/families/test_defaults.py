"""A config.json that leaves a key out means the family's default: the one transformers' config class holds."""

from __future__ import annotations

import pytest

from refllm.config import ModelConfig
from refllm.testing.configs import tiny_config_json

transformers = pytest.importorskip("transformers")

def _rope_theta(config) -> float:
    return config.rope_for_layer(0).theta


# (model_type, key left out, where refllm keeps the value it reads)
DEFAULTS = [
    ("cohere", "rope_theta", _rope_theta),
    ("mixtral", "rope_theta", _rope_theta),
    ("smollm3", "rope_theta", _rope_theta),
    ("phi3", "rms_norm_eps", lambda c: c.norms.eps),
    ("mixtral", "rms_norm_eps", lambda c: c.norms.eps),
    ("gpt_oss", "rms_norm_eps", lambda c: c.norms.eps),
    ("llama", "rms_norm_eps", lambda c: c.norms.eps),
    ("deepseek_v3", "routed_scaling_factor", lambda c: c.experts.routed_scaling_factor),
    ("deepseek_v3", "norm_topk_prob", lambda c: c.experts.norm_topk_prob),
    ("qwen3_moe", "norm_topk_prob", lambda c: c.experts.norm_topk_prob),
    ("smollm3", "tie_word_embeddings", lambda c: c.tie_word_embeddings),
]


@pytest.mark.parametrize(("model_type", "key", "read"), DEFAULTS, ids=[f"{t}-{k}" for t, k, _ in DEFAULTS])
def test_a_key_left_out_reads_as_transformers_default(model_type, key, read):
    config_json = tiny_config_json(model_type)
    config_json.pop(key, None)
    hf_config = transformers.AutoConfig.for_model(model_type)
    if key == "rope_theta" and not hasattr(hf_config, key):  # transformers 5 keeps it in rope_parameters
        expected = hf_config.rope_parameters[key]
    else:
        expected = getattr(hf_config, key)
    assert read(ModelConfig.from_hf(config_json)) == expected


def test_smollm3_derives_its_nope_layers_from_the_interval_as_transformers_does():
    for layers in (1, 2, 4, 8):
        for interval in (1, 2, 3, 4, None):
            config_json = tiny_config_json("smollm3") | {"num_hidden_layers": layers}
            config_json.pop("no_rope_layer_interval")
            if interval is not None:
                config_json["no_rope_layer_interval"] = interval
            flags = transformers.AutoConfig.for_model(**config_json).no_rope_layers  # 0 where a layer skips RoPE
            assert ModelConfig.from_hf(config_json).nope_layers == tuple(i for i, f in enumerate(flags) if not f)
