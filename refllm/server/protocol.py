"""The OpenAI wire format: reading request fields, writing logprobs, errors and server-sent events.

Every refusal is a ``RequestError``, which the app turns into OpenAI's error
shape, ``{"error": {"message", "type", "param", "code"}}``, naming the field
that was wrong. Fields the server does not know are ignored (clients send
``user``, ``store`` and the like); fields it knows but cannot honour are
refused rather than silently dropped.
"""

from __future__ import annotations

import json
import math
from typing import Any

from refllm.runtime.sampling import (
    LOGIT_BIAS_LIMIT,
    MAX_LOGIT_BIAS_TOKENS,
    REPETITION_PENALTY_RANGE,
    SamplingParams,
    SamplingParamsError,
)

MAX_TOP_LOGPROBS = 20
# Fields whose non-default values this server cannot honour, and the values that are harmless.
UNSUPPORTED = {
    "suffix": ("",),
    "echo": (False,),
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none", "auto"),
    "function_call": ("none", "auto"),
    "response_format": ({"type": "text"},),
}


class RequestError(Exception):
    """A request the server refuses; ``status`` and the fields of OpenAI's error body."""

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        status: int = 400,
        type: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status
        self.type = type
        self.code = code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body -> its JSON object."""
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise RequestError(f"the request body is not valid JSON: {error}", code="invalid_json") from None
    except RecursionError:
        raise RequestError("the request body nests its JSON too deep", code="invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError(f"the request body must be a JSON object, not {type(body).__name__}")
    if b"\\ud" in raw.lower():  # JSON may escape a lone surrogate, which is no character: refused by its field
        surrogate = _lone_surrogate(body)
        if surrogate is not None:
            raise RequestError("a string holds a lone UTF-16 surrogate, which is no character", param=surrogate)
    return body


def _lone_surrogate(body: dict[str, Any]) -> str | None:
    """The field (``messages[0].content``, say) of the first string holding a lone surrogate, or None."""
    pending: list[tuple[str, Any]] = [("", body)]
    while pending:  # a loop, not recursion: the body may nest as deep as the JSON parser allows
        path, value = pending.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path or None
        elif isinstance(value, dict):
            pending += [(f"{path}.{key}" if path else key, item) for key, item in value.items()]
            if any(isinstance(key, str) and not key.isascii() for key in value):
                pending += [(path, key) for key in value]
        elif isinstance(value, list):
            pending += [(f"{path}[{i}]", item) for i, item in enumerate(value)]
    return None


def number(
    body: dict[str, Any],
    key: str,
    default: float,
    low: float,
    high: float = math.inf,
    *,
    open_low: bool = False,
    name: str | None = None,
) -> float:
    """A finite number in [low, high] (in (low, high] with ``open_low``); absent or null gives ``default``.
    A refusal names ``name`` (default ``key``)."""
    name = name or key
    value = body.get(key)
    if value is None:
        return default
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not (is_number and (low < value if open_low else low <= value) and value <= high):
        if high == math.inf:
            bounds = f"> {low:g}" if open_low else f">= {low:g}"
        else:
            bounds = f"in {'(' if open_low else '['}{low:g}, {high:g}]"
        raise RequestError(f"{name} must be a number {bounds}; got {value!r:.50}", param=name)
    return float(value)


def integer(body: dict[str, Any], name: str, default: int | None, low: int, high: int | None = None) -> int | None:
    """An integer in [low, high] (no upper bound when high is None); absent or null gives ``default``."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise RequestError(f"{name} must be an integer {bounds}; got {value!r:.50}", param=name)
    return value


