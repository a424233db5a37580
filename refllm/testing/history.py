"""What a sequence's logits should be after the calls that built it, dynamic NTK RoPE included.

With ``rope_type: dynamic`` the RoPE base grows with the length a forward
pass covers (transformers: ``max(position_ids) + 1``). A one-shot prefill of
T tokens rotates every key with base(T), but a KV cache keeps each key as it
was rotated when written: after a prefill of 10 tokens and a decode, the
first 10 keys carry base(10), not base(11). No caching backend can equal the
one-shot forward, transformers' own ``DynamicCache`` included; what each one
can do is rotate every chunk with the base of the position it reaches, so
the same calls give the same logits. So on such a model a cached path is
compared with the reference *fed the same calls* (``Backend.replay``); on
every other model, where RoPE does not depend on chunking, with the
backend's own one-shot prefill of the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Call = tuple  # ("prefill", [tokens]) or ("truncate", length)


def chunking_matters(reference) -> bool:
    """Whether the reference's model rotates keys differently depending on how a sequence was fed."""
    config = getattr(getattr(reference, "model", None), "config", None)
    return config is not None and any(p.rope_type == "dynamic" for p in config.rope.values())


def tokens_after(calls: Sequence[Call]) -> list[int]:
    tokens: list[int] = []
    for op, arg in calls:
        tokens = tokens + list(arg) if op == "prefill" else tokens[:arg]
    return tokens


def expected_after(backend, reference, calls: Sequence[Call]) -> np.ndarray:
    """The logits a sequence built by ``calls`` must give: [V]."""
    if chunking_matters(reference):
        return reference.replay(calls)
    return backend.last_logits(tokens_after(calls))


class Histories:
    """The calls that built each live cache id, for ``expected_after``."""

    def __init__(self):
        self.calls: dict[int, list[Call]] = {}

    def fed(self, cache_id: int, tokens: Sequence[int]) -> list[int]:
        """Record a prefill (or a decode: one token) -> the sequence's tokens now."""
        self.calls.setdefault(cache_id, []).append(("prefill", list(tokens)))
        return self.tokens(cache_id)

    def truncated(self, cache_id: int, length: int) -> None:
        self.calls[cache_id].append(("truncate", length))

    def forget(self, cache_id: int | None = None) -> None:
        if cache_id is None:
            self.calls.clear()
        else:
            del self.calls[cache_id]

    def tokens(self, cache_id: int) -> list[int]:
        return tokens_after(self.calls[cache_id])

    def expected(self, backend, reference, cache_id: int) -> np.ndarray:
        return expected_after(backend, reference, self.calls[cache_id])
