"""refllm's own models traced layer by layer, for failure reports: the hidden states after every layer, and
what enters and leaves each layer's attention and MLP (the points of SUBLAYER_POINTS).

``explain.py`` compares a backend's with these to name the first layer and op that diverge;
``backends.py`` offers them as the ``layer_states`` and ``sublayer_states`` of refllm's models.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import numpy as np

from refllm.kv.base import CacheConfig

# the points inside a decoder layer the failure report compares, in the order the layer computes them
SUBLAYER_POINTS = ("attention input", "attention output", "MLP input", "MLP output")


def refllm_layer_states(model, tokens: Sequence[int], cache_config: CacheConfig | None = None) -> np.ndarray:
    """Run a ``DecoderModel`` layer by layer, through the layer objects its recipe built -> [L + 1, T, D]."""
    return _run_layers(model, tokens, cache_config, record=False)[0]


def refllm_sublayer_states(
    model, tokens: Sequence[int], cache_config: CacheConfig | None = None
) -> list[dict[str, np.ndarray]]:
    """Run a ``DecoderModel`` layer by layer, noting what enters and leaves each layer's attention and MLP
    -> one dict per layer, SUBLAYER_POINTS -> [T, D] (empty for a layer without those parts)."""
    return _run_layers(model, tokens, cache_config, record=True)[1]


def _run_layers(model, tokens, cache_config, record: bool) -> tuple[np.ndarray, list[dict[str, np.ndarray]]]:
    x = model.embed(np.asarray([list(tokens)], np.int64))  # [1, T, D]
    cache = model.create_kv_cache(cache_config)
    positions = np.arange(len(tokens))[None]  # [1, T]
    cache.reserve([0], len(tokens))
    states, sublayers = [x[0]], []
    for layer in model.layers:
        if record:
            layer, seen = _noting_sublayers(layer)
            sublayers.append(seen)
        x = layer(x, positions, cache, [0])
        states.append(x[0])
    return np.stack(states), sublayers


def _noting_sublayers(layer) -> tuple[Callable, dict[str, np.ndarray]]:
    """A copy of a refllm layer whose attention and MLP note their input and output (row 0) in the dict."""
    layer = getattr(layer, "op_by_op", layer)  # a fused layer's op-by-op twin: the same numbers, part by part
    seen: dict[str, np.ndarray] = {}
    if not (hasattr(layer, "attention") and hasattr(layer, "mlp")):
        return layer, seen
    probe = copy.copy(layer)  # the layer's parts are plain attributes: the model itself is left as it is
    for attribute, part in (("attention", "attention"), ("mlp", "MLP")):

        def noted(h, *args, _sublayer=getattr(layer, attribute), _part=part):
            out = _sublayer(h, *args)
            seen[f"{_part} input"], seen[f"{_part} output"] = h[0], out[0]
            return out

        setattr(probe, attribute, noted)
    return probe, seen


def traced(owner, model, hook: str, refllm_trace: Callable, tokens, cache_config: CacheConfig | None = None):
    """``owner.<hook>(tokens)`` where the object has that method, else ``refllm_trace`` where ``model`` is
    refllm's ``DecoderModel``, else None (not exposed)."""
    method = getattr(owner, hook, None)
    if callable(method):
        return method(tokens)
    if hasattr(model, "layers") and hasattr(model, "weights"):
        return refllm_trace(model, tokens, cache_config)
    return None