def boolean(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise RequestError(f"{name} must be true or false; got {value!r:.50}", param=name)
    return value


def string(body: dict[str, Any], name: str) -> str:
    """A required string."""
    value = body.get(name)
    if value is None:
        raise RequestError(f"the request has no {name}", param=name)
    if not isinstance(value, str):
        raise RequestError(f"{name} must be a string; got {value!r:.50}", param=name)
    return value


def check_supported(body: dict[str, Any]) -> None:
    """Refuse a field this server knows but cannot honour, unless it holds a harmless value."""
    for name, harmless in UNSUPPORTED.items():
        if body.get(name) is not None and body[name] not in harmless:
            raise RequestError(f"{name} is not supported by this server", param=name, code="unsupported_parameter")
    best_of = body.get("best_of")
    if best_of is not None and best_of != body.get("n", 1):
        raise RequestError("best_of other than n is not supported by this server", param="best_of")


def stop_strings(body: dict[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise RequestError("stop must be a non-empty string or a list of them", param="stop")
    return tuple(stops)


def sampling_params(
    body: dict[str, Any], *, max_tokens: int, logprobs: int | None, max_n: int, vocab_size: int
) -> SamplingParams:
    """The sampling fields shared by completions and chat completions (OpenAI's defaults) -> SamplingParams.

    ``top_k``, ``min_p``, ``repetition_penalty`` and ``ignore_eos`` are accepted as
    extensions, with the names vLLM gives them. A value SamplingParams refuses (a
    temperature between 0 and its floor, say) is refused naming its field.
    """
    try:
        return SamplingParams(
            temperature=number(body, "temperature", 1.0, 0.0, 2.0),
            top_p=number(body, "top_p", 1.0, 0.0, 1.0, open_low=True),
            top_k=integer(body, "top_k", 0, 0),
            min_p=number(body, "min_p", 0.0, 0.0, 1.0),
            repetition_penalty=number(body, "repetition_penalty", 1.0, *REPETITION_PENALTY_RANGE),
            presence_penalty=number(body, "presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=number(body, "frequency_penalty", 0.0, -2.0, 2.0),
            seed=integer(body, "seed", None, 0),
            max_tokens=max_tokens,
            stop=stop_strings(body),
            logprobs=logprobs,
            n=integer(body, "n", 1, 1, max_n),
            ignore_eos=boolean(body, "ignore_eos"),
            logit_bias=logit_bias(body, vocab_size),
        )
    except SamplingParamsError as error:
        raise RequestError(str(error), param=error.name) from None


def logit_bias(body: dict[str, Any], vocab_size: int) -> dict[int, float]:
    """OpenAI's ``logit_bias``: an object from token ids (as JSON's string keys) to biases in [-100, 100]; a bad
    entry is refused naming its key (``logit_bias.50256``)."""
    value = body.get("logit_bias")
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise RequestError("logit_bias must be an object mapping token ids to biases", param="logit_bias")
    if len(value) > MAX_LOGIT_BIAS_TOKENS:
        raise RequestError(
            f"logit_bias names {len(value)} tokens; this server takes at most {MAX_LOGIT_BIAS_TOKENS}",
            param="logit_bias",
        )
    bias: dict[int, float] = {}
    for key, amount in value.items():
        param = f"logit_bias.{key:.40}"
        if not (key.isascii() and key.isdigit() and len(key) <= 10):
            raise RequestError(f"logit_bias keys must be token ids (whole numbers >= 0); got {key!r:.40}", param=param)
        token = int(key)
        if token >= vocab_size:
            raise RequestError(f"logit_bias names token {token}, outside the vocabulary [0, {vocab_size})", param=param)
        if token in bias:
            raise RequestError(f"logit_bias names token {token} twice", param=param)
        bias[token] = number(value, key, 0.0, -LOGIT_BIAS_LIMIT, LOGIT_BIAS_LIMIT, name=param)
    return bias


def token_id_lists(value: Any) -> list[list[int]] | None:
    """A prompt given as token ids (one list, or a list of lists) -> the lists; None if it is not one."""

    def is_ids(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)

    if is_ids(value):
        return [value]
    if isinstance(value, list) and value and all(is_ids(v) for v in value):
        return value
    return None


def texts(value: Any) -> list[str] | None:
    """A prompt given as text (one string, or a list of them) -> the strings; None if it is not one."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        return value
    return None


def message_content(content: Any, index: int, images: list[tuple[str, str]]) -> str | list[dict[str, str]]:
    """A chat message's content -> its text, or, when it holds images, its parts: text parts and one
    {"type": "image"} per ``image_url`` part, whose URL (and request field) is appended to ``images``."""
    param = f"messages[{index}].content"
    if content is None or isinstance(content, str):
        return content or ""
    if not (isinstance(content, list) and all(isinstance(p, dict) for p in content)):
        raise RequestError("content must be a string or a list of content parts", param=param)
    parts = []
    for j, part in enumerate(content):
        if part.get("type") == "text" and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif part.get("type") == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else None
            if not isinstance(url, str):
                raise RequestError('an image_url part needs {"url": "data:image/...;base64,..."}', param=f"{param}[{j}]")
            images.append((url, f"{param}[{j}].image_url"))
            parts.append({"type": "image"})
        else:
            raise RequestError("content parts may be text or image_url", param=f"{param}[{j}]")
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def messages(body: dict[str, Any]) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """The ``messages`` field -> ([{"role", "content"}], the image URLs with their request fields, in order);
    content flattened to text, or kept as parts when it holds images."""
    value = body.get("messages")
    if not isinstance(value, list) or not value:
        raise RequestError("messages must be a non-empty list of messages", param="messages")
    result, images = [], []
    for index, message in enumerate(value):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise RequestError("each message must be an object with a string role", param=f"messages[{index}]")
        result.append({"role": message["role"], "content": message_content(message.get("content"), index, images)})
    return result, images


# --- responses --------------------------------------------------------------------------------

TokenLogprob = tuple[str, float, list[tuple[str, float]]]  # (token text, logprob, [(text, logprob)] of the top-n)
LOWEST_LOGPROB = -9999.0  # JSON has no -inf


def clamp(logprob: float) -> float:
    return max(logprob, LOWEST_LOGPROB)


def chat_logprobs(entries: list[TokenLogprob]) -> dict[str, Any]:
    """Chat's ``logprobs``: one entry per token, with its UTF-8 bytes and its top alternatives."""

    def entry(token: str, logprob: float) -> dict[str, Any]:
        return {"token": token, "logprob": clamp(logprob), "bytes": list(token.encode())}

    content = [entry(t, lp) | {"top_logprobs": [entry(a, alp) for a, alp in top]} for t, lp, top in entries]
    return {"content": content, "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], offset: int) -> dict[str, Any]:
    """Completions' ``logprobs``, column by column; ``text_offset`` counts from ``offset`` in the completion."""
    offsets = []
    for token, _, _ in entries:
        offsets.append(offset)
        offset += len(token)
    return {
        "tokens": [t for t, _, _ in entries],
        "token_logprobs": [clamp(lp) for _, lp, _ in entries],
        "top_logprobs": [_most_likely_per_text(top) for _, _, top in entries],
        "text_offset": offsets,
    }


def _most_likely_per_text(top: list[tuple[str, float]]) -> dict[str, float]:
    """A top-n (most likely first) keyed by text: tokens that decode alike keep the first, most likely, value."""
    by_text: dict[str, float] = {}
    for text, logprob in top:
        by_text.setdefault(text, clamp(logprob))
    return by_text


def sse(data: dict[str, Any] | str) -> str:
    """One server-sent event carrying ``data`` (a JSON object, or ``[DONE]``)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"
