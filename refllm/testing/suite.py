"""The conformance runner: every property over hypothesis-drawn models and inputs.

``run_conformance(factory)`` runs each property of ``PROPERTIES`` on
``max_examples`` drawn cases (a random tiny model from ``hf_configs``, seeded
weights, inputs for the property), builds the backend with
``factory(checkpoint)`` for each, and returns one ``PropertyResult`` per
property: passed, failed (with the explanation of the smallest failing case
hypothesis found) or skipped (the backend lacks what the property needs).
``first_failure`` takes turns among the properties, a few cases each, and
stops at the first failure: the quickest way to learn whether a backend is
broken at all. The pytest plugin runs one property per test.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, reject, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from refllm.testing.backends import Backend, Unsupported, as_backend
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.checks import check
from refllm.testing.compare import ConformanceFailure
from refllm.testing.configs import ARCHITECTURES, check_architectures, tiny_config_json
from refllm.testing.explain import Case
from refllm.testing.factories import factory_spec
from refllm.testing.properties import MEMORY_CAPACITY, PROPERTIES
from refllm.testing.strategies import (
    MAX_TOTAL_TOKENS,
    OPS,
    chunk_splits,
    hf_configs,
    long_horizon_cuts,
    schedules,
    token_id,
    token_ids,
    weight_options,
)


class PropertySkipped(Exception):
    """The backend lacks a capability the property needs."""


def _exactly(vocab: int, n: int) -> st.SearchStrategy[list[int]]:
    return token_ids(vocab, n, n)


@st.composite
def property_args(draw, name: str, vocab: int, ops: tuple[str, ...] = OPS, window: int | None = None) -> dict:
    """The inputs of property ``name`` for a model of ``vocab`` tokens (JSON-ready); ``ops`` for schedules,
    ``window`` (the sliding window, if any) for long_horizon's edges."""
    if name == "logits":
        return dict(tokens=draw(token_ids(vocab, 1, 24)))
    if name == "chunked_prefill":
        tokens = draw(token_ids(vocab, 2, 24))
        return dict(tokens=tokens, chunks=draw(chunk_splits(len(tokens))))
    if name == "decode":
        tokens = draw(token_ids(vocab, 2, 24))
        return dict(tokens=tokens, prompt_len=draw(st.integers(1, len(tokens) - 1)))
    if name == "batch":
        prompts = draw(st.lists(token_ids(vocab, 1, 12), min_size=2, max_size=3))
        steps = draw(st.lists(_exactly(vocab, len(prompts)), min_size=1, max_size=4))  # a token per prompt per step
        return dict(prompts=prompts, steps=steps, order=draw(st.permutations(range(len(prompts)))))
    if name == "branches":
        length = draw(st.integers(1, 4))
        continuations = draw(st.lists(_exactly(vocab, length), min_size=2, max_size=3))
        return dict(prompt=draw(token_ids(vocab, 1, 12)), continuations=continuations)
    if name == "schedule":
        return dict(steps=draw(schedules(vocab, ops=ops)))
    if name == "truncate":
        tokens = draw(token_ids(vocab, 2, 20))
        keep = draw(st.integers(1, len(tokens) - 1))
        return dict(tokens=tokens, keep=keep, continuation=draw(token_ids(vocab, 1, 4)))
    if name == "memory":
        return dict(tokens=draw(_exactly(vocab, MEMORY_CAPACITY)), keep=draw(st.integers(0, MEMORY_CAPACITY - 1)))
    if name == "errors":
        return dict(
            tokens=draw(token_ids(vocab, 1, 8)), vocab_size=vocab, token=draw(token_id(vocab))
        )
    if name == "long_horizon":
        length, cuts = draw(long_horizon_cuts(window))
        return dict(tokens=draw(_exactly(vocab, length)), cuts=cuts)
    if name in ("greedy", "own_greedy"):
        tokens = draw(token_ids(vocab, 1, 12))
        return dict(tokens=tokens, new_tokens=draw(st.integers(8, MAX_TOTAL_TOKENS - len(tokens))))
    raise KeyError(name)


@st.composite
def cases(
    draw,
    names: tuple[str, ...],
    profile: str,
    architectures: tuple[str, ...] = ARCHITECTURES,
    ops: tuple[str, ...] = OPS,
) -> Case:
    """A case for one of the properties ``names``: a tiny model, a weight seed and the property's inputs."""
    name = draw(st.sampled_from(names))
    config_json = draw(hf_configs(architectures, long_horizon=name == "long_horizon"))
    seed = draw(st.integers(0, 2**16))
    window = config_json.get("sliding_window")
    args = draw(property_args(name, config_json["vocab_size"], ops, window))
    return Case(name, config_json, seed, profile, args, draw(weight_options()))


def run_case(case: Case, factory: Callable, spec: str | None = None) -> None:
    """Build the backend for ``case``'s checkpoint and check the property; ConformanceFailure if it fails."""
    checkpoint = case.checkpoint()
    try:
        backend = as_backend(factory(checkpoint))
    except Unsupported:
        reject()  # a model the backend cannot express: hypothesis draws another

    reason = PROPERTIES[case.property].skip_reason(backend)
    if reason:
        raise PropertySkipped(reason)
    check(case.property, backend, checkpoint, case.profile, spec, **case.args)


