"""What the benchmarks share: the model shape they measure, and timing (the machine comes from refllm.machine)."""

from __future__ import annotations

import statistics
import time

# The SmolLM2-135M shape (config.json keys), for benchmarks on random weights of a real size.
SMOLLM2_135M = dict(
    model_type="llama",
    vocab_size=49152,
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    max_position_embeddings=8192,
    rms_norm_eps=1e-5,
    rope_theta=100000.0,
    tie_word_embeddings=True,
)


def median_seconds(run, runs: int) -> float:
    """The median time of ``runs`` calls of ``run``, after one warm-up call (compiling, filling caches)."""
    run()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
