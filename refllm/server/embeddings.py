"""Embeddings for the server: one input at a time on a worker thread, requests taking turns input by input.

A request of many long inputs holds the model for one input at a time, then lets the
next waiting request have a turn (``anyio.Lock`` hands itself on in arrival order), so a
one-word request behind it waits for one input, not for all of them; and a request whose
client has gone is cancelled between inputs.
"""

from __future__ import annotations

import base64

import anyio
import numpy as np

from refllm.models.decoder import DecoderModel
from refllm.runtime.embedding import pooled_hidden_states


class Embedder:
    def __init__(self, model: DecoderModel):
        self.model = model
        self._turn = anyio.Lock()  # one forward pass at a time, handed on first come, first served

    async def embed(self, inputs: list[list[int]]) -> list[np.ndarray]:
        """Each input's mean-pooled final hidden states, L2-normalised: [D] float32 each."""
        vectors = []
        for ids in inputs:
            async with self._turn:  # a cancellation waits here, or for the one input on the thread
                vectors.append(await anyio.to_thread.run_sync(self._one, ids))
        return vectors

    def _one(self, ids: list[int]) -> np.ndarray:
        pooled = pooled_hidden_states(self.model, ids)  # [D]
        return (pooled / max(np.linalg.norm(pooled), 1e-12)).astype(np.float32)


def encode(vector: np.ndarray, encoding: str) -> list[float] | str:
    """An embedding as JSON numbers, or as base64 of its little-endian float32 bytes."""
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
