"""Image files to pixels: decoding (with Pillow, the optional ``refllm[vision]`` extra), with limits.

``decode_image(data)`` turns the bytes of a PNG, JPEG, GIF, WebP or BMP file into an
8-bit RGB array [H, W, 3], as the Hugging Face processors see it: a grey or palette
image converted to RGB, transparency composited onto white. Everything after that (resizing,
tiles, normalisation) is NumPy, in ``refllm/io/image_processing.py``.

Limits, checked before any pixel is decoded: the file's size (``max_bytes``) and its
width x height from the header (``max_pixels``), so that a small file declaring a huge
image (a decompression bomb) is refused, not decoded.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from pathlib import Path

import numpy as np

from refllm.errors import ImageError

MAX_IMAGE_BYTES = 20 * 1024 * 1024  # as OpenAI's API takes
MAX_IMAGE_PIXELS = 40_000_000  # 40 megapixels: past any camera photo, far below what would exhaust memory
FORMATS = ("PNG", "JPEG", "GIF", "WEBP", "BMP")
_DATA_URL = re.compile(r"data:(image/[a-zA-Z0-9.+-]+)?(;[^,;]+)*;base64,(.*)", re.DOTALL)


class ImageSupportMissingError(ImageError):
    """Pillow, which decodes image files, is not installed."""


def pillow():
    """The ``PIL.Image`` module, or a clear error saying how to install it."""
    try:
        from PIL import Image
    except ImportError:
        raise ImageSupportMissingError(
            "reading images needs Pillow: pip install 'refllm[vision]' (or pip install pillow)"
        ) from None
    return Image


def decode_image(data: bytes, max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """The bytes of an image file -> uint8 [H, W, 3] RGB; ImageError for a file that is too large or not an image."""
    Image = pillow()
    if len(data) > max_bytes:
        raise ImageError(f"the image is {len(data)} bytes; at most {max_bytes} are accepted")
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as image:
            width, height = image.size  # from the header: nothing decoded yet
            if width * height > max_pixels:
                raise ImageError(f"the image is {width} x {height} pixels; at most {max_pixels} pixels are accepted")
            image.load()
            return np.array(_rgb(image, Image), dtype=np.uint8)
    except ImageError:
        raise
    except Image.UnidentifiedImageError:
        raise ImageError(f"the data is not an image refllm reads ({', '.join(FORMATS)})") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as error:
        raise ImageError(f"the image cannot be decoded ({type(error).__name__}: {error})") from None


def read_image(path: str | Path, max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """An image file -> uint8 [H, W, 3]; the file's size is checked before it is read."""
    path = Path(path).expanduser()
    try:
        size = path.stat().st_size
        if size > max_bytes:
            raise ImageError(f"{path} is {size} bytes; at most {max_bytes} are accepted")
        data = path.read_bytes()
    except OSError as error:
        raise ImageError(f"{path} cannot be read: {error.strerror or error}") from None
    try:
        return decode_image(data, max_bytes, max_pixels)
    except ImageError as error:
        raise ImageError(f"{path}: {error}") from None


def decode_data_url(url: str, max_bytes: int = MAX_IMAGE_BYTES, max_pixels: int = MAX_IMAGE_PIXELS) -> np.ndarray:
    """``data:image/png;base64,...`` -> uint8 [H, W, 3]. Only data URLs: nothing is ever fetched."""
    match = _DATA_URL.fullmatch(url.strip()) if isinstance(url, str) else None
    if match is None:
        raise ImageError(
            "an image must be given as a data URL (data:image/png;base64,...); other URLs are not fetched"
        )
    encoded = match.group(3)
    if len(encoded) > (max_bytes + 2) // 3 * 4 + 4:  # base64 grows by 4/3: refuse before decoding
        raise ImageError(f"the image is more than {max_bytes} bytes; at most {max_bytes} are accepted")
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("the image's data URL is not valid base64") from None
    return decode_image(data, max_bytes, max_pixels)


def _rgb(image, Image):
    """RGB as transformers' ``convert_to_rgb`` makes it: transparency composited onto white."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return image.convert("RGB")
