"""One call per property: ``check_x(backend, checkpoint, <the inputs of x>, profile)``.

Each raises ``ConformanceFailure`` with the explanation of the case (the
model, the input, the call that went wrong, the first layer that diverges)
when the property does not hold.
"""

from __future__ import annotations

from refllm.testing.backends import as_backend
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.compare import ConformanceFailure, Mismatch
from refllm.testing.explain import Case, explain
from refllm.testing.factories import refllm_contiguous
from refllm.testing.properties import PROPERTIES
from refllm.testing.tolerances import Tolerance, get_profile


def check(
    name: str, backend, checkpoint: Checkpoint, profile: str | Tolerance = "float32", spec: str | None = None, **args
) -> None:
    """Run property ``name`` on one case; raise ConformanceFailure with the explanation if it fails.

    ``spec`` (the backend's ``module:factory``) makes the explanation end with a one-line repro.
    """
    profile, backend = get_profile(profile).for_checkpoint(checkpoint), as_backend(backend)
    try:
        PROPERTIES[name].run(backend, refllm_contiguous(checkpoint), profile, **args)
    except Mismatch as mismatch:
        case = Case(name, checkpoint.config_json, checkpoint.seed, profile.name, args, checkpoint.weight_options)
        raise ConformanceFailure(explain(case, mismatch, backend, checkpoint, profile, spec), name) from None


def check_logits(backend, checkpoint, tokens, profile="float32"):
    check("logits", backend, checkpoint, profile, tokens=tokens)


def check_chunked_prefill(backend, checkpoint, tokens, chunks, profile="float32"):
    check("chunked_prefill", backend, checkpoint, profile, tokens=tokens, chunks=chunks)


def check_decode(backend, checkpoint, tokens, prompt_len, profile="float32"):
    check("decode", backend, checkpoint, profile, tokens=tokens, prompt_len=prompt_len)


def check_batch(backend, checkpoint, prompts, steps, profile="float32", order=None):
    order = list(range(len(prompts))) if order is None else order
    check("batch", backend, checkpoint, profile, prompts=prompts, steps=steps, order=order)


def check_branches(backend, checkpoint, prompt, continuations, profile="float32"):
    check("branches", backend, checkpoint, profile, prompt=prompt, continuations=continuations)


def check_schedule(backend, checkpoint, steps, profile="float32"):
    check("schedule", backend, checkpoint, profile, steps=steps)


def check_truncate(backend, checkpoint, tokens, keep, continuation, profile="float32"):
    check("truncate", backend, checkpoint, profile, tokens=tokens, keep=keep, continuation=continuation)


def check_memory(backend, checkpoint, tokens, keep, profile="float32"):
    check("memory", backend, checkpoint, profile, tokens=tokens, keep=keep)


def check_errors(backend, checkpoint, tokens, token, profile="float32"):
    check("errors", backend, checkpoint, profile, tokens=tokens, vocab_size=checkpoint.config.vocab_size, token=token)


def check_long_horizon(backend, checkpoint, tokens, cuts, profile="float32"):
    check("long_horizon", backend, checkpoint, profile, tokens=tokens, cuts=cuts)


def check_greedy(backend, checkpoint, tokens, new_tokens, profile="float32"):
    check("greedy", backend, checkpoint, profile, tokens=tokens, new_tokens=new_tokens)


def check_own_greedy(backend, checkpoint, tokens, new_tokens, profile="float32"):
    check("own_greedy", backend, checkpoint, profile, tokens=tokens, new_tokens=new_tokens)

