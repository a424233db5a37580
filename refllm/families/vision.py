"""Vision-language checkpoints: the image half of their config.json.

Two families, each a SigLIP vision tower in front of a text model:

    idefics3  SmolVLM (Idefics3ForConditionalGeneration): a Llama-family text model under
              text_config; the tower's patch features pixel-shuffled by ``scale_factor`` and
              projected to the text width
    gemma3    Gemma 3 with vision (Gemma3ForConditionalGeneration): Gemma 3's text model;
              the tower's features average-pooled to ``mm_tokens_per_image`` tokens, normed
              and projected; the tokens of one image attend to each other

The text model's fields come from ``text_config`` through its family's reader (``read_idefics3``
here, ``read_gemma3`` in ``gemma.py``); ``read_multimodal`` reads the rest, and decides once what the
model classes run: the connector (``ImageConnector``), whether an image's tokens see each other, and
where the checkpoint keeps the tower and the connector. The registry knows idefics3 by this module's
``ARCHITECTURES``; its text model is Llama's recipe and tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from refllm.config_checks import MAX_LAYERS, check_number, check_token_id
from refllm.errors import ConfigError
from refllm.families.family import Architecture
from refllm.families.keys import HFKeys
from refllm.families.llama import layer_tensors, read_llama

VISION_ACTIVATIONS = ("gelu_pytorch_tanh",)
MULTIMODAL_TYPES = ("idefics3", "gemma3")
IDEFICS3_IMAGE_TOKEN_ID = 128_257  # transformers' Idefics3Config defaults
IDEFICS3_SCALE_FACTOR = 2
GEMMA3_IMAGE_TOKEN_ID = 262_144  # transformers' Gemma3Config defaults
GEMMA3_TOKENS_PER_IMAGE = 256


@dataclass(frozen=True)
class VisionConfig:
    """A SigLIP vision tower. Dv = hidden_size, Z = patch_size, S = image_size // Z patches per side."""

    hidden_size: int  # Dv
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int  # pixels per side of the images it was trained on
    patch_size: int  # Z
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def grid_side(self) -> int:
        """S: patches per side of a full image, and of the position-embedding grid."""
        return self.image_size // self.patch_size

    @property
    def num_parameters(self) -> int:
        D, F, Z = self.hidden_size, self.intermediate_size, self.patch_size
        per_layer = 4 * (D * D + D) + 2 * D * F + F + D + 4 * D  # q/k/v/out, fc1/fc2, two LayerNorms
        return D * self.num_channels * Z * Z + D + self.grid_side**2 * D + self.num_hidden_layers * per_layer + 2 * D


class ImageConnector(Enum):
    """How an s x s neighbourhood of patch features becomes one image token (refllm/models/connector.py)."""

    PIXEL_SHUFFLE = "pixel-shuffled"  # stacked side by side, s*s*Dv wide, then a linear projection: idefics3
    POOLED = "pooled"  # averaged, RMS-normed (the (1 + w) form), then x @ W [Dv, D]: gemma3


# Where each family's checkpoints keep the tower and the connector: the Hub's files, then what
# transformers' model classes and save_pretrained (5.x) name them.
TOWER_PREFIXES = {"idefics3": ("model.vision_model.",),
                  "gemma3": ("vision_tower.vision_model.", "model.vision_tower.vision_model.", "vision_tower.",
                             "model.vision_tower.")}  # fmt: skip
CONNECTOR_PREFIXES = {"idefics3": ("model.connector.",),
                      "gemma3": ("multi_modal_projector.", "model.multi_modal_projector.")}  # fmt: skip


