"""Each family's tensor table (refllm/families/tables.py): consistent with its recipe, cheap to build whatever
the expert count, the same names and shapes as the checkpoint transformers writes."""

from __future__ import annotations

import time

import pytest

from refllm.config import ModelConfig
from refllm.families import checkpoint_tensors
from refllm.families.experts import FUSED, STACKED
from refllm.families.tables import NORM_ROLES, is_routed_expert
from refllm.io.safetensors import HFDirectorySource
from refllm.models.weights import canonical_name
from refllm.testing.configs import ARCHITECTURES, tiny_config_json
from tests.helpers.paths import HF_DATA

FIXTURES = sorted(path.name for path in HF_DATA.iterdir() if (path / "config.json").exists())


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_every_layer_holds_the_norms_its_placement_places(model_type):
    config = ModelConfig.from_hf(tiny_config_json(model_type))
    placed = set(NORM_ROLES[config.norms.placement])
    for layer in range(config.num_hidden_layers):
        norms = {role.split(".", 2)[2] for tensor in checkpoint_tensors(config) for role in tensor.roles
                 if role.startswith(f"layers.{layer}.") and "." not in role.split(".", 2)[2]}  # fmt: skip
        assert norms == placed


@pytest.mark.parametrize("fixture", FIXTURES)
def test_the_table_is_the_checkpoints_names_and_shapes(fixture):
    source = HFDirectorySource(HF_DATA / fixture)
    table = {tensor.name: tensor.shape for tensor in checkpoint_tensors(source.config)}
    held = {canonical_name(name): tuple(source.tensor(name).shape) for name in source.tensor_names()}
    held.pop(None, None)  # a vision-language checkpoint's tower and connector: not the text model's table
    assert table == held


@pytest.mark.parametrize("layout", [STACKED, FUSED])
def test_a_table_of_ten_million_experts_names_none_of_them_until_read(layout):
    """A hostile count in a file that stacks its experts: the table is built before any shape is compared."""
    config = ModelConfig.from_hf(tiny_config_json("mixtral") | {"num_local_experts": 10**7})
    start = time.perf_counter()
    tensors = checkpoint_tensors(config, layout)
    assert time.perf_counter() - start < 1.0
    experts = [tensor for tensor in tensors if is_routed_expert(tensor.roles[0])]
    assert experts and all(tensor.shape[0] == 10**7 and len(tensor.roles) >= 10**7 for tensor in experts)
    assert experts[0].roles[10**7 - 1] == f"layers.0.mlp.experts.{10**7 - 1}.gate_proj"  # gate then (fused) up
