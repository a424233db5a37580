"""Comparing one call's logits with their expected value, and the failures that comparisons raise.

A property raises ``Mismatch`` (what differed, and the tokens that show it)
from inside; the runner turns it into a ``ConformanceFailure`` whose message
explains the case (``explain.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from refllm.testing.tolerances import Tolerance


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


def compare_logits(actual, expected, profile: Tolerance, what: str, tokens: Sequence[int]) -> None:
    """actual, expected: [..., V] logits of the last of ``tokens`` (or of each row, for stacked results: rows
    of the positions that end at the last of ``tokens``)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    if actual.shape != expected.shape:
        raise Mismatch(f"{what}: shape {actual.shape}, expected {expected.shape}", tokens)
    if not np.all(np.isfinite(actual)):
        raise Mismatch(f"{what}: {np.count_nonzero(~np.isfinite(actual))} logits are not finite", tokens)
    rows = actual.shape[-2] if actual.ndim > 1 else 1
    positions = np.arange(len(tokens) - rows, len(tokens)).reshape(actual.shape[-2:-1])
    excess = profile.excess(actual, expected, positions)
    if np.any(excess > 0):
        index = np.unravel_index(int(np.argmax(excess)), excess.shape)
        delta = float(np.abs(actual - expected)[index])
        allowed = float(profile.allowance(expected, positions)[index[:-1]].squeeze())
        raise Mismatch(
            f"{what}: max |Δ| {delta:.3g} at token id {index[-1]}"
            f" ({float(actual[index]):.6g} vs {float(expected[index]):.6g}; allowed {allowed:.3g},"
            f" {profile.describe()})",
            tokens,
        )


def expect_refusal(call: Callable[[], object], what: str) -> None:
    """``call`` must raise a ValueError or KeyError (refllm's refusals); anything else is a Mismatch."""
    try:
        call()
    except (ValueError, KeyError):
        return
    except Exception as error:  # noqa: BLE001 - the wrong kind of exception is the finding
        raise Mismatch(f"{what} raised {type(error).__name__} ({error}), not a ValueError or KeyError") from None
    raise Mismatch(f"{what} was accepted; it must raise a ValueError or KeyError")
