"""A backend's error measured against float64 truth, as a multiple of a careful float32 implementation's.

A difference between a backend and refllm's float32 reference mixes two
errors: the backend's and refllm's own float32 rounding. Against the float64
spec (``refllm_float64``) they come apart:

    backend error = max |backend logits - truth| / max |truth|
    float32 error = the same for refllm's float32 spec path on the same tokens
    ratio         = backend error / float32 error

A ratio near 1 means the backend is as accurate as a careful float32
implementation; 10 means ten times less accurate; a bug shows as orders of
magnitude.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from refllm.testing.backends import as_backend
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.factories import refllm_contiguous, refllm_float64


@dataclass(frozen=True)
class ErrorAgainstTruth:
    backend_error: float  # relative to the largest true logit
    float32_error: float  # refllm's float32 spec path, the same way

    @property
    def ratio(self) -> float:
        return self.backend_error / self.float32_error if self.float32_error else float("inf")

    def describe(self) -> str:
        return (
            f"error against float64 truth {self.backend_error:.3g} of the largest logit,"
            f" {self.ratio:.3g}x refllm's float32 spec ({self.float32_error:.3g})"
        )


def relative_error(logits: np.ndarray, truth: np.ndarray) -> float:
    """max |logits - truth| / max |truth|."""
    return float(np.abs(np.asarray(logits, np.float64) - truth).max() / np.abs(truth).max())


def error_against_truth(backend, checkpoint: Checkpoint, tokens: Sequence[int]) -> ErrorAgainstTruth:
    """All-position logits of ``tokens`` from ``backend`` and from refllm's float32 spec, against float64 truth."""
    truth = refllm_float64(checkpoint).all_logits(tokens)
    float32 = refllm_contiguous(checkpoint).all_logits(tokens)
    return ErrorAgainstTruth(
        relative_error(as_backend(backend).all_logits(tokens), truth), relative_error(float32, truth)
    )
