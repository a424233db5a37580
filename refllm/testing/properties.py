"""Conformance properties: what every backend must do, as plain functions.

Each ``check_*`` function takes a backend (anything ``as_backend`` accepts), the
``Checkpoint`` it runs and a tolerance profile, and raises ``ConformanceFailure``
with an explanation (the model, the input, the first layer that diverges) when
the property does not hold. ``PROPERTIES`` lists them by name for the runners
(``refllm.testing.suite`` and the pytest plugin).

``logits``, ``schedule`` and ``greedy`` compare with the reference (refllm's
spec path on the same checkpoint); the others compare the backend with itself
(chunked against one-shot, decode against prefill, batched against single),
so a failure names the path that is inconsistent.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from refllm.testing.backends import Backend, as_backend
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.factories import refllm_contiguous
from refllm.testing.greedy import compare_greedy
from refllm.testing.tolerances import Tolerance, get_profile

MEMORY_CAPACITY = 16  # tokens: a multiple of any usual block size, larger than a tiny prompt


class ConformanceFailure(AssertionError):
    """A property that does not hold; the message explains the case."""

    def __init__(self, message: str, property: str):
        super().__init__(message)
        self.property = property
        self.examples = 1  # cases run until this one (set by the runners)


class Mismatch(Exception):
    """Raised inside a property: what went wrong, and the token sequence that shows it (for layer diagnosis)."""

    def __init__(self, what: str, tokens: Sequence[int] | None = None):
        super().__init__(what)
        self.what = what
        self.tokens = list(tokens) if tokens is not None else None


@dataclass(frozen=True)
class Property:
    name: str
    run: Callable[..., None]  # (backend, reference, profile, **args)
    needs: tuple[str, ...] = ()  # Backend capabilities: has_cache_ids, can_truncate, can_fork, bounded

    @property
    def claim(self) -> str:
        """What the property asserts, in one sentence."""
        return self.run.__doc__.strip().splitlines()[0]

    def skip_reason(self, backend: Backend) -> str | None:
        for need in self.needs:
            if need == "bounded" and backend.bounded(MEMORY_CAPACITY) is None:
                return f"{backend.name} cannot bound its KV storage"
            if need != "bounded" and not getattr(backend, need):
                return f"{backend.name} lacks {need}"
        return None


def _compare(actual, expected, profile: Tolerance, what: str, tokens: Sequence[int]) -> None:
    """actual, expected: [..., V] logits of the last of ``tokens`` (or of each row, for stacked results)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        raise Mismatch(f"{what}: shape {actual.shape}, expected {expected.shape}", tokens)
    if not np.all(np.isfinite(actual)):
        raise Mismatch(f"{what}: {np.count_nonzero(~np.isfinite(actual))} logits are not finite", tokens)
    excess = profile.excess(actual, expected)
    if np.any(excess > 0):
        index = np.unravel_index(int(np.argmax(excess)), excess.shape)
        delta = float(np.abs(actual - expected)[index])
        raise Mismatch(
            f"{what}: max |Δ| {delta:.3g} at token id {index[-1]}"
            f" ({float(actual[index]):.6g} vs {float(expected[index]):.6g}; allowed"
            f" {profile.atol:g} + {profile.rtol:g}·|x|)",
            tokens,
        )


def _refused(call: Callable[[], object], what: str) -> None:
    """``call`` must raise a ValueError or KeyError (refllm's refusals); anything else is a Mismatch."""
    try:
        call()
    except (ValueError, KeyError):
        return
    except Exception as error:  # noqa: BLE001 - the wrong kind of exception is the finding
        raise Mismatch(f"{what} raised {type(error).__name__} ({error}), not a ValueError or KeyError") from None
    raise Mismatch(f"{what} was accepted; it must raise a ValueError or KeyError")


# --- the properties --------------------------------------------------------------------------


def logits(backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int]) -> None:
    """Logits at every position of a prompt match the reference."""
    actual, expected = backend.all_logits(tokens), reference.all_logits(tokens)
    if np.shape(actual) != np.shape(expected):
        raise Mismatch(f"all-position logits have shape {np.shape(actual)}, expected {np.shape(expected)}", tokens)
    for t in range(len(tokens)):
        _compare(actual[t], expected[t], profile, f"logits at position {t}", tokens[: t + 1])


def chunked_prefill(
    backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], chunks: list[int]
) -> None:
    """A prompt fed in chunks gives, after each chunk, the logits of a one-shot prefill of the same prefix."""
    end = 0
    for index, size in enumerate(chunks):
        start, end = end, end + size
        got = backend.prefill(0, tokens[start:end])
        _compare(
            got,
            backend.last_logits(tokens[:end]),
            profile,
            f"chunk {index} (positions {start}..{end - 1}) vs a one-shot prefill of {end} tokens",
            tokens[:end],
        )
    backend.release(0)


