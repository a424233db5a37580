"""Conformance properties: what every backend must do, as plain functions.

Each property is a function ``(backend, reference, profile, **inputs)`` that
raises ``Mismatch`` naming the call that went wrong; ``PROPERTIES`` lists
them by name for ``checks.check`` and the runners (``refllm.testing.suite``
and the pytest plugin).

``logits``, ``schedule``, ``long_horizon`` and ``greedy`` compare with the
reference (refllm's spec path on the same checkpoint); the others compare
the backend with itself (chunked against one-shot, decode against prefill,
batched against single), so a failure names the path that is inconsistent.
On a dynamic-NTK model, where a cached sequence depends on how it was fed,
the cached paths are compared with the reference fed the same calls
(``history.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from refllm.testing.backends import Backend
from refllm.testing.compare import Mismatch, compare_logits, expect_refusal
from refllm.testing.greedy import compare_greedy
from refllm.testing.history import Histories, chunking_matters, expected_after
from refllm.testing.tolerances import Tolerance

MEMORY_CAPACITY = 16  # tokens: a multiple of any usual block size, larger than a tiny prompt


@dataclass(frozen=True)
class Property:
    name: str
    run: Callable[..., None]  # (backend, reference, profile, **args)
    needs: tuple[str, ...] = ()  # Backend capabilities: has_cache_ids, can_truncate, can_fork, bounded, can_greedy

    @property
    def claim(self) -> str:
        """What the property asserts, in one sentence."""
        return self.run.__doc__.strip().splitlines()[0]

    def skip_reason(self, backend: Backend) -> str | None:
        for need in self.needs:
            if need == "bounded" and backend.bounded(MEMORY_CAPACITY) is None:
                return (
                    f"{backend.name} cannot bound its KV storage (a DecoderOnlyLLM needs"
                    " LLMBackend(llm, with_capacity=lambda tokens: a fresh LLM holding that many tokens))"
                )
            if need == "can_greedy" and not backend.can_greedy:
                return f"{backend.name} picks no greedy tokens itself (it has no greedy(tokens, new_tokens) method)"
            if need != "bounded" and not getattr(backend, need):
                return f"{backend.name} lacks {need}"
        return None


# --- the properties --------------------------------------------------------------------------


def logits(backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int]) -> None:
    """Logits at every position of a prompt match the reference."""
    actual, expected = backend.all_logits(tokens), reference.all_logits(tokens)
    if np.shape(actual) != np.shape(expected):
        raise Mismatch(f"all-position logits have shape {np.shape(actual)}, expected {np.shape(expected)}", tokens)
    for t in range(len(tokens)):
        compare_logits(actual[t], expected[t], profile, f"logits at position {t}", tokens[: t + 1])


def chunked_prefill(
    backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], chunks: list[int]
) -> None:
    """A prompt fed in chunks gives, after each chunk, the logits of a one-shot prefill of the same prefix."""
    histories, end = Histories(), 0
    for index, size in enumerate(chunks):
        start, end = end, end + size
        got = backend.prefill(0, tokens[start:end])
        histories.fed(0, tokens[start:end])
        compare_logits(
            got,
            histories.expected(backend, reference, 0),
            profile,
            f"prefill(0, chunk {index}: positions {start}..{end - 1}) vs a one-shot prefill of {end} tokens",
            tokens[:end],
        )
    backend.release(0)


def decode(backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], prompt_len: int) -> None:
    """Prefill then decode token by token gives the logits of a prefill over all positions."""
    everything = None if chunking_matters(reference) else backend.all_logits(tokens)
    histories = Histories()

    def expected(t: int) -> np.ndarray:
        return histories.expected(reference, reference, 0) if everything is None else everything[t]

    got = backend.prefill(0, tokens[:prompt_len])
    histories.fed(0, tokens[:prompt_len])
    compare_logits(
        got, expected(prompt_len - 1), profile, f"prefill(0, {prompt_len} tokens) vs all-position logits",
        tokens[:prompt_len],
    )  # fmt: skip
    for t in range(prompt_len, len(tokens)):
        got = backend.decode(0, tokens[t])
        histories.fed(0, [tokens[t]])
        compare_logits(
            got, expected(t), profile, f"decode(0, {tokens[t]}) at position {t} vs all-position logits",
            tokens[: t + 1],
        )  # fmt: skip
    backend.release(0)


def batch(
    backend: Backend,
    reference: Backend,
    profile: Tolerance,
    prompts: list[list[int]],
    steps: list[list[int]],
    order: list[int],
) -> None:
    """Batched rows equal the same rows run alone: one batched prefill, then decode_batch over ragged lengths.

    ``order`` is the order of the cache ids within each decode_batch call.
    """
    width = min(len(p) for p in prompts)
    rows = [p[:width] for p in prompts]
    batched = backend.batch_all_logits(rows)
    for row, tokens in enumerate(rows):
        compare_logits(
            batched[row], backend.all_logits(tokens), profile,
            f"row {row} of a batched prefill of {len(rows)} rows vs alone", tokens,
        )  # fmt: skip
    histories = Histories()
    for i, prompt in enumerate(prompts):
        backend.prefill(i, prompt)
        histories.fed(i, prompt)
    for step, step_tokens in enumerate(steps):
        pairs = [(i, step_tokens[i]) for i in order]
        got = backend.decode_batch(pairs)
        for row, (i, token) in enumerate(pairs):
            history = histories.fed(i, [token])
            compare_logits(
                got[row], histories.expected(backend, reference, i), profile,
                f"decode_batch({pairs}) step {step}, row {row} (cache id {i}, length {len(history)}) vs alone",
                history,
            )  # fmt: skip
    backend.reset()


def branches(
    backend: Backend, reference: Backend, profile: Tolerance, prompt: list[int], continuations: list[list[int]]
) -> None:
    """A prompt forked into branches: each branch equals its own sequence run from scratch."""
    got = backend.branches(prompt, continuations)
    for b, continuation in enumerate(continuations):
        calls = [("prefill", prompt)]
        for t, token in enumerate(continuation):
            calls.append(("prefill", [token]))
            compare_logits(
                got[b][t], expected_after(backend, reference, calls), profile,
                f"branch {b} of {len(continuations)}, token {t} after the fork vs run alone",
                prompt + continuation[: t + 1],
            )  # fmt: skip


def schedule(backend: Backend, reference: Backend, profile: Tolerance, steps: list[list]) -> None:
    """Interleaved prefill/decode/decode_batch/release/truncate/reset across cache ids match the reference.

    Schedules drawn for a backend without ``truncate`` hold no truncate steps.
    """
    histories = Histories()
    for index, step in enumerate(steps):
        op, label = step[0], f"step {index} {step}"
        if op in ("prefill", "decode"):
            got = backend.prefill(step[1], step[2]) if op == "prefill" else backend.decode(step[1], step[2])
            tokens = histories.fed(step[1], step[2] if op == "prefill" else [step[2]])
            compare_logits(got, histories.expected(reference, reference, step[1]), profile, label, tokens)
        elif op == "decode_batch":
            got = backend.decode_batch([tuple(pair) for pair in step[1]])
            for row, (cache_id, token) in enumerate(step[1]):
                tokens = histories.fed(cache_id, [token])
                expected = histories.expected(reference, reference, cache_id)
                compare_logits(got[row], expected, profile, f"{label}, row {row}", tokens)
        elif op == "release":
            backend.release(step[1])
            histories.forget(step[1])
        elif op == "truncate":
            backend.truncate(step[1], step[2])
            histories.truncated(step[1], step[2])
        else:
            backend.reset()
            histories.forget()
    backend.reset()


def truncate(
    backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], keep: int, continuation: list[int]
) -> None:
    """After truncate(id, keep), decoding continues as if only the first ``keep`` tokens had been seen."""
    backend.prefill(0, tokens)
    backend.truncate(0, keep)
    histories = Histories()
    histories.fed(0, tokens)
    histories.truncated(0, keep)
    for t, token in enumerate(continuation):
        got = backend.decode(0, token)
        history = histories.fed(0, [token])
        compare_logits(
            got, histories.expected(backend, reference, 0), profile,
            f"decode(0, {token}) {t} after truncate(0, {keep}) of {len(tokens)} tokens", history,
        )  # fmt: skip
    backend.release(0)


def memory(backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], keep: int) -> None:
    """KV storage that truncate, release and reset give up can be used again (no leaks)."""
    bounded = backend.bounded(MEMORY_CAPACITY)
    tokens = tokens[:MEMORY_CAPACITY]

    def must_fit(what: str, call: Callable[[], np.ndarray], calls: list) -> None:
        try:
            got = call()
        except (ValueError, KeyError) as error:
            raise Mismatch(f"storage for {MEMORY_CAPACITY} tokens: {what} was refused ({error})") from None
        compare_logits(got, expected_after(backend, reference, calls), profile, what, tokens)

    whole = [("prefill", tokens)]
    must_fit(f"prefill(0, {len(tokens)} tokens)", lambda: bounded.prefill(0, tokens), whole)
    if bounded.can_truncate:
        bounded.truncate(0, keep)
        must_fit(
            f"prefill(0, the last {len(tokens) - keep}) after truncate(0, {keep})",
            lambda: bounded.prefill(0, tokens[keep:]),
            [*whole, ("truncate", keep), ("prefill", tokens[keep:])],
        )
    bounded.release(0)
    must_fit("prefill(1, ...) of a new sequence after release(0)", lambda: bounded.prefill(1, tokens), whole)
    bounded.reset()
    must_fit("prefill(2, ...) of a new sequence after reset()", lambda: bounded.prefill(2, tokens), whole)
    bounded.reset()


def errors(
    backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], vocab_size: int, token: int
) -> None:
    """Bad input raises a ValueError or KeyError and changes nothing; released and reset ids are gone.

    Every refused call uses a cache id of its own, so one wrongly accepted call cannot make a later one look wrong.
    """
    backend.prefill(0, tokens)
    backend.prefill(5, tokens)
    backend.release(5)
    backend.prefill(6, tokens)
    backend.release(6)
    bad = [
        ("prefill(0, [vocab_size])", lambda: backend.prefill(0, [vocab_size])),
        ("prefill(0, [-1])", lambda: backend.prefill(0, [-1])),
        ("decode(0, vocab_size)", lambda: backend.decode(0, vocab_size)),
        ("prefill(1, []) of no tokens", lambda: backend.prefill(1, [])),
        ("decode(7, ...) on a cache id never prefilled", lambda: backend.decode(7, token)),
        ("release(8) of a cache id never prefilled", lambda: backend.release(8)),
        ("decode(5, ...) on a released cache id", lambda: backend.decode(5, token)),
        ("release(6) of a released cache id", lambda: backend.release(6)),
    ]
    if backend.can_truncate:
        bad.append((f"truncate(0, {len(tokens) + 1}) past the length", lambda: backend.truncate(0, len(tokens) + 1)))
    for what, call in bad:
        expect_refusal(call, what)
    got = backend.decode(0, token)
    compare_logits(
        got, expected_after(backend, reference, [("prefill", tokens), ("prefill", [token])]), profile,
        f"decode(0, {token}) after the refused calls vs a fresh sequence", tokens + [token],
    )  # fmt: skip
    backend.reset()
    expect_refusal(lambda: backend.decode(0, token), "decode(0, ...) on a cache id after reset()")


def long_horizon(
    backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], cuts: list[int]
) -> None:
    """A long sequence, prefilled in chunks that end at ``cuts`` and then decoded, matches the reference.

    The cuts are drawn near block, window and chunk edges, the length to hundreds of positions. Over
    hundreds of positions float32 itself drifts from the truth, so each position is compared with the
    float64 truth, allowed the profile plus refllm's own float32 error there. A backend without cache
    ids (a plain callable) is taken to the same horizon in one call: its logits at every position.
    """
    if chunking_matters(reference):
        raise Mismatch("long_horizon is not drawn for dynamic-NTK models")  # the runner never draws it
    float32 = np.asarray(reference.all_logits(tokens), np.float64)
    truth = reference.truth().all_logits(tokens)
    own_error = np.abs(float32 - truth).max(-1, keepdims=True)  # [T, 1]

    def compare(got, t: int, what: str) -> None:
        widened = truth[t] + np.sign(np.asarray(got, np.float64) - truth[t]) * np.minimum(
            np.abs(np.asarray(got, np.float64) - truth[t]), own_error[t]
        )  # the part of the difference refllm's float32 spec shares is forgiven
        compare_logits(got, widened, profile, what, tokens[: t + 1])

    if not backend.has_cache_ids:
        got = backend.all_logits(tokens)
        if np.shape(got) != np.shape(truth):
            raise Mismatch(f"all-position logits have shape {np.shape(got)}, expected {np.shape(truth)}", tokens)
        for t in range(len(tokens)):
            compare(got[t], t, f"logits at position {t} of a {len(tokens)}-token prompt")
        return
    start = 0
    for end in cuts:
        compare(backend.prefill(0, tokens[start:end]), end - 1, f"prefill(0, positions {start}..{end - 1})")
        start = end
    for t in range(start, len(tokens)):
        compare(backend.decode(0, tokens[t]), t, f"decode(0, ...) at position {t}")
    backend.release(0)


def greedy(backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], new_tokens: int) -> None:
    """Greedy continuations agree with the reference up to a near-tie."""
    comparison = compare_greedy(backend, reference, tokens, new_tokens, profile.top_n)
    if not comparison.ok:
        raise Mismatch(comparison.describe(), tokens + comparison.tokens_b[: comparison.step])


def own_greedy(backend: Backend, reference: Backend, profile: Tolerance, tokens: list[int], new_tokens: int) -> None:
    """The tokens the backend's own greedy decoding picks agree with the reference up to a near-tie.

    The kit has the reference's logits at the step where the choices part, so a near-tie is measured:
    the backend's token must be within twice the profile's allowance of the reference's best.
    """
    chosen = [int(t) for t in backend.greedy(tokens, new_tokens)]
    if len(chosen) != new_tokens:
        raise Mismatch(f"greedy({new_tokens} tokens) returned {len(chosen)} tokens", tokens)
    for step, token in enumerate(chosen):
        calls = [("prefill", tokens)] + [("prefill", [t]) for t in chosen[:step]]  # as a cached backend fed them
        logits = np.asarray(expected_after(reference, reference, calls), np.float64)
        best = int(np.argmax(logits))
        gap = logits[best] - logits[token] if 0 <= token < len(logits) else np.inf
        if token != best:
            allowed = 2 * float(profile.allowance(logits)[0])
            if gap > allowed:
                raise Mismatch(
                    f"greedy({new_tokens} tokens) step {step}: the backend chose {token}, the reference {best},"
                    f" {gap:.3g} higher (a near-tie is within {allowed:.3g})",
                    tokens + chosen[:step],
                )
            return  # a near-tie: the continuations may part here for good reason


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
        Property("long_horizon", long_horizon),
        Property("greedy", greedy),
        Property("own_greedy", own_greedy, ("can_greedy",)),
    ]
}
