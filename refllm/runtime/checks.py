"""The runtime's input checks, shared by ``LLM`` and the scripted executor, so both refuse alike.

Each check raises a refusal (an ``InvalidInputError`` subclass naming the bad
value) and changes nothing; callers run every check before they mutate.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import numpy as np

from refllm.errors import ContextLengthError, InvalidInputError, PositionError, TokenOutOfRangeError

DecodeItem = tuple[Hashable, int, int]  # (cache_id, token, pos)


def check_prompt(tokens: Any, vocab_size: int) -> np.ndarray:
    """tokens: a non-empty 1-D sequence of ids in [0, vocab_size) -> [T] int64."""
    if isinstance(tokens, (list, tuple)):  # item by item: int and np.uint64 together would make a float64 array
        array = np.empty(len(tokens), object)
        array[:] = tokens
        if any(isinstance(t, (list, tuple, np.ndarray)) for t in tokens):
            array = np.asarray(tokens)  # nested: refused below by its rank
    else:
        array = np.asarray(tokens)
    if array.ndim != 1 or array.size == 0 or not (np.issubdtype(array.dtype, np.integer) or array.dtype == object):
        raise InvalidInputError(f"tokens must be a non-empty list of token ids; got {_describe(tokens)}")
    return np.array([check_token(t, vocab_size) for t in array], np.int64)


def check_token(token: Any, vocab_size: int) -> int:
    try:
        token = operator.index(token)
    except TypeError:
        raise InvalidInputError(f"a token id must be an integer; got {token!r}") from None
    if not 0 <= token < vocab_size:
        raise TokenOutOfRangeError(f"token id {token} is outside the vocabulary [0, {vocab_size})")
    return token


def check_position(cache_id: Hashable, pos: Any, length: int) -> None:
    if not isinstance(pos, (int, np.integer)) or pos != length:
        raise PositionError(f"cache id {cache_id!r} has consumed {length} tokens, so pos must be {length}; got {pos!r}")


def check_truncate(cache_id: Hashable, length: Any, current: int) -> int:
    if not isinstance(length, (int, np.integer)) or not 0 <= length <= current:
        raise InvalidInputError(f"cache id {cache_id!r} holds {current} tokens; cannot truncate it to {length!r}")
    return int(length)


def check_fits_context(cache_id: Hashable, start: int, num_new: int, context_length: int) -> None:
    if start + num_new > context_length:
        raise ContextLengthError(
            f"cache id {cache_id!r} would hold {start + num_new} tokens, past the context length {context_length}"
        )


def check_decode_items(
    items: Sequence[DecodeItem], length_of: Callable[[Hashable], int], vocab_size: int, context_length: int
) -> tuple[list[Hashable], np.ndarray]:
    """Every item of a decode batch, checked before anything runs -> (cache ids, tokens [B] int64)."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items:
        raise InvalidInputError(f"decode_batch takes a non-empty list of (cache_id, token, pos); got {items!r:.80}")
    cache_ids, tokens = [], []
    for item in items:
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise InvalidInputError(f"each decode item is (cache_id, token, pos); got {item!r:.80}")
        cache_id, token, pos = check_cache_id(item[0]), item[1], item[2]
        if cache_id in cache_ids:
            raise InvalidInputError(f"cache id {cache_id!r} appears twice in one decode batch")
        check_position(cache_id, pos, length_of(cache_id))
        check_fits_context(cache_id, pos, 1, context_length)
        cache_ids.append(cache_id)
        tokens.append(check_token(token, vocab_size))
    return cache_ids, np.array(tokens, np.int64)


def check_cache_id(cache_id: Any) -> Hashable:
    """A cache id that a dict can find again: hashable and equal to itself (no NaN, not even inside a tuple)."""
    try:
        hash(cache_id)
        found_again = _equal_to_itself(cache_id)
    except (TypeError, ValueError):
        found_again = False
    if not found_again:
        raise InvalidInputError(
            f"a cache id must be hashable and equal to itself (an int or a str, say); got {cache_id!r:.80}"
        )
    return cache_id


def _equal_to_itself(value: Any) -> bool:
    """``value == value``, also for the items of tuples (whose comparison skips an item that is itself)."""
    if isinstance(value, (tuple, frozenset)):
        return all(_equal_to_itself(item) for item in value)
    return bool(value == value)


def _describe(value: Any) -> str:
    array = np.asarray(value)
    return f"{type(value).__name__} of dtype {array.dtype} and shape {array.shape}"
