"""JSON read from model directories and file headers, refused by name when it is not what it should be.

``json`` lets duplicate keys through (the last one wins) and raises RecursionError for
arrays nested thousands deep; a checkpoint's metadata needs neither, so both are refusals.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def parse_json_object(text: str | bytes, where: str, error: type[ValueError]) -> dict[str, Any]:
    """The JSON object in ``text``, or ``error`` naming ``where``: not JSON, nested too deep, a key twice, not an object."""

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        keys = [key for key, _ in pairs]
        if len(set(keys)) != len(keys):
            twice = next(key for key in keys if keys.count(key) > 1)
            raise error(f"{where} gives the key {twice!r:.80} twice")
        return dict(pairs)

    try:
        value = json.loads(text, object_pairs_hook=unique_keys)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise error(f"{where} is not valid JSON: {exc}") from None
    except RecursionError:
        raise error(f"{where} nests its JSON too deep") from None
    if not isinstance(value, dict):
        raise error(f"{where} must hold a JSON object; got {type(value).__name__}")
    return value


def read_json_object(path: Path, error: type[ValueError]) -> dict[str, Any]:
    """The JSON object in the file ``path``, refused as ``parse_json_object`` refuses it (and when unreadable)."""
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise error(f"{path} cannot be read: {exc}") from None
    return parse_json_object(text, str(path), error)