def probe(factory: Callable, architectures: tuple[str, ...] = ARCHITECTURES) -> Backend:
    """The backend ``factory`` builds for a tiny model (the first architecture it accepts): what it can do."""
    for architecture in architectures[:-1]:
        try:
            return as_backend(factory(Checkpoint.random(tiny_config_json(architecture))))
        except Unsupported:
            continue
    return as_backend(factory(Checkpoint.random(tiny_config_json(architectures[-1]))))


def skip_reasons(backend: Backend, names) -> dict[str, str]:
    """For each of the properties ``names`` that does not apply to ``backend``, the reason."""
    return {name: reason for name in names if (reason := PROPERTIES[name].skip_reason(backend))}


@contextmanager
def thread_limit(threads: int | None) -> Iterator[None]:
    """Run numba's (and torch's, if imported) parallel regions on ``threads`` threads, then restore them.

    A tiny model's work is smaller than the cost of waking a thread pool, so
    conformance runs on tiny models go much faster on one thread; ``None``
    leaves the settings alone (parallel kernels are then exercised as deployed).
    """
    if threads is None:
        yield
        return
    import numba

    torch = sys.modules.get("torch")
    saved = numba.get_num_threads(), torch.get_num_threads() if torch else None
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    if torch:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        numba.set_num_threads(saved[0])
        if torch:
            torch.set_num_threads(saved[1])


def run_properties(
    names: list[str] | tuple[str, ...],
    factory: Callable,
    profile: str = "float32",
    max_examples: int = 25,
    architectures: tuple[str, ...] = ARCHITECTURES,
    shrink: bool = True,
    seed: int | None = None,
    threads: int | None = None,
    spec: str | None = None,
) -> int:
    """Check the properties ``names`` on ``max_examples`` drawn cases (each draws one of them) -> cases run.

    Raises ConformanceFailure for the smallest failing case found (the first
    one, when ``shrink`` is False), with ``.examples`` set to the cases run;
    PropertySkipped if none of them applies. ``seed`` makes the draws
    reproducible; ``threads`` is passed to ``thread_limit``.
    """
    spec = spec or factory_spec(factory)
    architectures = check_architectures(architectures)
    capabilities = probe(factory, architectures)
    skipped = skip_reasons(capabilities, names)
    names = tuple(name for name in names if name not in skipped)
    if not names:
        raise PropertySkipped("; ".join(sorted(set(skipped.values()))))
    ops = tuple(op for op in OPS if op != "truncate" or capabilities.can_truncate)
    runs = 0
    phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])

    @settings(max_examples=max_examples, deadline=None, database=None, phases=phases,
              suppress_health_check=list(HealthCheck), print_blob=False)  # fmt: skip
    @given(case=cases(names, profile, architectures, ops))
    def test(case: Case) -> None:
        nonlocal runs
        try:
            run_case(case, factory, spec)
        except ConformanceFailure:
            runs += 1
            raise
        runs += 1  # a case the backend refused (Unsupported) is redrawn, not counted

    if seed is not None:
        test = hypothesis_seed(seed)(test)
    try:
        with thread_limit(threads):
            test()
    except ConformanceFailure as failure:
        failure.examples = runs
        raise
    return runs


@dataclass(frozen=True)
class PropertyResult:
    name: str
    status: str  # "passed", "failed", "skipped"
    detail: str  # the failure's explanation, or the skip reason
    examples: int

    def line(self) -> str:
        first = self.detail.splitlines()[0] if self.detail else ""
        return f"{self.name:16} {self.status:8} {self.examples:4} examples  {first}".rstrip()


def run_conformance(
    factory: Callable, properties: list[str] | None = None, stop_at_first_failure: bool = False, **options
) -> list[PropertyResult]:
    """Run every property (or those named) against ``factory``'s backends -> one result per property.

    ``options`` are those of ``run_properties`` (profile, max_examples, architectures, shrink, seed, threads).
    """
    results = []
    for name in properties or list(PROPERTIES):
        try:
            results.append(PropertyResult(name, "passed", "", run_properties([name], factory, **options)))
        except PropertySkipped as skipped:
            results.append(PropertyResult(name, "skipped", str(skipped), 0))
        except ConformanceFailure as failure:
            results.append(PropertyResult(name, "failed", str(failure), failure.examples))
            if stop_at_first_failure:
                break
    return results


def first_failure(
    factory: Callable,
    max_examples: int = 50,
    per_turn: int = 5,
    properties: list[str] | None = None,
    seed: int = 0,
    **options,
) -> tuple[ConformanceFailure | None, int]:
    """Take turns among the properties, ``per_turn`` cases each (no shrinking), until one fails.

    -> (the first failure or None, cases run in all). Each property runs at
    most ``max_examples`` cases; seeds are fixed, so the result is reproducible.
    ``options`` as for ``run_properties`` (profile, architectures, threads).
    """
    skipped = skip_reasons(probe(factory, options.get("architectures", ARCHITECTURES)), properties or PROPERTIES)
    names = [name for name in properties or PROPERTIES if name not in skipped]
    total = 0
    for turn, start in enumerate(range(0, max_examples, per_turn)):
        for index, name in enumerate(names):
            try:
                total += run_properties(
                    [name],
                    factory,
                    max_examples=min(per_turn, max_examples - start),
                    shrink=False,
                    seed=seed + 1000 * turn + index,
                    **options,
                )
            except ConformanceFailure as failure:
                return failure, total + failure.examples
    return None, total
