"""The real published models the real-model tests run, found or pulled into $REFLLM_HOME.

``real_model_path(name)`` returns the GGUF file of catalog model ``name``
(``$REFLLM_HOME/models/<name>/<file>``, default ``~/.cache/refllm``), pulling
it with ``refllm.catalog.pull`` the first time. A test that cannot have the
file (no network on a fresh machine) is skipped, not failed.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from refllm import catalog

SMOLLM2 = "smollm2-135m"  # models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA3 = "gemma3-270m"  # models/gemma3-270m/gemma-3-270m-q4_k_m.gguf
# The conversation the goldens of tests/data/gguf were recorded on (tests/tools/make_gguf_goldens.py)
CHAT_MESSAGES = [{"role": "user", "content": "What is the tallest mountain in the world?"}]


@functools.cache  # a pull checks the file's SHA-256 each time: once per test run is enough
def real_model_path(name: str) -> Path:
    """The GGUF file of catalog model ``name``, pulled if it is not here yet."""
    return catalog.pull(name, progress=False)


def real_model_or_skip(name: str) -> Path:
    """``real_model_path``, skipping the calling test when the model cannot be pulled."""
    try:
        return real_model_path(name)
    except catalog.CatalogError as e:
        pytest.skip(f"{name} is not in $REFLLM_HOME and cannot be pulled: {e}")
