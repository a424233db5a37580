"""Runtime throughput on a random-weight model of the SmolLM2-135M shape.

1. ``LLM.decode_batch`` tokens/s at batch 1, 4, 8 and 16 (each sequence
   holding a 32-token prompt), and each batch's speed-up over batch 1
   (target: batch 8 at least 4x batch 1);
2. greedy speculative decoding with prompt-lookup drafting on repetitive
   text against plain greedy decoding: wall time for the same tokens.

Every figure is the median of ``--runs`` runs (a speed-up is the median of
each run's ratio). Prints the machine, the thread settings, and the figures
as JSON. NUMBA_NUM_THREADS sets the thread count; the projections run in
refllm's dense Numba kernel (refllm/kernels/dense_matmul.py), and NumPy's
BLAS stays on the calling thread while a model computes
(refllm/kernels/threads.py).

    python benchmarks/bench_runtime.py [--runs 5] [--steps 16] [--new-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import numpy as np
from machine import SMOLLM2_135M  # benchmarks/machine.py

from refllm import CacheConfig
from refllm.config import ModelConfig
from refllm.machine import cpu_name, thread_settings, vector_extensions
from refllm.models.random import random_model
from refllm.runtime.executor import LLMExecutor
from refllm.runtime.llm import LLM
from refllm.runtime.sampling import SamplingParams
from refllm.runtime.speculative import PromptLookupDrafter, speculative_generate

BATCH_SIZES = (1, 4, 8, 16)
PROMPT_LENGTH = 32


def decode_batch_tokens_per_second(llm: LLM, batch: int, steps: int, rng: np.random.Generator) -> float:
    """Prefill ``batch`` prompts, then time ``steps`` decode_batch calls over all of them."""
    vocab = llm.config.vocab_size
    for cache_id in range(batch):
        llm.prefill(cache_id, rng.integers(0, vocab, PROMPT_LENGTH))
    llm.decode_batch([(c, 0, PROMPT_LENGTH) for c in range(batch)])  # warm-up step
    start = time.perf_counter()
    for step in range(steps):
        llm.decode_batch([(c, int(rng.integers(vocab)), PROMPT_LENGTH + 1 + step) for c in range(batch)])
    elapsed = time.perf_counter() - start
    llm.reset()
    return batch * steps / elapsed


def plain_greedy(llm: LLM, prompt: list[int], new_tokens: int) -> list[int]:
    logits, tokens = llm.prefill("plain", prompt), []
    while len(tokens) < new_tokens:
        tokens.append(int(np.argmax(logits)))
        logits = llm.decode("plain", tokens[-1], len(prompt) + len(tokens) - 1)
    llm.release("plain")
    return tokens


def timed(work):
    start = time.perf_counter()
    result = work()
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=16, help="decode_batch calls timed per run")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per speculative run")
    parser.add_argument("--k", type=int, default=4, help="drafted tokens per speculative round")
    args = parser.parse_args()

    print(
        f"cpu: {cpu_name()}; vectors: {' '.join(vector_extensions()) or '-'};"
        f" cores: {os.cpu_count()}; {thread_settings()}"
    )
    model = random_model(ModelConfig.from_hf(SMOLLM2_135M), seed=0, std=0.02)
    llm = LLM(model, CacheConfig(block_size=16, num_blocks=512))
    rng = np.random.default_rng(0)
    decode_batch_tokens_per_second(llm, 1, 2, rng)  # compile and touch every weight once

    # The batch sizes take turns within each run, so a noisy neighbour slows them alike.
    runs = [{b: decode_batch_tokens_per_second(llm, b, args.steps, rng) for b in BATCH_SIZES} for _ in range(args.runs)]
    figures = {
        "decode_batch_tokens_per_s": {b: round(statistics.median(r[b] for r in runs), 1) for b in BATCH_SIZES},
        "speedup_over_batch_1": {b: round(statistics.median(r[b] / r[1] for r in runs), 2) for b in BATCH_SIZES},
    }

    phrase = rng.integers(0, SMOLLM2_135M["vocab_size"], 12).tolist()
    prompt = phrase * 6  # repetitive text: the phrase's n-grams recur
    executor = LLMExecutor(llm, offload=False)
    params = SamplingParams(max_tokens=args.new_tokens, ignore_eos=True)
    plain_times, speculative_times, acceptance, rounds = [], [], [], []
    for _ in range(args.runs):
        expected, seconds = timed(lambda: plain_greedy(llm, prompt, args.new_tokens))
        plain_times.append(seconds)
        result, seconds = timed(
            lambda: asyncio.run(speculative_generate(executor, PromptLookupDrafter(), prompt, params, args.k))
        )
        assert result.token_ids == expected, "greedy speculative decoding must emit the greedy tokens"
        speculative_times.append(seconds)
        acceptance.append(result.acceptance_rate)
        rounds.append(result.rounds)
    figures["speculative_prompt_lookup"] = {
        "new_tokens": args.new_tokens,
        "k": args.k,
        "plain_greedy_s": round(statistics.median(plain_times), 3),
        "speculative_s": round(statistics.median(speculative_times), 3),
        "speedup": round(statistics.median(plain_times) / statistics.median(speculative_times), 2),
        "acceptance_rate": round(statistics.median(acceptance), 2),
        "target_passes": statistics.median(rounds) + 1,  # the prefill, then one verify pass a round
    }
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