def decode(backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], prompt_len: int) -> None:
    """Prefill then decode token by token gives the logits of a prefill over all positions."""
    everything = backend.all_logits(tokens)
    _compare(
        backend.prefill(0, tokens[:prompt_len]),
        everything[prompt_len - 1],
        profile,
        f"prefill of {prompt_len} tokens vs all-position logits",
        tokens[:prompt_len],
    )
    for t in range(prompt_len, len(tokens)):
        _compare(
            backend.decode(0, tokens[t]),
            everything[t],
            profile,
            f"decode at position {t} vs all-position logits",
            tokens[: t + 1],
        )
    backend.release(0)


def batch(
    backend: Backend, reference: Backend, profile: Tolerance, prompts: list[list[int]], steps: list[list[int]]
) -> None:
    """Batched rows equal the same rows run alone: one batched prefill, then decode_batch over ragged lengths."""
    width = min(len(p) for p in prompts)
    rows = [p[:width] for p in prompts]
    batched = backend.batch_all_logits(rows)
    for row, tokens in enumerate(rows):
        _compare(
            batched[row],
            backend.all_logits(tokens),
            profile,
            f"row {row} of a batched prefill of {len(rows)} rows vs alone",
            tokens,
        )
    histories = {i: list(p) for i, p in enumerate(prompts)}
    for i, prompt in enumerate(prompts):
        backend.prefill(i, prompt)
    for step, step_tokens in enumerate(steps):
        got = backend.decode_batch(list(enumerate(step_tokens)))
        for i, token in enumerate(step_tokens):
            histories[i].append(token)
            _compare(
                got[i],
                backend.last_logits(histories[i]),
                profile,
                f"decode_batch step {step}, cache id {i} (length {len(histories[i])}) vs alone",
                histories[i],
            )
    backend.reset()


def branches(
    backend: Backend, reference: Backend, profile: Tolerance, prompt: list[int], continuations: list[list[int]]
) -> None:
    """A prompt forked into branches: each branch equals its own sequence run from scratch."""
    got = backend.branches(prompt, continuations)
    for b, continuation in enumerate(continuations):
        alone = backend.all_logits(prompt + continuation)[len(prompt) :]
        for t in range(len(continuation)):
            _compare(
                got[b][t],
                alone[t],
                profile,
                f"branch {b} of {len(continuations)}, token {t} after the fork vs run alone",
                prompt + continuation[: t + 1],
            )


def schedule(backend: Backend, reference: Backend, profile: Tolerance, steps: list[list]) -> None:
    """Interleaved prefill/decode/decode_batch/release/truncate/reset across cache ids match the reference.

    Schedules drawn for a backend without ``truncate`` hold no truncate steps.
    """
    histories: dict[int, list[int]] = {}
    for index, step in enumerate(steps):
        op, label = step[0], f"step {index} {step}"
        if op == "prefill":
            histories.setdefault(step[1], []).extend(step[2])
            _compare(
                backend.prefill(step[1], step[2]),
                reference.last_logits(histories[step[1]]),
                profile,
                label,
                histories[step[1]],
            )
        elif op == "decode":
            histories[step[1]].append(step[2])
            _compare(
                backend.decode(step[1], step[2]),
                reference.last_logits(histories[step[1]]),
                profile,
                label,
                histories[step[1]],
            )
        elif op == "decode_batch":
            got = backend.decode_batch([tuple(pair) for pair in step[1]])
            for row, (cache_id, token) in enumerate(step[1]):
                histories[cache_id].append(token)
                _compare(
                    got[row],
                    reference.last_logits(histories[cache_id]),
                    profile,
                    f"{label}, row {row}",
                    histories[cache_id],
                )
        elif op == "release":
            backend.release(step[1])
            del histories[step[1]]
        elif op == "truncate":
            backend.truncate(step[1], step[2])
            del histories[step[1]][step[2] :]
        else:
            backend.reset()
            histories.clear()
    backend.reset()


def truncate(
    backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], keep: int, continuation: list[int]
) -> None:
    """After truncate(id, keep), decoding continues as if only the first ``keep`` tokens had been seen."""
    backend.prefill(0, tokens)
    backend.truncate(0, keep)
    history = tokens[:keep]
    for t, token in enumerate(continuation):
        history = history + [token]
        _compare(
            backend.decode(0, token),
            backend.last_logits(history),
            profile,
            f"decode {t} after truncating {len(tokens)} tokens to {keep}",
            history,
        )
    backend.release(0)


