"""A decode step with the compiled decoder layer against the same step op by op, in one process, taking turns.

    python benchmarks/bench_decode_step.py [--model smollm2-135m] [--steps 64] [--rounds 5] [--batch 1 4]

The model loads once; ``model.with_ops(a copy of the fast op set)`` is the same model whose layers
run op by op (a copy of the op set is not the fast op set itself, so no layer is fused). Each
round prefills ``--prompt-tokens`` into a fresh arena for each of the two, then times ``--steps``
decode steps of batch ``--batch``, one model and then the other, step by step; and a
speculative verification step (``--verify`` tokens through ``decode_all_logits``). Printed per
configuration: the median step time and its range over the rounds, and the ratio.
The logits of the two are compared bit for bit on the way (they must be equal).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np

import refllm
from refllm import CacheConfig
from refllm.machine import cpu_name, thread_settings
from refllm.models.ops import fast_ops


def step_times(model, prompt: np.ndarray, steps: int, verify: int) -> tuple[list[float], float, np.ndarray]:
    """-> (each decode step's seconds, the verification step's, every logit row) on a fresh arena."""
    cache = model.create_kv_cache(CacheConfig(max_bytes=256 << 20))
    logits = model.prefill(prompt, cache, range(prompt.shape[1]))
    rows, times = [logits], []
    for _ in range(steps):
        start = time.perf_counter()
        logits = model.decode(logits.argmax(-1)[:, None], cache)
        times.append(time.perf_counter() - start)
        rows.append(logits)
    drafts = np.tile(logits.argmax(-1)[:, None], (1, verify))
    start = time.perf_counter()
    rows.append(model.decode_all_logits(drafts, cache).reshape(-1, logits.shape[-1]))
    return times, time.perf_counter() - start, np.concatenate(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--verify", type=int, default=5, help="tokens of the speculative verification step")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--activations", choices=("float32", "int8"), default="float32")
    args = parser.parse_args()

    fused = refllm.load_model(args.model, quantized=True, activations=args.activations)
    op_by_op = fused.with_ops(dataclasses.replace(fast_ops()))
    print(f"{args.model}: {type(fused.layers[0]).__name__} against {type(op_by_op.layers[0]).__name__};"
          f" cpu: {cpu_name()}; {thread_settings()}")  # fmt: skip
    ids = np.random.default_rng(0).integers(100, 20000, args.prompt_tokens)
    for batch in args.batch:
        prompt = np.tile(ids, (batch, 1))
        results = {"fused": ([], []), "op by op": ([], [])}
        for _ in range(args.rounds):
            rows = {}
            for name, model in (("fused", fused), ("op by op", op_by_op)):
                times, verify, rows[name] = step_times(model, prompt, args.steps, args.verify)
                results[name][0].append(statistics.median(times))
                results[name][1].append(verify)
            assert np.array_equal(rows["fused"], rows["op by op"]), "the compiled layer changed the logits"
        for kind, index in (("decode step", 0), (f"verify {args.verify}", 1)):
            medians = {name: statistics.median(r[index]) * 1e3 for name, r in results.items()}
            spreads = {name: f"{min(r[index]) * 1e3:.2f}-{max(r[index]) * 1e3:.2f}" for name, r in results.items()}
            print(f"batch {batch}, {kind}: fused {medians['fused']:.2f} ms ({spreads['fused']}),"
                  f" op by op {medians['op by op']:.2f} ms ({spreads['op by op']}):"
                  f" {medians['op by op'] / medians['fused']:.2f}x", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
