"""Distribution distance as ``llama-perplexity --kl-divergence`` reports it.

Over every position of a prompt set that has a next token, in float64 from
full logits, the backend's distribution Q against the reference's P:

    KLD(P || Q)  = sum_v P(v) (log P(v) - log Q(v))     mean ± standard error, median, 90/95/99/99.9%, max
    same top     = share of positions where argmax Q = argmax P
    Δp           = Q(next) - P(next), the change in the next token's probability: RMS and max |Δp|
    PPL ratio    = exp(mean -log Q(next)) / exp(mean -log P(next))

The reference is refllm's float32 spec or, better, the float64 truth.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


def log_softmax64(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


@dataclass(frozen=True)
class KLStatistics:
    positions: int
    mean: float
    stderr: float
    median: float
    p90: float
    p95: float
    p99: float
    p999: float
    max: float
    same_top: float  # share of positions
    rms_dp: float
    max_dp: float
    ppl_ratio: float

    def lines(self) -> list[str]:
        return [
            f"KL divergence over {self.positions} positions: mean {self.mean:.4g} ± {self.stderr:.2g},"
            f" median {self.median:.4g}, 90% {self.p90:.4g}, 95% {self.p95:.4g}, 99% {self.p99:.4g},"
            f" 99.9% {self.p999:.4g}, max {self.max:.4g}",
            f"same top token {100 * self.same_top:.2f}%; Δp of the next token: RMS {100 * self.rms_dp:.3g}%,"
            f" max {100 * self.max_dp:.3g}%; perplexity ratio {self.ppl_ratio:.6g}",
        ]


def kl_statistics(logits: np.ndarray, reference: np.ndarray, next_tokens: Sequence[int]) -> KLStatistics:
    """logits, reference: [N, V] at N positions; next_tokens: [N], the token that follows each position."""
    log_q, log_p = log_softmax64(logits), log_softmax64(reference)
    p = np.exp(log_p)
    kld = np.maximum((p * (log_p - log_q)).sum(-1), 0.0)  # [N]; rounding can dip a hair below zero
    rows, nxt = np.arange(len(kld)), np.asarray(next_tokens)
    dp = np.exp(log_q[rows, nxt]) - p[rows, nxt]
    p90, p95, p99, p999 = np.percentile(kld, [90, 95, 99, 99.9])
    return KLStatistics(
        positions=len(kld),
        mean=float(kld.mean()),
        stderr=float(kld.std(ddof=1) / np.sqrt(len(kld))) if len(kld) > 1 else float("nan"),
        median=float(np.median(kld)),
        p90=float(p90), p95=float(p95), p99=float(p99), p999=float(p999),
        max=float(kld.max()),
        same_top=float(np.mean(log_q.argmax(-1) == log_p.argmax(-1))),
        rms_dp=float(np.sqrt(np.mean(dp**2))),
        max_dp=float(np.abs(dp).max()),
        ppl_ratio=float(np.exp(np.mean(log_p[rows, nxt]) - np.mean(log_q[rows, nxt]))),
    )  # fmt: skip


def kl_divergence(backend, reference, prompts: Sequence[Sequence[int]]) -> KLStatistics:
    """Statistics of ``backend`` against ``reference`` (both anything ``as_backend`` accepts) over ``prompts``."""
    from refllm.testing.backends import as_backend

    backend, reference = as_backend(backend), as_backend(reference)
    actual, expected, following = [], [], []
    for tokens in prompts:
        tokens = list(tokens)
        actual.append(np.asarray(backend.all_logits(tokens))[:-1])
        expected.append(np.asarray(reference.all_logits(tokens))[:-1])
        following.extend(tokens[1:])
    return kl_statistics(np.concatenate(actual), np.concatenate(expected), following)