def memory(backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], keep: int) -> None:
    """KV storage that truncate, release and reset give up can be used again (no leaks)."""
    bounded = backend.bounded(MEMORY_CAPACITY)
    tokens = tokens[:MEMORY_CAPACITY]

    def must_fit(what: str, call: Callable[[], np.ndarray], history: list[int]) -> None:
        try:
            got = call()
        except (ValueError, KeyError) as error:
            raise Mismatch(f"storage for {MEMORY_CAPACITY} tokens: {what} was refused ({error})") from None
        _compare(got, backend.last_logits(history), profile, what, history)

    must_fit(f"prefill of {len(tokens)} tokens", lambda: bounded.prefill(0, tokens), tokens)
    if bounded.can_truncate:
        bounded.truncate(0, keep)
        must_fit(
            f"refilling the last {len(tokens) - keep} after truncate(0, {keep})",
            lambda: bounded.prefill(0, tokens[keep:]),
            tokens,
        )
    bounded.release(0)
    must_fit("a new sequence after release(0)", lambda: bounded.prefill(1, tokens), tokens)
    bounded.reset()
    must_fit("a new sequence after reset()", lambda: bounded.prefill(2, tokens), tokens)
    bounded.reset()


def errors(
    backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], vocab_size: int, token: int
) -> None:
    """Bad input raises a ValueError or KeyError and changes nothing; released and reset ids are gone."""
    backend.prefill(0, tokens)
    backend.prefill(5, tokens)
    backend.release(5)
    bad = [
        ("prefill of token id vocab_size", lambda: backend.prefill(0, [vocab_size])),
        ("prefill of token id -1", lambda: backend.prefill(0, [-1])),
        ("decode of token id vocab_size", lambda: backend.decode(0, vocab_size)),
        ("prefill of no tokens", lambda: backend.prefill(1, [])),
        ("decode on a cache id never prefilled", lambda: backend.decode(7, token)),
        ("release of a cache id never prefilled", lambda: backend.release(7)),
        ("decode on a released cache id", lambda: backend.decode(5, token)),
        ("release of a released cache id", lambda: backend.release(5)),
    ]
    if backend.can_truncate:
        bad.append((f"truncate(0, {len(tokens) + 1}) past the length", lambda: backend.truncate(0, len(tokens) + 1)))
    for what, call in bad:
        _refused(call, what)
    history = tokens + [token]
    _compare(
        backend.decode(0, token),
        backend.last_logits(history),
        profile,
        "decode after the refused calls vs a fresh sequence",
        history,
    )
    backend.reset()
    _refused(lambda: backend.decode(0, token), "decode on a cache id after reset()")


def greedy(backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], new_tokens: int) -> None:
    """Greedy continuations agree with the reference up to a near-tie."""
    comparison = compare_greedy(backend, reference, tokens, new_tokens, profile.top_n)
    if not comparison.ok:
        raise Mismatch(comparison.describe(), tokens + comparison.tokens_b[: comparison.step])


PROPERTIES: dict[str, Property] = {
    p.name: p
    for p in [
        Property("logits", logits),
        Property("chunked_prefill", chunked_prefill, ("has_cache_ids",)),
        Property("decode", decode, ("has_cache_ids",)),
        Property("batch", batch, ("has_cache_ids",)),
        Property("branches", branches, ("has_cache_ids", "can_fork")),
        Property("schedule", schedule, ("has_cache_ids",)),
        Property("truncate", truncate, ("has_cache_ids", "can_truncate")),
        Property("memory", memory, ("has_cache_ids", "bounded")),
        Property("errors", errors, ("has_cache_ids",)),
        Property("greedy", greedy),
    ]
}


def check(
    name: str, backend, checkpoint: Checkpoint, profile: str | Tolerance = "float32", spec: str | None = None, **args
) -> None:
    """Run property ``name`` on one case; raise ConformanceFailure with the explanation if it fails.

    ``spec`` (the backend's ``module:factory``) makes the explanation end with a one-line repro.
    """
    from refllm.testing.explain import Case, explain

    profile, backend = get_profile(profile), as_backend(backend)
    try:
        PROPERTIES[name].run(backend, refllm_contiguous(checkpoint), profile, **args)
    except Mismatch as mismatch:
        case = Case(name, checkpoint.config_json, checkpoint.seed, profile.name, args)
        raise ConformanceFailure(explain(case, mismatch, backend, checkpoint, profile, spec), name) from None


# --- one plain function per property: check_x(backend, checkpoint, <the inputs of x>, profile) ------------


def check_logits(backend, checkpoint, tokens, profile="float32"):
    check("logits", backend, checkpoint, profile, tokens=tokens)


def check_chunked_prefill(backend, checkpoint, tokens, chunks, profile="float32"):
    check("chunked_prefill", backend, checkpoint, profile, tokens=tokens, chunks=chunks)


def check_decode(backend, checkpoint, tokens, prompt_len, profile="float32"):
    check("decode", backend, checkpoint, profile, tokens=tokens, prompt_len=prompt_len)


def check_batch(backend, checkpoint, prompts, steps, profile="float32"):
    check("batch", backend, checkpoint, profile, prompts=prompts, steps=steps)


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


def check_greedy(backend, checkpoint, tokens, new_tokens, profile="float32"):
    check("greedy", backend, checkpoint, profile, tokens=tokens, new_tokens=new_tokens)
