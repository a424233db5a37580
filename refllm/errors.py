"""Every refusal refllm makes is one of these: a ValueError or KeyError subclass.

They are raised at the public boundary, before anything is changed, and their
message names the bad value.
"""

from __future__ import annotations


class RefllmKeyError(KeyError):
    """A KeyError whose message prints plainly (KeyError quotes its argument)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidInputError(ValueError):
    """Input of the wrong type, rank, dtype or shape."""


class TokenOutOfRangeError(InvalidInputError):
    """A token id outside [0, vocab_size)."""


class PositionError(InvalidInputError):
    """A position that does not continue the sequence held in the cache."""


class ContextLengthError(InvalidInputError):
    """A sequence longer than the model's context length."""


class UnknownSequenceError(RefllmKeyError):
    """A sequence (cache) id that is not live."""


class CacheCapacityError(ValueError):
    """The KV cache cannot hold the tokens asked for; nothing was written."""


class ConfigError(ValueError):
    """A config.json (or GGUF metadata) that refllm cannot build a model from."""


class WeightError(ValueError):
    """A checkpoint whose tensors disagree with its config."""


class MissingTensorError(RefllmKeyError):
    """A tensor the config calls for is not in the checkpoint."""


class ImageError(InvalidInputError):
    """An image that cannot be used: undecodable, too large, of the wrong shape, or not matching the prompt's
    image tokens."""
