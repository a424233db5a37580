"""The first foreign backend: Hugging Face transformers, float32, eager attention.

``transformers_backend(checkpoint)`` is a factory: it builds the transformers
model for the checkpoint's ``config.json`` and loads its weights. Needs torch
and transformers (``pip install refllm[oracle]``); the tests that use it skip
when they are absent.

Each cache id holds a ``DynamicCache`` plus the token ids it has seen. Where
transformers and refllm's contract differ, the adapter bridges:

- Rollback (``truncate``) re-runs the kept tokens rather than cropping:
  transformers' sliding-window cache layers drop keys a rollback would need.
- transformers does not check token ids (an id past the vocabulary raises
  IndexError, a negative one silently reads the last row), so the adapter
  refuses bad input as refllm does.
- transformers picks experts with ``torch.topk``, which follows no index rule among
  exactly tied router scores; checkpoints drawn with tied routers (``Checkpoint.random``'s
  ``router``) are refused with ``Unsupported``, as refllm's tie rule cannot be asked of it.
- Dynamic NTK RoPE in transformers keeps the longest length it has seen;
  refllm scales by the longest position of the current forward pass, so
  dynamic rotary modules are restored to their initial state before every forward.

For failure reports it exposes per-layer hidden states (``layer_states``) and what
enters and leaves each decoder layer's ``self_attn`` and ``mlp`` (``sublayer_states``,
through forward hooks), so a report names the layer and the op that diverge.
"""

from __future__ import annotations

import copy
import inspect

import numpy as np

from refllm.errors import InvalidInputError, TokenOutOfRangeError, UnknownSequenceError, WeightError
from refllm.moe_parameters import MoeParameters
from refllm.testing.backends import Backend, Unsupported


class TransformersBackend(Backend):
    """A transformers causal LM (float32, eager attention) behind the kit's ``Backend`` interface."""

    can_truncate = True
    can_fork = True

    def __init__(self, model, name: str = "transformers"):
        import torch

        self.torch = torch
        self.model = model.eval()
        self.name = name
        parameters = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in parameters else "past_key_values"
        self._dynamic_rotary = {  # module name -> its initial state
            name: copy.deepcopy(module)
            for name, module in model.named_modules()
            if type(module).__name__.endswith("RotaryEmbedding") and "dynamic" in str(getattr(module, "rope_type", ""))
        }
        self._sequences: dict[int, tuple[object, list[int]]] = {}

    def _forward(self, rows: list[list[int]], cache=None, **kwargs):
        vocab_size = self.model.config.vocab_size
        for row in rows:
            if not row:
                raise InvalidInputError("tokens must hold at least one token id")
            bad = [t for t in row if not 0 <= t < vocab_size]
            if bad:
                raise TokenOutOfRangeError(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})")
        for name, module in self._dynamic_rotary.items():
            parent, _, attribute = name.rpartition(".")
            setattr(self.model.get_submodule(parent), attribute, copy.deepcopy(module))
        with self.torch.no_grad():
            ids = self.torch.tensor(rows, dtype=self.torch.long)
            return self.model(input_ids=ids, use_cache=cache is not None, **{self._cache_kwarg: cache}, **kwargs)

    def all_logits(self, tokens):
        return self._forward([list(tokens)]).logits[0].float().numpy()

    def batch_all_logits(self, rows):
        return self._forward([list(r) for r in rows]).logits.float().numpy()

    def prefill(self, cache_id, tokens):
        from transformers import DynamicCache

        cache, seen = self._sequences.get(cache_id) or (DynamicCache(), [])
        logits = self._forward([list(tokens)], cache).logits[0, -1].float().numpy()
        self._sequences[cache_id] = (cache, seen + list(tokens))
        return logits

    def decode(self, cache_id, token):
        self._live(cache_id)
        return self.prefill(cache_id, [token])

    def release(self, cache_id):
        self._live(cache_id)
        del self._sequences[cache_id]

    def reset(self):
        self._sequences.clear()

    def truncate(self, cache_id, length):
        cache, seen = self._live(cache_id)
        if not 0 <= length <= len(seen):
            raise InvalidInputError(f"cannot truncate cache id {cache_id} of length {len(seen)} to {length}")
        if length:  # crop, not re-prefill: the kept keys stay as rotated (dynamic NTK rotates a re-prefill anew)
            if length < len(seen):
                cache.crop(length - len(seen))  # transformers 5 crops by a negative count of tokens to drop
            self._sequences[cache_id] = (cache, seen[:length])
        else:
            from transformers import DynamicCache

            self._sequences[cache_id] = (DynamicCache(), [])

    def branches(self, prompt, continuations):
        self.prefill(-1, prompt)
        root = self._sequences.pop(-1)
        out = []
        for continuation in continuations:
            self._sequences[-1] = copy.deepcopy(root)
            out.append([self.decode(-1, token) for token in continuation])
            del self._sequences[-1]
        return np.asarray(out)

    def layer_states(self, tokens):
        # hidden_states[0] is what enters layer 0 (the embeddings, scaled where the family scales them), but the
        # last entry has the final norm applied: hooks read each layer's own output instead.
        outputs = []

        def keep(module, inputs, output):
            outputs.append(_first_row(output))

        hooks = [layer.register_forward_hook(keep) for layer in self.model.model.layers]
        try:
            embeddings = self._forward([list(tokens)], output_hidden_states=True).hidden_states[0]
        finally:
            for hook in hooks:
                hook.remove()
        return np.stack([_first_row(embeddings), *outputs])

    def sublayer_states(self, tokens):
        # what enters self_attn is its hidden_states argument (the input norm applied); what leaves it and mlp
        # comes before any post-norm. A part named otherwise (transformers 4's Mixtral: block_sparse_moe) is
        # left out, and the report names the ops around it.
        layers, hooks = [], []
        try:
            for layer in self.model.model.layers:
                seen = {}
                layers.append(seen)
                for part, name in (("attention", "self_attn"), ("MLP", "mlp")):
                    module = getattr(layer, name, None)
                    if module is None:
                        continue
                    note_input, note_output = _noting(seen, part)
                    hooks.append(module.register_forward_pre_hook(note_input, with_kwargs=True))
                    hooks.append(module.register_forward_hook(note_output))
            self._forward([list(tokens)])
        finally:
            for hook in hooks:
                hook.remove()
        return layers

    def _live(self, cache_id):
        if cache_id not in self._sequences:
            raise UnknownSequenceError(f"unknown cache id {cache_id}")
        return self._sequences[cache_id]


