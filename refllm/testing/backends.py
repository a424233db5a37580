"""Adapters: every kind of backend seen through one small interface, ``Backend``.

A backend is any of:

- an object implementing refllm's ``GenerativeModel`` contract
  (``refllm/models/contract.py``): wrapped by ``ModelBackend``;
- an object implementing the ``DecoderOnlyLLM`` contract (``prefill(cache_id,
  tokens)``, ``decode(cache_id, token, pos)``, ``decode_batch``, ``release``,
  ``reset``): wrapped by ``LLMBackend``;
- a plain callable ``tokens -> logits[seq, vocab]``: wrapped by ``CallableBackend``
  (the stateless properties apply to it: logits, greedy, and long_horizon in one call);
- a ``Backend`` subclass of its own (``refllm.testing.hf.TransformersBackend`` is one).

The conformance kit calls a *factory*, ``factory(checkpoint) -> backend``, once
per drawn model: the backend must run the weights of the ``Checkpoint`` it is
given (``factories.py``).

For failure reports a backend may expose its hidden states after every layer
(``layer_states``) and what enters and leaves each layer's attention and MLP
(``sublayer_states``): refllm's own models expose both (``refllm_layer_states``,
``refllm_sublayer_states``, ``layer_trace.py``), another model or LLM through methods
``hidden_states(tokens)`` and ``sublayer_states(tokens)`` of its own.

Shapes: ``T`` tokens, ``V`` vocabulary, ``B`` batch rows, ``L`` layers, ``D`` hidden size.
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from refllm.errors import InvalidInputError, UnknownSequenceError
from refllm.kv.base import CacheConfig
from refllm.testing.layer_trace import refllm_layer_states, refllm_sublayer_states, traced


class Unsupported(Exception):
    """Raised by a factory for a drawn model its backend cannot run: the kit draws another instead."""


class NotABackendError(InvalidInputError):
    """An object that implements none of the contracts a backend may implement."""


class Backend:
    """What the properties call. Adapters override what their contract offers.

    A cache id names one sequence: ``prefill`` starts it (or continues it, for a
    chunked prompt), ``decode`` appends one token, ``release`` forgets it.
    """

    name = "backend"
    has_cache_ids = True  # prefill/decode/release by cache id
    can_truncate = False
    can_fork = False
    can_greedy = False  # picks greedy tokens itself (``greedy``)
    _scratch_ids = itertools.count(2**31 - 1, -1)  # fresh ids for stateless calls: never a reused one

    def all_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """A fresh sequence -> logits at every position, [T, V]."""
        raise NotImplementedError

    def last_logits(self, tokens: Sequence[int]) -> np.ndarray:
        """A fresh sequence -> logits of its last position, [V]."""
        return self.all_logits(tokens)[-1]

    def batch_all_logits(self, rows: Sequence[Sequence[int]]) -> np.ndarray:
        """Equal-length fresh sequences in one batch -> [B, T, V]."""
        return np.stack([self.all_logits(row) for row in rows])

    def prefill(self, cache_id: int, tokens: Sequence[int]) -> np.ndarray:
        """Start or continue ``cache_id`` with ``tokens`` -> logits of the last one, [V]."""
        raise NotImplementedError

    def decode(self, cache_id: int, token: int) -> np.ndarray:
        """One more token for a live ``cache_id`` -> [V]."""
        raise NotImplementedError

    def decode_batch(self, pairs: Sequence[tuple[int, int]]) -> np.ndarray:
        """(cache_id, token) for distinct live ids of any lengths -> [B, V]."""
        return np.stack([self.decode(cache_id, token) for cache_id, token in pairs])

    def release(self, cache_id: int) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        raise NotImplementedError

    def truncate(self, cache_id: int, length: int) -> None:
        """Roll ``cache_id`` back to its first ``length`` tokens."""
        raise NotImplementedError

    def branches(self, prompt: Sequence[int], continuations: Sequence[Sequence[int]]) -> np.ndarray:
        """One prompt forked into B branches, each fed its own continuation (n tokens each) -> [B, n, V]."""
        raise NotImplementedError

    def greedy(self, tokens: Sequence[int], new_tokens: int) -> list[int]:
        """The backend's own greedy continuation of a fresh sequence: ``new_tokens`` ids it chose."""
        raise NotImplementedError

    def replay(self, calls: Sequence[tuple]) -> np.ndarray:
        """A fresh sequence fed ``calls`` (("prefill", tokens) or ("truncate", length)) in turn -> last logits [V]."""
        cache_id = next(self._scratch_ids)
        try:
            for op, arg in calls:
                if op == "prefill":
                    logits = self.prefill(cache_id, arg)
                else:
                    self.truncate(cache_id, arg)
        finally:
            self.release(cache_id)
        return logits

    def layer_states(self, tokens: Sequence[int]) -> np.ndarray | None:
        """Hidden states entering layer 0 and leaving every layer, [L + 1, T, D], or None if not exposed."""
        return None

    def sublayer_states(self, tokens: Sequence[int]) -> list[dict[str, np.ndarray]] | None:
        """What enters and leaves each layer's attention and MLP in a one-shot prefill of ``tokens``: one dict per
        layer, from the names in ``layer_trace.SUBLAYER_POINTS`` (those it exposes) to [T, D]; None if not exposed."""
        return None

    def bounded(self, capacity: int) -> Backend | None:
        """A fresh backend whose KV storage holds exactly ``capacity`` tokens in all, or None if unsupported."""
        return None


