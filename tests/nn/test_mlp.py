"""The gated MLP's activations: every one a config may name has its spec function."""

from __future__ import annotations

from refllm.config import ACTIVATIONS as CONFIG_ACTIVATIONS
from refllm.nn.mlp import ACTIVATIONS


def test_every_activation_a_config_accepts_has_a_spec_function():
    assert tuple(ACTIVATIONS) == CONFIG_ACTIVATIONS
