"""Factories: ``factory(checkpoint) -> backend``, found by ``module:factory`` name.

The kit builds every backend it checks through a factory, once per drawn
model, so the backend runs exactly the checkpoint's weights. refllm's own
paths are factories here: ``refllm_paged`` (the fast op set's Numba kernels
over the paged arena), ``refllm_llm`` (the runtime's ``LLM``),
``refllm_contiguous`` (the spec ops on the contiguous cache: the float32
reference) and ``refllm_float64`` (the same in float64: the truth every error
is measured against).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from refllm.errors import InvalidInputError
from refllm.kv.base import CacheConfig
from refllm.testing.backends import LLMBackend, ModelBackend

BLOCK_SIZE = 4  # small blocks, so that tiny inputs cross block boundaries


class BackendSpecError(InvalidInputError):
    """A ``module:factory`` string that names nothing importable and callable."""


def load_factory(spec: str) -> Callable:
    """``"package.module:factory"`` (the factory may be a dotted attribute path) -> the callable."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise BackendSpecError(f"backend {spec!r} must look like 'module:factory'")
    try:
        target = importlib.import_module(module_name)
    except ImportError as error:
        raise BackendSpecError(f"backend {spec!r}: cannot import {module_name!r} ({error})") from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise BackendSpecError(f"backend {spec!r}: {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise BackendSpecError(f"backend {spec!r} names a {type(target).__name__}, not a factory")
    return target


def factory_spec(factory: Callable) -> str | None:
    """The ``module:factory`` string that finds ``factory`` again, if there is one."""
    module, name = getattr(factory, "__module__", None), getattr(factory, "__qualname__", "")
    if not module or module == "__main__" or "<" in name:  # a script's or notebook's factory cannot be named
        return None
    try:
        return f"{module}:{name}" if load_factory(f"{module}:{name}") is factory else None
    except BackendSpecError:
        return None


# --- refllm's own paths -------------------------------------------------------------------


def refllm_paged(checkpoint) -> ModelBackend:
    """refllm's fast path: the Numba kernels over a paged arena."""
    from refllm.models.decoder import DecoderModel

    return ModelBackend(
        DecoderModel.load(checkpoint), CacheConfig(kind="paged", block_size=BLOCK_SIZE), "refllm paged"
    )


def refllm_llm(checkpoint) -> LLMBackend:
    """refllm's runtime: ``refllm.runtime.llm.LLM`` (cache ids over one paged arena, prefix caching on)."""
    from refllm.models.decoder import DecoderModel
    from refllm.runtime.llm import LLM

    model = DecoderModel.load(checkpoint)

    def with_capacity(tokens: int) -> LLM:
        return LLM(model, CacheConfig(kind="paged", block_size=BLOCK_SIZE, num_blocks=tokens // BLOCK_SIZE))

    llm = LLM(model, CacheConfig(kind="paged", block_size=BLOCK_SIZE))
    return LLMBackend(llm, "refllm LLM", with_capacity, sampler_greedy(llm))


def sampler_greedy(llm) -> Callable[[list[int], int], list[int]]:
    """The runtime choosing greedy tokens itself: its Sampler at temperature 0 over ``llm``'s logits."""
    from refllm.runtime.sampling import Sampler, SamplingParams

    def greedy(tokens: list[int], new_tokens: int) -> list[int]:
        sampler, chosen, cache_id = Sampler(SamplingParams(temperature=0.0)), [], "greedy"
        logits = llm.prefill(cache_id, tokens)
        try:
            for step in range(new_tokens):
                chosen.append(sampler(logits, tokens, chosen).token)
                if step + 1 < new_tokens:
                    logits = llm.decode(cache_id, chosen[-1], len(tokens) + step)
        finally:
            llm.release(cache_id)
        return chosen

    return greedy


def refllm_contiguous(checkpoint) -> ModelBackend:
    """refllm's float32 spec path: the functions of refllm/nn over contiguous arrays (the reference itself).

    Its ``truth()`` is the float64 spec on the same weights, built on first use.
    """
    backend = ModelBackend(checkpoint.reference(), CacheConfig(kind="contiguous"), "refllm spec")
    backend.truth = lambda: refllm_float64(checkpoint)
    return backend


def refllm_float64(checkpoint) -> ModelBackend:
    """refllm's spec path in float64: ground truth."""
    return ModelBackend(checkpoint.reference("float64"), CacheConfig(kind="contiguous"), "refllm float64")