def _first_row(output) -> np.ndarray:
    """A module's output (a tensor, or a tuple that starts with one) -> its batch row 0 as float32 NumPy."""
    return (output[0] if isinstance(output, tuple) else output)[0].float().numpy()


def _noting(seen: dict, part: str):
    """Forward hooks that note what enters and leaves a module in ``seen``, as "<part> input" and "<part> output"."""

    def note_input(module, args, kwargs):
        seen[f"{part} input"] = _first_row(kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])

    def note_output(module, args, output):
        seen[f"{part} output"] = _first_row(output)

    return note_input, note_output


def transformers_backend(checkpoint) -> TransformersBackend:
    """Factory: the transformers model for ``checkpoint`` (its config.json and weights), float32, eager."""
    import torch
    import transformers

    if checkpoint.config.experts is not None and checkpoint.weight_options.get("router", "random") != "random":
        raise Unsupported("torch.topk breaks exact ties among router scores by no index rule")
    if isinstance(checkpoint.config.experts, MoeParameters):
        # the Hub's per-expert tensors: transformers' own loader fuses them into its 3-D expert tensors
        model = transformers.AutoModelForCausalLM.from_pretrained(
            checkpoint.path, attn_implementation="eager", dtype=torch.float32
        )
        return TransformersBackend(model, f"transformers {type(model).__name__}")
    config = transformers.AutoConfig.for_model(**checkpoint.config_json)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    tensors = checkpoint.tensors
    if checkpoint.config.tie_word_embeddings:  # tied: the head is the embedding table; a stray lm_head is ignored
        tensors.pop("lm_head.weight", None)
    tensors = fuse_experts(tensors, set(model.state_dict()))
    state = {name: torch.from_numpy(np.array(array)) for name, array in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [m for m in missing if not (m == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise WeightError(
            f"transformers and the checkpoint disagree: missing {missing[:3]}, unexpected {unexpected[:3]}"
        )
    if config.tie_word_embeddings:
        model.tie_weights()
    return TransformersBackend(model, f"transformers {type(model).__name__}")


def fuse_experts(tensors: dict[str, np.ndarray], wanted: set[str]) -> dict[str, np.ndarray]:
    """Per-expert tensors (``mlp.experts.{e}.gate_proj.weight``, as checkpoints store them) stacked into the 3-D
    ``mlp.experts.gate_up_proj`` [X, 2F, D] and ``mlp.experts.down_proj`` [X, D, F] a transformers model
    holds, where ``wanted`` (its state dict's names) asks for them."""
    fused = dict(tensors)
    for name in wanted:
        prefix, _, kind = name.rpartition(".")
        if name in tensors or not prefix.endswith("mlp.experts") or kind not in ("gate_up_proj", "down_proj"):
            continue
        parts = ("gate_proj", "up_proj") if kind == "gate_up_proj" else ("down_proj",)
        experts = []
        while f"{prefix}.{len(experts)}.{parts[0]}.weight" in tensors:
            e = len(experts)
            experts.append(np.concatenate([fused.pop(f"{prefix}.{e}.{part}.weight") for part in parts]))
        fused[name] = np.stack(experts)
    return fused