@dataclass(frozen=True)
class MultimodalConfig:
    """How a vision-language checkpoint turns images into text-model tokens."""

    model_type: str  # "idefics3" or "gemma3"
    vision: VisionConfig
    image_token_id: int  # the placeholder token each image feature replaces
    scale: int  # patches merged per side into one image token, by the connector
    text_hidden_size: int
    connector: ImageConnector
    bidirectional_image_attention: bool  # the tokens of one image attend to each other, before and after
    tower_prefixes: tuple[str, ...]  # where the checkpoint may keep the tower's tensors, first the Hub's
    connector_prefixes: tuple[str, ...]  # and the connector's

    @property
    def tokens_per_image(self) -> int:
        """Image tokens per tile (SmolVLM) or per crop (Gemma 3): (S / scale)^2."""
        return (self.vision.grid_side // self.scale) ** 2

    @property
    def num_parameters(self) -> int:
        """The tower's and the connector's weights."""
        Dv = self.vision.hidden_size
        pooled = self.connector is ImageConnector.POOLED
        connector = Dv * (self.text_hidden_size + 1) if pooled else Dv * self.scale**2 * self.text_hidden_size
        return self.vision.num_parameters + connector


def read_idefics3(keys: HFKeys) -> dict[str, Any]:
    """SmolVLM's text model is a Llama under text_config."""
    text = _sub_config(keys, "text_config")
    model_type = text.get("model_type", "llama")
    if model_type != "llama":
        raise ConfigError(f"an idefics3 checkpoint's text_config must be a llama model; got {model_type!r:.40}")
    fields = read_llama(HFKeys(text | {"model_type": model_type}))
    if keys.get("tie_word_embeddings") is not None:  # the wrapper's word wins, as transformers reads it
        fields["tie_word_embeddings"] = bool(keys.get("tie_word_embeddings"))
    return fields


def read_multimodal(config: dict[str, Any], text_hidden_size: int) -> MultimodalConfig | None:
    """The image half of a config.json, or None for a text-only model."""
    model_type = config.get("model_type")
    if model_type not in MULTIMODAL_TYPES:
        return None
    keys = HFKeys(config)
    vision = _vision_config(_sub_config(keys, "vision_config"))
    if model_type == "idefics3":
        scale = keys.size("scale_factor", IDEFICS3_SCALE_FACTOR)
        image_token = keys.get("image_token_id", IDEFICS3_IMAGE_TOKEN_ID)
    else:
        tokens = keys.size("mm_tokens_per_image", GEMMA3_TOKENS_PER_IMAGE)
        side = round(tokens**0.5)
        if side * side != tokens or vision.grid_side % side:
            raise ConfigError(
                f"mm_tokens_per_image {tokens} is not a square whose side divides the {vision.grid_side}"
                " patches per side of the vision tower"
            )
        scale = vision.grid_side // side
        image_token = keys.get("image_token_index", keys.get("image_token_id", GEMMA3_IMAGE_TOKEN_ID))
    if vision.grid_side % scale:
        raise ConfigError(f"scale_factor {scale} does not divide the {vision.grid_side} patches per side")
    if check_token_id(image_token, "image_token_id") is None:
        raise ConfigError("config.json names no image token")
    connector = ImageConnector.PIXEL_SHUFFLE if model_type == "idefics3" else ImageConnector.POOLED
    return MultimodalConfig(
        model_type, vision, image_token, scale, text_hidden_size, connector,
        bidirectional_image_attention=model_type == "gemma3",  # Gemma 3's images, inside the causal mask
        tower_prefixes=TOWER_PREFIXES[model_type], connector_prefixes=CONNECTOR_PREFIXES[model_type],
    )


def _vision_config(vision: dict[str, Any]) -> VisionConfig:
    keys = HFKeys(vision | {"model_type": vision.get("model_type", "vision_config")})
    hidden, heads = keys.size("hidden_size"), keys.size("num_attention_heads")
    image_size, patch_size = keys.size("image_size"), keys.size("patch_size")
    if hidden % heads:
        raise ConfigError(f"vision_config's hidden_size {hidden} does not split into {heads} heads")
    if image_size < patch_size:
        raise ConfigError(f"vision_config's image_size {image_size} is smaller than its patch_size {patch_size}")
    act = keys.get("hidden_act", "gelu_pytorch_tanh")
    if act not in VISION_ACTIVATIONS:
        raise ConfigError(f"vision_config's hidden_act {act!r} is not one of {', '.join(VISION_ACTIVATIONS)}")
    return VisionConfig(
        hidden_size=hidden,
        intermediate_size=keys.size("intermediate_size"),
        num_hidden_layers=keys.size("num_hidden_layers", high=MAX_LAYERS),
        num_attention_heads=heads,
        image_size=image_size,
        patch_size=patch_size,
        num_channels=keys.size("num_channels", 3, high=4),
        layer_norm_eps=check_number(keys.get("layer_norm_eps", 1e-6), "layer_norm_eps", positive=True),
        hidden_act=act,
    )


def _sub_config(keys: HFKeys, name: str) -> dict[str, Any]:
    value = keys.get(name, {})
    if not isinstance(value, dict):
        raise ConfigError(f"config.json's {name} must be an object; got {value!r:.60}")
    return value


# No tiny config of its own: the kit draws vision-language models in refllm/testing/vision.py.
ARCHITECTURES = (Architecture("idefics3", read_idefics3, layer_tensors, "Idefics3ForConditionalGeneration"),)
