"""A request's body and its prompts, read within the server's limits without holding up the event loop.

The body is read within its size and time limits and parsed on a worker thread; texts
are measured before they are tokenized (a text longer than the context could hold at
the vocabulary's longest token is refused unread), then tokenized on a worker thread
by ``Tokenizer.encode_many``, which lets the event loop run meanwhile; the number of
inputs and their tokens are capped per request.
"""

from __future__ import annotations

import functools
from typing import Any

import anyio
import numpy as np
from starlette.requests import Request

from refllm.errors import ImageError, InvalidInputError
from refllm.io.images import decode_data_url
from refllm.io.tokenizer import Tokenizer
from refllm.io.vision_prompt import encode_chat
from refllm.server import protocol
from refllm.server.limits import ServerLimits, read_body
from refllm.server.protocol import RequestError


class RequestInputs:
    def __init__(
        self,
        tokenizer: Tokenizer | None,
        context_length: int,
        model_name: str,
        limits: ServerLimits,
        image_processor: Any = None,
    ):
        """image_processor: a vision-language model's (``refllm.io.image_processing``); None: text only."""
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.model_name = model_name
        self.limits = limits
        self.image_processor = image_processor

    async def body(self, request: Request) -> dict[str, Any]:
        """The body as a JSON object: read within the limits (413, 408), parsed on a worker thread."""
        return await anyio.to_thread.run_sync(protocol.parse_body, await read_body(request, self.limits))

    async def token_ids(self, value: Any, param: str) -> list[list[int]]:
        """A prompt or input given as text(s) or as token ids -> a token-id list per prompt, within the limits."""
        ids = protocol.token_id_lists(value)
        if ids is None:
            texts = protocol.texts(value)
            if texts is None:
                raise RequestError(
                    f"{param} must be a string, a list of strings, a list of token ids, or a list of such lists",
                    param=param,
                )
            if self.tokenizer is None:
                raise RequestError(f"the model {self.model_name!r} has no tokenizer; give token ids", param=param)
            self._check_input_count(len(texts), param)
            for text in texts:
                self._check_text_length(len(text), param)
            ids = await self._encode(texts)
        self._check_input_count(len(ids), param)
        total = sum(len(i) for i in ids)
        if total > self.limits.max_request_tokens:
            raise RequestError(
                f"{param} holds {total} tokens, past this server's limit of {self.limits.max_request_tokens}"
                " per request",
                param=param,
            )
        return ids

    async def chat_prompt(
        self, messages: list[dict[str, Any]], image_urls: list[tuple[str, str]] = ()
    ) -> tuple[list[int], list[np.ndarray]]:
        """Messages (and their images' data URLs) -> (prompt token ids, pixel batches), through the model's chat
        template and image processor (on a worker thread)."""
        if self.tokenizer is None or self.tokenizer.chat_template is None:
            raise RequestError(f"the model {self.model_name!r} has no chat template; use /v1/completions")
        self._check_text_length(sum(len(str(m["content"])) + len(m["role"]) for m in messages), "messages")
        if self.image_processor is not None:  # a vision-language model reads its messages as content parts
            images = await anyio.to_thread.run_sync(self._decode_images, image_urls)
            encode = functools.partial(encode_chat, self.tokenizer, self.image_processor, messages, images)
            try:
                return await anyio.to_thread.run_sync(encode)
            except InvalidInputError as error:
                raise RequestError(str(error), param="messages") from None
        if image_urls:
            raise RequestError(
                f"the model {self.model_name!r} reads text only; image_url parts need a vision-language model",
                param=image_urls[0][1],
            )
        render = functools.partial(self.tokenizer.apply_chat_template, messages, add_generation_prompt=True)
        try:
            text = await anyio.to_thread.run_sync(render)
        except InvalidInputError as error:
            raise RequestError(str(error), param="messages") from None
        return (await self._encode([text], add_special_tokens=False))[0], []

    def _decode_images(self, image_urls: list[tuple[str, str]]) -> list[np.ndarray]:
        """Each data URL -> uint8 [H, W, 3], within the image limits; the first that fails names its field."""
        if len(image_urls) > self.limits.max_images:
            raise RequestError(
                f"the messages hold {len(image_urls)} images, past this server's limit of {self.limits.max_images}",
                param="messages",
            )
        images = []
        for url, param in image_urls:
            try:
                images.append(decode_data_url(url, self.limits.max_image_bytes, self.limits.max_image_pixels))
            except ImageError as error:
                code = "image_too_large" if "at most" in str(error) else "invalid_image"
                raise RequestError(str(error), param=param, code=code) from None
        return images

    async def _encode(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        encode_many = functools.partial(self.tokenizer.encode_many, add_special_tokens=add_special_tokens)
        return await anyio.to_thread.run_sync(encode_many, texts)

    def _check_input_count(self, count: int, param: str) -> None:
        if count > self.limits.max_inputs:
            limit = self.limits.max_inputs
            raise RequestError(f"{param} holds {count} inputs, past this server's limit of {limit}", param=param)

    def _check_text_length(self, length: int, param: str) -> None:
        """Refuse, before tokenizing it, a text too long for the context even at the vocabulary's longest token."""
        most = self.context_length * self.tokenizer.longest_token_chars
        if length > most:
            raise RequestError(
                f"{param} of {length} characters is past the context length {self.context_length}"
                f" (at most {most} characters at this vocabulary's longest token)",
                param=param,
                code="context_length_exceeded",
            )
