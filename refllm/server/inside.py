"""``POST /v1/inside``: inside the model as it wrote an answer, for the web page's panel (``refllm.tracing``).

The body is a chat request's ``messages`` with the ``answer`` the model gave
(and the sampling fields it was given). The conversation and the answer are
tokenized as the chat endpoint tokenizes them and traced in one forward pass
through the spec ops; for each answer token, the position that produced it
(the one before) is shown:

    tokens       every position's token text; ``answer_start`` is where the answer begins
    lens         per layer, per answer token: the top tokens of the logit lens, with their probabilities
    attention    per layer: the heads' weights from those positions over every key, as bytes (255 = 1)
                 in base64, [heads, answer tokens, keys]
    next_token   per answer token: the most likely next tokens under the request's temperature, whether
                 top-k, top-p and min-p (``refllm.runtime.sampling``) keep each, and how many each keeps
    experts      per sparse layer, per answer token: the experts chosen and their weights (null if dense)
    arena        the engine's paged arena now: each block free (0), cached (1), held (2) or shared (3),
                 and the cached blocks that hold this conversation (the next turn starts on them)

An answer is re-tokenized, so where the model chose an unusual split of its
text, the view shows the usual one. A conversation of more than MAX_TOKENS
tokens is refused: its attention maps would be too large to send.
"""

from __future__ import annotations

import base64
import functools
from collections.abc import Callable
from typing import Any

import anyio
import numpy as np

from refllm.runtime.sampling import (
    SamplingParams,
    apply_logit_bias,
    apply_temperature,
    min_p_filter,
    top_k_filter,
    top_p_filter,
)
from refllm.server import protocol
from refllm.server.protocol import RequestError
from refllm.tracing import Trace, trace

MAX_TOKENS = 1024
LENS_TOP = 5
NEXT_TOKEN_TOP = 20
FREE, CACHED, HELD, SHARED = range(4)


async def inside_view(server: Any, body: dict[str, Any]) -> dict[str, Any]:
    """The panel's data for ``body`` (already read and checked as any request is) on ``server``."""
    model = getattr(server.model, "current", server.model)  # a first run's model may still be on the spec ops
    if model is None:
        raise RequestError("this server has no model to look inside", param="model")
    messages, image_urls = protocol.messages(body)
    if image_urls:
        raise RequestError("the inside view traces conversations of text; this one holds images", param=image_urls[0][1])
    prompt, _ = await server.inputs.chat_prompt(messages)
    answer = server.tokenizer.encode(protocol.string(body, "answer"), add_special_tokens=False)
    if not answer:
        raise RequestError("the answer has no tokens to look inside", param="answer")
    ids = prompt + answer
    if len(ids) > MAX_TOKENS:
        raise RequestError(
            f"the conversation and answer hold {len(ids)} tokens; the inside view traces at most {MAX_TOKENS}",
            param="messages", code="context_length_exceeded",
        )  # fmt: skip
    params = protocol.sampling_params(
        body, max_tokens=1, logprobs=None, max_n=1, vocab_size=model.config.vocab_size
    )
    traced = await anyio.to_thread.run_sync(functools.partial(trace, model, ids, keep_ops=False))
    view = describe(traced, len(prompt), params, lambda token_id: server.tokenizer.decode([token_id]))
    inspect = getattr(server.engine.executor, "inspect", None)  # an LLMExecutor's arena
    if inspect is not None:
        view["arena"] = await anyio.to_thread.run_sync(inspect, functools.partial(block_map, token_ids=ids))
    return view


def describe(traced: Trace, answer_start: int, params: SamplingParams, decode: Callable[[int], str]) -> dict[str, Any]:
    """The panel's data from a trace of prompt + answer; position p - 1 produced the token at p.
    ``decode``: a token id's text."""
    texts = [decode(int(i)) for i in traced.tokens]
    producing = np.arange(answer_start - 1, len(texts) - 1)  # one position per answer token
    keys = len(texts) - 1
    lens_ids, lens_probs = traced.logit_lens(LENS_TOP, producing)  # [L, n, top]
    return {
        "tokens": texts,
        "answer_start": answer_start,
        "layers": len(traced.layers),
        "heads": traced.layers[0].attention.shape[0],
        "lens": [
            [[[decode(int(i)), round(float(p), 4)] for i, p in zip(ids, probs)] for ids, probs in zip(*layer)]
            for layer in zip(lens_ids, lens_probs)
        ],
        "attention": [
            base64.b64encode(_bytes(layer.attention[:, producing, :keys])).decode() for layer in traced.layers
        ],
        "next_token": [
            next_token(traced.logits[p], params, decode, int(chosen))
            for p, chosen in zip(producing, traced.tokens[producing + 1])
        ],
        "experts": _experts(traced, producing),
    }


def next_token(logits: np.ndarray, params: SamplingParams, decode: Callable[[int], str], chosen: int) -> dict[str, Any]:
    """One position's distribution under the request's logit bias and temperature (the sampler's own steps,
    penalties aside: they depend on the history), and what the sampler's filters keep."""
    biased = apply_logit_bias(np.asarray(logits, np.float64), params.logit_bias)
    scaled = apply_temperature(biased, params.temperature or 1.0)  # greedy: as it is; the top token is taken
    probs = np.exp(scaled)
    probs /= probs.sum()
    after_k = top_k_filter(scaled, params.top_k)
    after_p = top_p_filter(after_k, params.top_p)
    after_min_p = min_p_filter(after_p, params.min_p)
    top = np.argsort(-probs, kind="stable")[:NEXT_TOKEN_TOP]
    return {
        "chosen": decode(chosen),
        "top": [[decode(int(i)), round(float(probs[i]), 5), bool(np.isfinite(after_min_p[i]))] for i in top],
        "greedy": params.temperature == 0,
        "top_k": params.top_k, "top_p": params.top_p, "min_p": params.min_p,
        "kept_by_top_k": int(np.isfinite(after_k).sum()),
        "kept_by_top_p": int(np.isfinite(after_p).sum()),
        "kept_by_min_p": int(np.isfinite(after_min_p).sum()),
        "min_p_threshold": float(params.min_p * probs.max()),
    }  # fmt: skip


def block_map(llm: Any, token_ids: list[int]) -> dict[str, Any]:
    """The arena's blocks by state, and the cached blocks that hold ``token_ids`` (read under the executor's lock)."""
    arena = llm.arena
    states = np.full(arena.num_blocks, FREE, np.uint8)
    states[arena.pool.cached_blocks()] = CACHED
    states[arena.refcounts == 1] = HELD
    states[arena.refcounts > 1] = SHARED
    return {
        "block_size": arena.block_size,
        "states": base64.b64encode(states.tobytes()).decode(),
        "conversation": arena.pool.cached_prefix(token_ids, arena.block_size),
    }


def _bytes(weights: np.ndarray) -> bytes:
    return np.clip(np.rint(np.asarray(weights) * 255), 0, 255).astype(np.uint8).tobytes()


def _experts(traced: Trace, producing: np.ndarray) -> list | None:
    routed = [(layer.index, layer.experts) for layer in traced.layers if layer.experts is not None]
    if not routed:
        return None
    return [
        {"layer": index, "ids": ids[producing].tolist(), "weights": np.round(weights[producing], 4).tolist()}
        for index, (ids, weights) in routed
    ]