class ModelBackend(Backend):
    """A GenerativeModel: one KV cache per cache id, each holding sequence 0.

    Released caches are kept (emptied) and handed to the next new cache id, so
    what ``free`` leaves behind is seen by later sequences. The contract
    batches only rows of equal length, so ``decode_batch`` runs its rows one
    by one; batching is exercised by ``batch_all_logits`` and ``branches``.
    """

    def __init__(self, model, cache_config: CacheConfig | None = None, name: str | None = None):
        self.model = model
        self.cache_config = cache_config
        self.name = name or type(model).__name__
        self._caches: dict[int, object] = {}
        self._idle: list[object] = []
        probe = model.create_kv_cache(cache_config)
        self.can_truncate = callable(getattr(probe, "truncate", None))
        self.can_fork = callable(getattr(probe, "fork", None))
        self._greedy = _find_method(model, ("greedy",))
        self.can_greedy = self._greedy is not None

    def _new_cache(self):
        return self._idle.pop() if self._idle else self.model.create_kv_cache(self.cache_config)

    def _live(self, cache_id: int):
        if cache_id not in self._caches:
            raise UnknownSequenceError(f"unknown cache id {cache_id}")
        return self._caches[cache_id]

    def all_logits(self, tokens):
        cache = self.model.create_kv_cache(self.cache_config)
        return self.model.prefill_all_logits(_ids([tokens]), cache, range(len(tokens)))[0]

    def last_logits(self, tokens):
        cache = self.model.create_kv_cache(self.cache_config)
        return self.model.prefill(_ids([tokens]), cache, range(len(tokens)))[0]

    def batch_all_logits(self, rows):
        cache = self.model.create_kv_cache(self.cache_config)
        return self.model.prefill_all_logits(_ids(rows), cache, range(len(rows[0])))

    def prefill(self, cache_id, tokens):
        is_new = cache_id not in self._caches
        cache = self._new_cache() if is_new else self._caches[cache_id]
        start = cache.length(0) if 0 in cache else 0
        try:
            logits = self.model.prefill(_ids([tokens]), cache, range(start, start + len(tokens)))
        except BaseException:
            if is_new:
                self._idle.append(cache)
            raise
        self._caches[cache_id] = cache
        return logits[0]

    def decode(self, cache_id, token):
        return self.model.decode(_ids([[token]]), self._live(cache_id))[0]

    def release(self, cache_id):
        cache = self._live(cache_id)
        if 0 in cache:
            cache.free(0)
        del self._caches[cache_id]
        self._idle.append(cache)

    def reset(self):
        for cache_id in list(self._caches):
            self.release(cache_id)

    def truncate(self, cache_id, length):
        self._live(cache_id).truncate(0, length)

    def greedy(self, tokens, new_tokens):
        return list(self._greedy(list(tokens), new_tokens))

    def branches(self, prompt, continuations):
        cache = self.model.create_kv_cache(self.cache_config)
        self.model.prefill(_ids([prompt]), cache, range(len(prompt)))
        for row in range(1, len(continuations)):
            cache.fork(0, row)
        steps = [self.model.decode(_ids([[c[t]] for c in continuations]), cache) for t in range(len(continuations[0]))]
        return np.stack(steps, axis=1)

    def layer_states(self, tokens):
        states = traced(self.model, self.model, "hidden_states", refllm_layer_states, tokens, self.cache_config)
        return None if states is None else np.asarray(states)

    def sublayer_states(self, tokens):
        return traced(self.model, self.model, "sublayer_states", refllm_sublayer_states, tokens, self.cache_config)

    def bounded(self, capacity):
        config = self.cache_config or CacheConfig()
        if config.kind == "paged":
            if capacity % config.block_size:
                raise InvalidInputError(f"capacity {capacity} is not a multiple of block size {config.block_size}")
            config = replace(config, num_blocks=capacity // config.block_size, max_bytes=None)
        else:
            shape = getattr(self.model.create_kv_cache(config), "shape", None)  # refllm's KVCache.shape
            if shape is None:
                return None
            config = replace(config, max_bytes=capacity * shape.bytes_per_token)
        return ModelBackend(self.model, config, f"{self.name} ({capacity} tokens)")


class LLMBackend(Backend):
    """A DecoderOnlyLLM: cache ids map straight onto the LLM's own; positions are tracked here.

    ``truncate`` is found as ``truncate_kv`` or ``truncate`` on the LLM or on its
    ``executor``; ``fork`` likewise; ``greedy(tokens, new_tokens) -> ids`` (the
    LLM's own greedy decoding, for ``own_greedy``) likewise, or given here.
    Stateless calls run on fresh scratch cache ids, so reusing a released id
    is exercised only where a property means to.

    ``with_capacity(tokens) -> LLM`` builds a fresh LLM whose KV storage holds
    that many tokens. The ``memory`` property needs it: a bare DecoderOnlyLLM
    cannot be bounded from outside, so without it ``memory`` is skipped (and
    the skip says so).
    """

    def __init__(
        self,
        llm,
        name: str | None = None,
        with_capacity: Callable[[int], object] | None = None,
        greedy: Callable[[list[int], int], Sequence[int]] | None = None,
    ):
        self.llm = llm
        self.name = name or type(llm).__name__
        self._with_capacity = with_capacity
        self._lengths: dict[int, int] = {}
        self._truncate = _find_method(llm, ("truncate_kv", "truncate"))
        self._fork = _find_method(llm, ("fork",))
        self._greedy = greedy or _find_method(llm, ("greedy",))
        self.can_truncate = self._truncate is not None
        self.can_fork = self._fork is not None
        self.can_greedy = self._greedy is not None

    def all_logits(self, tokens):
        return np.stack([self.last_logits(tokens[: t + 1]) for t in range(len(tokens))])

    def last_logits(self, tokens):
        cache_id = next(self._scratch_ids)
        logits = np.asarray(self.llm.prefill(cache_id, list(tokens)))
        self.llm.release(cache_id)
        return logits

    def prefill(self, cache_id, tokens):
        logits = np.asarray(self.llm.prefill(cache_id, list(tokens)))
        self._lengths[cache_id] = self._lengths.get(cache_id, 0) + len(tokens)
        return logits

    # The bookkeeping never raises: a call the LLM wrongly accepts must be reported as that call.
    def decode(self, cache_id, token):
        logits = np.asarray(self.llm.decode(cache_id, token, self._lengths.get(cache_id, 0)))
        self._lengths[cache_id] = self._lengths.get(cache_id, 0) + 1
        return logits

    def decode_batch(self, pairs):
        logits = np.asarray(self.llm.decode_batch([(i, t, self._lengths.get(i, 0)) for i, t in pairs]))
        for cache_id, _ in pairs:
            self._lengths[cache_id] = self._lengths.get(cache_id, 0) + 1
        return logits

    def release(self, cache_id):
        self.llm.release(cache_id)
        self._lengths.pop(cache_id, None)

    def reset(self):
        self.llm.reset()
        self._lengths.clear()

    def truncate(self, cache_id, length):
        self._truncate(cache_id, length)
        self._lengths[cache_id] = length

    def greedy(self, tokens, new_tokens):
        return list(self._greedy(list(tokens), new_tokens))

    def branches(self, prompt, continuations):
        ids = [next(self._scratch_ids) for _ in continuations]
        try:
            self.prefill(ids[0], prompt)
            for cache_id in ids[1:]:
                self._fork(ids[0], cache_id)
                self._lengths[cache_id] = len(prompt)
            steps = [
                self.decode_batch([(i, c[t]) for i, c in zip(ids, continuations)]) for t in range(len(continuations[0]))
            ]
        finally:
            for cache_id in ids:
                if cache_id in self._lengths:
                    self.release(cache_id)
        return np.stack(steps, axis=1)

    def layer_states(self, tokens):  # refllm's LLM: diagnosed through its model
        states = traced(self.llm, getattr(self.llm, "model", None), "hidden_states", refllm_layer_states, tokens)
        return None if states is None else np.asarray(states)

    def sublayer_states(self, tokens):
        return traced(self.llm, getattr(self.llm, "model", None), "sublayer_states", refllm_sublayer_states, tokens)

    def bounded(self, capacity):
        if self._with_capacity is None:
            return None
        return LLMBackend(
            self._with_capacity(capacity), f"{self.name} ({capacity} tokens)", self._with_capacity, self._greedy
        )


class CallableBackend(Backend):
    """A plain function tokens -> logits [T, V]: stateless, so only the properties of fresh prompts apply (logits,
    greedy, and long_horizon's sequences of up to 320 tokens in one call)."""

    has_cache_ids = False

    def __init__(self, fn: Callable, name: str | None = None):
        self.fn = fn
        self.name = name or getattr(fn, "__qualname__", type(fn).__name__)

    def all_logits(self, tokens):
        return np.asarray(self.fn(list(tokens)))


def _find_method(obj, names: tuple[str, ...]):
    """The first plain (not async) method called one of ``names`` on ``obj`` or on ``obj.executor``."""
    for holder in (obj, getattr(obj, "executor", None)):
        for name in names:
            method = getattr(holder, name, None)
            if callable(method) and not inspect.iscoroutinefunction(method):
                return method
    return None


def _ids(rows) -> np.ndarray:
    return np.asarray(rows, dtype=np.int64)


def as_backend(obj) -> Backend:
    """Wrap ``obj`` in the adapter for the contract it implements (duck-typed)."""
    if isinstance(obj, Backend):
        return obj
    if hasattr(obj, "create_kv_cache") and hasattr(obj, "prefill_all_logits"):
        return ModelBackend(obj)
    if all(callable(getattr(obj, m, None)) for m in ("prefill", "decode", "decode_batch", "release", "reset")):
        return LLMBackend(obj)
    if callable(obj):
        return CallableBackend(obj)
    raise NotABackendError(
        f"{type(obj).__name__} is not a backend: expected a GenerativeModel, a DecoderOnlyLLM,"
        " a refllm.testing.Backend or a callable tokens -> logits"
    )
