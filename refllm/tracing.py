"""Inside a forward pass: every op's output, per layer, with the attention maps and the experts' routes.

    from refllm.tracing import trace
    t = trace(model, token_ids)                 # one forward pass over the prompt, through the spec ops
    t.layers[3].attention                       # [H, T, T]: how much each head's query t looks at each key
    t.layers[3].ops                             # every op of layer 3 in call order: name, weight, output
    ids, probs = t.logit_lens(top=5)            # [L, T, 5]: what each layer's residual stream would predict
    t.lens(12)                                  # [T, V]: layer 12's logit lens in full
    t.layers[1].experts                         # (expert ids [T, k], weights [T, k]) in a sparse layer

``trace`` runs the model's own forward pass (``refllm/models``) built anew on a
recording twin of the spec ops (``DecoderModel.with_ops``, ``refllm/models/ops.py``): each
call is the ``refllm/nn`` function itself, and its output is kept. Attention
runs on the contiguous cache with ``refllm.nn.attention.attention``, and its
map is ``attention_weights`` of the same query and keys. A model whose
matrices stay in quantized blocks is traced through the spec of a quantized
product: the blocks dequantized (``refllm.quant.formats``), then ``linear``.
The model itself is untouched, so a served or fast model can be traced as it runs.

An op is placed in a layer by the weight it reads (``layers.3.attention.q_proj``); an op
without weights (RoPE, attention, the MLP's gate) belongs to the layer of the
op before it. A layer's ``residual`` is the residual stream entering it (what
its first op reads), and the logit lens puts the residual stream after each
layer through the model's final norm and LM head.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from refllm.kv import CacheConfig
from refllm.models.ops import SPEC_OPS, OpSet
from refllm.nn.attention import attention_weights
from refllm.nn.latent_attention import expand_latent
from refllm.quant.linear import QuantizedTensor

FINAL = "final"  # the ``layer`` of the ops after the last decoder layer: the final norm and the LM head


@dataclass
class OpRecord:
    """One op call: its name in the op set, the weight it read (its path in the model's weights), the
    decoder layer it belongs to (``FINAL`` after the last, None before the first), and its output."""

    name: str
    weight: str | None
    layer: int | str | None
    output: np.ndarray


@dataclass
class LayerTrace:
    """One decoder layer of a traced forward pass."""

    index: int
    residual: np.ndarray  # [T, D]: the residual stream entering the layer
    ops: list[OpRecord] = field(default_factory=list)
    attention: np.ndarray | None = None  # [H, T, S]: each head's softmax weights over the keys
    router_logits: np.ndarray | None = None  # [T, X] in a sparse layer
    experts: tuple[np.ndarray, np.ndarray] | None = None  # (expert ids [T, k], their weights [T, k])


@dataclass
class Trace:
    """A forward pass over ``tokens``: ``layers`` in order, the final hidden states and logits, every op."""

    tokens: np.ndarray  # [T]
    layers: list[LayerTrace]
    residual: np.ndarray  # [T, D]: the residual stream after the last layer, before the final norm
    hidden: np.ndarray  # [T, D]: after the final norm
    logits: np.ndarray  # [T, V]
    ops: list[OpRecord]  # every op in call order (empty when traced with keep_ops=False)
    _to_logits: Callable[[np.ndarray], np.ndarray] = field(repr=False)

    def residual_after(self, layer: int) -> np.ndarray:
        """[T, D]: the residual stream leaving ``layer``."""
        return self.layers[layer + 1].residual if layer + 1 < len(self.layers) else self.residual

    def lens(self, layer: int, positions: Sequence[int] | None = None) -> np.ndarray:
        """The logit lens of one layer: its outgoing residual stream through the final norm and the LM head,
        as if the model ended there -> logits [P, V]. ``positions``: which of the T positions (default all)."""
        rows = slice(None) if positions is None else np.asarray(positions)
        return self._to_logits(self.residual_after(layer)[rows])

    def logit_lens(self, top: int = 5, positions: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray]:
        """What each layer would predict at each position were it the last (``lens``) -> (token ids
        [L, P, top], probabilities [L, P, top]), most likely first."""
        logits = np.stack([self.lens(i, positions) for i in range(len(self.layers))]).astype(np.float64)
        ids = np.argsort(-logits, axis=-1, kind="stable")[..., :top]
        probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        return ids, np.take_along_axis(probs, ids, axis=-1)


def trace(model: Any, token_ids: Sequence[int], *, keep_ops: bool = True) -> Trace:
    """One forward pass of ``model`` (a ``DecoderModel``) over ``token_ids`` [T] through the recording
    spec ops -> its Trace. ``keep_ops=False`` keeps only the per-layer summaries (residual stream,
    attention maps, routes), not every op's output: less memory for long prompts."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    if tokens.ndim != 1 or len(tokens) == 0:
        raise ValueError(f"trace takes a non-empty list of token ids; got shape {tokens.shape}")
    recorder = _Recorder(_weight_names(model.weights), model.config.num_hidden_layers, keep_ops)
    twin = model.with_ops(recorder.op_set())  # the same weights and config, another op set
    cache = twin.create_kv_cache(CacheConfig(kind="contiguous"))
    hidden = twin.prefill_hidden(tokens[None], cache, range(len(tokens)))[0]  # [T, D], after the final norm
    logits = twin.logits(hidden)
    plain = model.with_ops(dataclasses.replace(SPEC_OPS, linear=_dequantizing_linear))

    def to_logits(residual: np.ndarray) -> np.ndarray:
        with plain.ops.running():
            return plain.logits(plain.final_norm(residual))

    layers = recorder.layers
    for layer in layers:
        if layer.router_logits is not None:
            layer.experts = model.layers[layer.index].mlp.route(layer.router_logits)  # the layer's own routing
    return Trace(tokens, layers, recorder.final_input, hidden, logits, recorder.ops, to_logits)


def compare(a: Trace, b: Trace) -> list[tuple[OpRecord, float]]:
    """Two traces of one model over the same tokens (float32 against float64, say) -> each op of ``a``
    with the largest relative difference of its output from ``b``'s: where two runs part ways."""
    if len(a.ops) != len(b.ops) or any(x.name != y.name for x, y in zip(a.ops, b.ops)):
        raise ValueError("the traces ran different ops: trace the same model over the same tokens with keep_ops")
    out = []
    for x, y in zip(a.ops, b.ops):
        reference = np.asarray(y.output, np.float64)
        scale = max(float(np.abs(reference).max()), np.finfo(np.float64).tiny)
        out.append((x, float(np.abs(np.asarray(x.output, np.float64) - reference).max()) / scale))
    return out


# ---- recording -------------------------------------------------------------------------------------------


def _dequantizing_linear(x: np.ndarray, weight: Any, bias: np.ndarray | None = None) -> np.ndarray:
    """The spec of a product with quantized blocks: dequantize them, then ``linear``."""
    if isinstance(weight, QuantizedTensor):
        weight = weight.dequantize()
    return SPEC_OPS.linear(x, weight, bias)


def _weight_names(weights: Any) -> dict[int, list[str]]:
    """id of every array in the model's weights -> its paths ("layers.3.q_proj"); a tied array has two."""
    names: dict[int, list[str]] = {}

    def visit(value: Any, path: str) -> None:
        if isinstance(value, (np.ndarray, QuantizedTensor)):
            names.setdefault(id(value), []).append(path)
        elif dataclasses.is_dataclass(value):
            for f in dataclasses.fields(value):
                visit(getattr(value, f.name), f"{path}.{f.name}" if path else f.name)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(item, f"{path}.{i}")

    visit(weights, "")
    return names


class _Recorder:
    """The spec ops, each call kept as an OpRecord and filed under its layer."""

    def __init__(self, names: dict[int, list[str]], num_layers: int, keep_ops: bool):
        self.names, self.num_layers, self.keep_ops = names, num_layers, keep_ops
        self.ops: list[OpRecord] = []
        self.layers: list[LayerTrace] = []
        self.layer: int | str | None = None
        self.final_input: np.ndarray | None = None  # [T, D]: the final norm's input

    def op_set(self) -> OpSet:
        def recording(name: str, function: Callable, weight_arg: int | None = 1) -> Callable:
            @functools.wraps(function)
            def op(*args, **kwargs):
                weight = self._weight_name(name, args[weight_arg]) if weight_arg is not None else None
                self._enter(weight, args[0])
                if weight == "norm":
                    self.final_input = np.array(args[0][0])
                out = function(*args, **kwargs)
                self._keep(OpRecord(name, weight, self.layer, out))
                return out

            return op

        return OpSet(
            name="traced spec",
            embed=recording("embed", SPEC_OPS.embed),
            rms_norm=recording("rms_norm", SPEC_OPS.rms_norm),
            layer_norm=recording("layer_norm", SPEC_OPS.layer_norm),
            rope_angles=SPEC_OPS.rope_angles,
            apply_rope=recording("apply_rope", SPEC_OPS.apply_rope, None),
            linear=recording("linear", _dequantizing_linear),
            gated=recording("gated", SPEC_OPS.gated, None),
            attention=self._attention,
            running=SPEC_OPS.running,
            latent_attention=self._latent_attention,
        )

    def _weight_name(self, op: str, weight: Any) -> str | None:
        names = self.names.get(id(weight), [])
        if op == "linear" and len(names) > 1:  # a tied embedding read as the LM head
            names = [n for n in names if n != "embed_tokens"]
        return names[0] if names else None

    def _enter(self, weight: str | None, first_input: np.ndarray) -> None:
        """Move to the layer ``weight`` belongs to; the first op of a layer reads the residual stream."""
        if weight is None:
            return
        parts = weight.split(".")
        if parts[0] == "layers":
            layer = int(parts[1])
        elif parts[0] in ("norm", "lm_head"):
            layer = FINAL
        else:
            return
        if layer != self.layer and isinstance(layer, int):
            self.layers.append(LayerTrace(layer, np.array(first_input[0])))
        self.layer = layer

    def _keep(self, record: OpRecord) -> None:
        if self.keep_ops:
            self.ops.append(record)
            if isinstance(record.layer, int):
                self.layers[-1].ops.append(record)
        if record.weight is not None and record.weight.endswith(".router"):
            self.layers[-1].router_logits = np.array(record.output)

    def _attention(self, q, k, v, query_positions, scale, window=None, softcap=None, sinks=None):
        self.layers[-1].attention = attention_weights(q, k, query_positions, scale, window, softcap, sinks)
        out = SPEC_OPS.attention(q, k, v, query_positions, scale, window, softcap, sinks)
        self._keep(OpRecord("attention", None, self.layer, out))
        return out

    def _latent_attention(self, q, latent, values, query_positions, scale, window=None, softcap=None, *,
                          kv_b_proj, nope_dim):  # fmt: skip
        if isinstance(kv_b_proj, QuantizedTensor):
            kv_b_proj = kv_b_proj.dequantize()
        k, _ = expand_latent(latent[:, 0], kv_b_proj, q.shape[1], nope_dim)
        self.layers[-1].attention = attention_weights(q, k, query_positions, scale, window, softcap)
        out = SPEC_OPS.latent_attention(
            q, latent, values, query_positions, scale, window, softcap, kv_b_proj=kv_b_proj, nope_dim=nope_dim
        )
        self._keep(OpRecord("latent_attention", None, self.layer, out))
        return out

