"""Speculative decoding: a cheap drafter proposes k tokens and the target checks them in one forward pass.

    result = await speculative_generate(target, PromptLookupDrafter(), prompt_ids, params, k=4)

Each round, with the target's cache holding every token but the pending (last sampled) one:

1. the drafter proposes up to k tokens to follow the context;
2. the target runs ONE ``forward_verify`` over [pending, draft_1 .. draft_k]: k + 1 rows of logits;
3. drafts are accepted left to right. Greedy accepts a draft equal to the
   target's argmax, so it emits exactly what plain greedy decoding emits.
   Sampling accepts draft x with probability min(1, p(x) / q(x)) and on a
   rejection draws from max(p - q, 0), renormalised (Leviathan et al., 2023),
   which makes every emitted token distributed as the target's own draw. The
   first rejection ends the round with the target's token in its place; if
   all drafts pass, the last row gives one more token;
4. ``truncate_kv`` rolls the target's cache back past the rejected drafts.

Drafters: ``PromptLookupDrafter`` copies what followed the latest earlier
occurrence of the context's last n-gram (no second model; its q is one-hot,
so acceptance is p(x)); ``DraftModelDrafter`` runs a smaller model with the
same vocabulary through its own executor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from refllm.errors import ContextLengthError, InvalidInputError
from refllm.io.tokenizer import Tokenizer
from refllm.runtime.checks import check_prompt
from refllm.runtime.executor import DecodeInput, KvCacheHandle, ModelExecutor, PrefillInput
from refllm.runtime.sampling import Sampler, SamplingParams, probabilities, processed_logits
from refllm.runtime.stream import TextStream


@dataclass(frozen=True)
class Draft:
    tokens: list[int]  # [n] proposed tokens, n <= k
    probs: np.ndarray | None = None  # [n, V]: the distributions they were drawn from; None means one-hot


class Drafter(Protocol):
    async def propose(self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """Up to k tokens to follow ``context`` (the prompt and every generated token)."""

    def release(self) -> None:
        """Drop whatever the drafter keeps between rounds."""


@dataclass(frozen=True)
class SpeculativeResult:
    token_ids: list[int]  # generated, stop tokens excluded
    text: str
    finish_reason: str
    rounds: int  # target forward passes after the prefill
    drafted: int
    accepted: int

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


class PromptLookupDrafter:
    """Drafts by n-gram lookup in the context itself: repetitive text (code, quotes, edits) drafts well."""

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise InvalidInputError(f"need 1 <= min_ngram <= max_ngram; got {min_ngram} and {max_ngram}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    async def propose(self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        """The tokens after the latest earlier occurrence of the longest matching tail n-gram.

        The latest occurrence with k tokens after it wins; failing that, the one
        with the most (in a run like "a a a a" the latest match has one).
        """
        context = list(context)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            tail, best = context[-n:], []
            for start in range(len(context) - n - 1, -1, -1):  # latest earlier occurrence first
                if context[start : start + n] == tail:
                    follow = context[start + n : start + n + k]
                    best = follow if len(follow) > len(best) else best
                    if len(best) == k:
                        break
            if best:
                return Draft(best)
        return Draft([])

    def release(self) -> None:
        pass


class DraftModelDrafter:
    """Drafts with a smaller model; its cache follows the context, rolled back where the context diverged."""

    def __init__(self, executor: ModelExecutor):
        self.executor = executor
        self._handle: KvCacheHandle | None = None
        self._cached: list[int] = []  # the tokens in the draft cache

    async def propose(self, context: Sequence[int], k: int, params: SamplingParams, rng: np.random.Generator) -> Draft:
        logits = await self._follow(list(context))
        tokens, probs = [], []
        for i in range(k):
            if params.greedy:
                token = int(np.argmax(processed_logits(logits, params)))
                q = _one_hot(logits.size, token)
            else:
                q = probabilities(logits, params)
                token = int(rng.choice(q.size, p=q))
            tokens.append(token)
            probs.append(q)
            if i < k - 1:
                out = await self.executor.decode(DecodeInput(token, self._handle))
                self._handle, logits = out.kv_cache, out.logits
                self._cached.append(token)
        return Draft(tokens, np.stack(probs) if probs else None)

    async def _follow(self, context: list[int]) -> np.ndarray:
        """Bring the draft cache to ``context`` -> the draft model's logits [V] after it."""
        if self._handle is None:
            out = await self.executor.prefill(PrefillInput(context))
        else:
            common = 0
            limit = min(len(self._cached), len(context) - 1)  # feed at least one token, for its logits
            while common < limit and self._cached[common] == context[common]:
                common += 1
            handle = await self.executor.truncate_kv(self._handle, common)
            out = await self.executor.prefill(PrefillInput(context[common:], handle))
        self._handle, self._cached = out.kv_cache, context
        return out.logits

    def release(self) -> None:
        if self._handle is not None:
            self.executor.release_cache(self._handle)
        self._handle, self._cached = None, []


