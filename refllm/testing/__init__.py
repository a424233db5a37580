"""refllm.testing: the oracle kit for other backends.

Check a backend against refllm's float32 spec (and measure its error against
the float64 spec, the truth: ``error_against_truth``): conformance properties over
hypothesis-drawn tiny models (every architecture and flag), named tolerance
profiles, greedy comparison with the near-tie rule, failures that explain
themselves, golden files and a pytest plugin. docs/oracle.md walks through it.

    from refllm.testing import run_conformance
    for result in run_conformance(my_factory):   # my_factory(checkpoint) -> backend
        print(result.line())

The modules, bottom up: ``tolerances`` (profiles), ``configs`` (tiny
``config.json`` dicts), ``checkpoint`` (a model's config and weights),
``layer_trace`` (refllm's models layer by layer), ``backends`` (adapters),
``factories``, ``greedy``, ``strategies``, ``properties``, ``truth`` and
``explain``, ``suite`` (the runner), ``mechanisms`` (how often the draws reach each
mechanism), ``plugin`` and ``conformance`` (pytest), ``golden``, ``hf`` (the
transformers backend) and ``repro``. Samplers are checked apart from models:
``sampling_semantics`` (what each engine means by temperature, top-k, top-p, min-p
and the penalties), ``sampling`` (the distribution a sampler draws from) and
``sampling_draws`` (the tokens it draws, and seeds independent of the batch).
Importing this package needs numpy only; the strategies, the runner and
``check_probabilities`` need hypothesis, ``hf`` needs torch and transformers.
"""

from refllm.testing.backends import Backend, CallableBackend, LLMBackend, ModelBackend, as_backend
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.checks import (
    check,
    check_batch,
    check_branches,
    check_chunked_prefill,
    check_decode,
    check_errors,
    check_greedy,
    check_logits,
    check_long_horizon,
    check_memory,
    check_own_greedy,
    check_schedule,
    check_truncate,
)
from refllm.testing.compare import ConformanceFailure
from refllm.testing.factories import load_factory, refllm_contiguous, refllm_float64, refllm_llm, refllm_paged
from refllm.testing.greedy import GreedyComparison, compare_greedy, compare_greedy_outputs, greedy_tokens
from refllm.testing.layer_trace import SUBLAYER_POINTS, refllm_layer_states, refllm_sublayer_states
from refllm.testing.properties import PROPERTIES
from refllm.testing.sampling_draws import (
    check_draws,
    check_seeds,
    probabilities_from_logits,
    refllm_probabilities,
    refllm_sampler,
    sampler_from_probabilities,
)
from refllm.testing.sampling_semantics import (
    SEMANTICS,
    SamplerParams,
    SamplingMismatch,
    SamplingRow,
    Semantics,
    reference_distribution,
)
from refllm.testing.tolerances import PROFILES, Tolerance, get_profile
from refllm.testing.truth import ErrorAgainstTruth, error_against_truth


def __getattr__(name: str):
    """The runner and ``check_probabilities`` need hypothesis, so they are imported on first use."""
    if name in ("run_conformance", "first_failure", "run_properties", "PropertyResult"):
        from refllm.testing import suite

        return getattr(suite, name)
    if name == "check_probabilities":
        from refllm.testing import sampling

        return sampling.check_probabilities
    raise AttributeError(f"module 'refllm.testing' has no attribute {name!r}")


__all__ = [
    "PROFILES",
    "PROPERTIES",
    "SEMANTICS",
    "SUBLAYER_POINTS",
    "Backend",
    "CallableBackend",
    "Checkpoint",
    "ConformanceFailure",
    "ErrorAgainstTruth",
    "GreedyComparison",
    "LLMBackend",
    "ModelBackend",
    "PropertyResult",
    "SamplerParams",
    "SamplingMismatch",
    "SamplingRow",
    "Semantics",
    "Tolerance",
    "as_backend",
    "check",
    "check_batch",
    "check_branches",
    "check_chunked_prefill",
    "check_decode",
    "check_draws",
    "check_errors",
    "check_greedy",
    "check_logits",
    "check_long_horizon",
    "check_memory",
    "check_own_greedy",
    "check_probabilities",
    "check_schedule",
    "check_seeds",
    "check_truncate",
    "compare_greedy",
    "compare_greedy_outputs",
    "error_against_truth",
    "first_failure",
    "get_profile",
    "greedy_tokens",
    "load_factory",
    "probabilities_from_logits",
    "reference_distribution",
    "refllm_contiguous",
    "refllm_float64",
    "refllm_layer_states",
    "refllm_llm",
    "refllm_paged",
    "refllm_probabilities",
    "refllm_sampler",
    "refllm_sublayer_states",
    "run_conformance",
    "run_properties",
    "sampler_from_probabilities",
]
