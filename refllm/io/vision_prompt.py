"""A conversation with images -> the prompt's token ids and its pixel batches, as the Hugging Face processors do.

    messages (content parts {"type": "text"} and {"type": "image"}) -> the chat template
    -> text where each image is its placeholder (SmolVLM: <image>; Gemma 3: <start_of_image>)
    -> each placeholder replaced by its image's prompt text (its runs of image tokens, and markers)
    -> token ids; and each image through the image processor -> pixel batches, in the same order

A vision-language model's chat template expects content as a list of parts; a message whose
content is a plain string becomes one text part.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from refllm.errors import ImageError, InvalidInputError
from refllm.io.image_processing import expand_prompt
from refllm.io.tokenizer import Tokenizer


def content_parts(text: str, num_images: int = 0) -> list[dict[str, str]]:
    """A user message's content: its images first (as the model cards show), then its text."""
    return [{"type": "image"}] * num_images + ([{"type": "text", "text": text}] if text else [])


def as_parts(messages: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every message's content as a list of parts, as vision-language chat templates read it."""
    return [
        {**m, "content": content_parts(m["content"]) if isinstance(m.get("content"), str) else m.get("content")}
        for m in messages
    ]


def encode_chat(
    tokenizer: Tokenizer, processor: Any, messages: Sequence[dict[str, Any]], images: Sequence[np.ndarray]
) -> tuple[list[int], list[np.ndarray]]:
    """messages with {"type": "image"} parts, and one uint8 [H, W, 3] image per such part, in order
    -> (prompt token ids, one pixel batch [N, 3, S, S] per image)."""
    if processor is None:
        raise ImageError("this model has no image processor (preprocessor_config.json), so it cannot read images")
    wanted = sum(1 for m in messages if isinstance(m.get("content"), list)
                 for part in m["content"] if isinstance(part, dict) and part.get("type") == "image")  # fmt: skip
    if wanted != len(images):
        raise InvalidInputError(f"the messages place {wanted} image(s) but {len(images)} were given")
    text = tokenizer.apply_chat_template(as_parts(messages))
    batches = [processor(image) for image in images]
    ids = tokenizer.encode(expand_prompt(text, processor.placeholder, batches), add_special_tokens=False)
    return ids, [batch.pixels for batch in batches]