async def speculative_generate(
    target: ModelExecutor,
    drafter: Drafter,
    prompt_ids: Sequence[int],
    params: SamplingParams | None = None,
    k: int = 4,
    tokenizer: Tokenizer | None = None,
) -> SpeculativeResult:
    """Generate for one prompt, k drafted tokens a round (see the module docstring)."""
    params = SamplingParams() if params is None else params
    info = target.info()
    if not isinstance(params, SamplingParams) or params.n != 1:
        raise InvalidInputError("speculative decoding takes a SamplingParams with n = 1")
    if k < 1:
        raise InvalidInputError(f"k must be at least 1, not {k}")
    prompt = check_prompt(prompt_ids, info.vocab_size).tolist()
    room = info.context_length - len(prompt)
    if room < 1:
        raise ContextLengthError(f"a prompt of {len(prompt)} tokens leaves no room within {info.context_length}")
    max_tokens = min(params.max_tokens, room)
    stream = TextStream(tokenizer, dataclasses.replace(params, max_tokens=max_tokens), info.eos_token_ids)
    sampler = Sampler(params)
    out = await target.prefill(PrefillInput(prompt))
    handle, step = out.kv_cache, stream.feed(sampler(out.logits, prompt).token)
    rounds = drafted = accepted = 0
    try:
        while not step.finished:
            context = prompt + stream.tokens  # the cache holds all but the last (pending) token
            budget = min(k, max_tokens - len(stream.tokens) - 1)  # a round emits up to len(draft) + 1 tokens
            draft = await drafter.propose(context, budget, params, sampler.rng) if budget > 0 else Draft([])
            verified = await target.forward_verify(handle, [context[-1], *draft.tokens])
            emitted = accept_draft(verified.logits, draft, sampler, prompt, stream.tokens)
            handle = await target.truncate_kv(verified.kv_cache, len(context) + len(emitted) - 1)
            rounds, drafted, accepted = rounds + 1, drafted + len(draft.tokens), accepted + len(emitted) - 1
            for token in emitted:
                step = stream.feed(token)
                if step.finished:
                    break
    finally:
        target.release_cache(handle)
        drafter.release()
    return SpeculativeResult(list(stream.tokens), stream.text, step.finish_reason, rounds, drafted, accepted)


def accept_draft(
    target_logits: np.ndarray, draft: Draft, sampler: Sampler, prompt: Sequence[int], output: Sequence[int]
) -> list[int]:
    """target_logits: [len(draft) + 1, V], row i following draft token i - 1 -> the tokens to emit.

    The accepted drafts, then one token of the target's: the replacement of
    the first rejected draft, or the bonus token after them all.
    """
    params, emitted = sampler.params, []
    for row, token in zip(target_logits, draft.tokens):
        history = [*output, *emitted]
        if params.greedy:
            best = sampler(row, prompt, history).token
            if best != token:
                return [*emitted, best]
        else:
            p = probabilities(row, params, prompt, history)  # [V] the target's distribution
            q = draft.probs[len(emitted)] if draft.probs is not None else _one_hot(p.size, token)
            if sampler.rng.random() >= min(1.0, p[token] / q[token]):
                residual = np.maximum(p - q, 0.0)
                return [*emitted, int(sampler.rng.choice(p.size, p=residual / residual.sum()))]
        emitted.append(token)
    return [*emitted, sampler(target_logits[len(emitted)], prompt, [*output, *emitted]).token]


def _one_hot(size: int, token: int) -> np.ndarray:
    """The distribution [V] of a token drafted with certainty."""
    q = np.zeros(size)
    q[token] = 1.0
    return q
