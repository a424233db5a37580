"""Reference outputs from Hugging Face transformers for the vision-language models refllm claims.

``python tests/tools/make_hf_vision_fixtures.py`` regenerates ``tests/data/hf/idefics3`` and
``tests/data/hf/gemma3_vision`` from what is here. For each it builds a tiny randomly initialised model (float32, eager
attention) with transformers, a byte-level BPE tokenizer holding the model's image tokens, a chat
template and an image processor, and saves them as the Hub lays them out. It draws a few images of odd
sizes and aspect ratios (PNG files beside the model) and records, for every prompt of ``SCENARIOS``, what
transformers' processor and model make of them: token ids, pixel values (the processors' PIL backend,
which resamples with Pillow), image features, the spliced input embeddings, the logits at every position
and 16 greedy tokens decoded through transformers' KV cache.

The SmolVLM checkpoint is written in the long-standing layout (``preprocessor_config.json`` beside
``processor_config.json``), Gemma 3's in transformers 5's (the image processor nested in
``processor_config.json``), so refllm reads both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.helpers.paths import HF_DATA

NEW_TOKENS = 16
SEED = 29

IDEFICS3_TEMPLATE = (
    "<|im_start|>{% for message in messages %}{{ message['role'] | capitalize }}"
    "{% if message['content'] is string %}{{ ': ' + message['content'] }}{% else %}"
    "{% if message['content'][0]['type'] == 'image' %}{{ ':' }}{% else %}{{ ': ' }}{% endif %}"
    "{% for part in message['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% elif part['type'] == 'image' %}{{ '<image>' }}{% endif %}{% endfor %}{% endif %}"
    "<end_of_utterance>\n{% endfor %}{% if add_generation_prompt %}{{ 'Assistant:' }}{% endif %}"
)
GEMMA3_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\n' }}{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)
IDEFICS3_SPECIAL = (
    ["<|im_start|>", "<end_of_utterance>", "<fake_token_around_image>", "<image>", "<global-img>"]
    + [f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)]
)
GEMMA3_SPECIAL = ["<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>",
                  "<image_soft_token>"]  # fmt: skip
CORPUS = ["User: what is in this picture? Assistant: a red square on a blue field",
          "describe the image and the crops, then compare the two pictures",
          "here is the original image and here are some crops to help you see better"]  # fmt: skip

# image file -> (height, width, mode): odd sizes and aspect ratios, one grey and one with transparency
IMAGES = {"wide.png": (45, 70, "RGB"), "tall.png": (83, 29, "RGBA"), "small.png": (17, 23, "L")}

# case -> scenario -> (content of the one user message: image file names and texts, image processor options)
SCENARIOS = {
    "idefics3": {
        "two_images": (["wide.png", "what is here, and here?", "small.png"], {}),
        "tall": (["tall.png", "describe"], {}),
        "text_only": (["no picture today, just words"], {}),
    },
    "gemma3_vision": {
        "two_images": (["wide.png", "compare", "tall.png"], {}),
        # transformers' processor puts its own default minimum crop (256) above the saved one: name it
        "pan_and_scan": (["wide.png", "the crops?"], {"do_pan_and_scan": True, "pan_and_scan_min_crop_size": 8}),
        "text_only": (["no picture today, just words"], {}),
    },
}


def _tokenizer(special: list[str], **named):
    """A byte-level BPE tokenizer trained in memory, as transformers' fast tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=special, initial_alphabet=alphabet, show_progress=False)
    backend.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **named)


def build_idefics3():
    """(model, processor): SmolVLM's architecture, tiny. A 9 x 9 patch grid shuffled by 3 gives 9 image tokens."""
    import torch
    import transformers
    from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

    tokenizer = _tokenizer(IDEFICS3_SPECIAL, bos_token="<|im_start|>", eos_token="<end_of_utterance>")
    text = transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10_000.0,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=0,
    )  # fmt: skip
    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, image_size=36,
                  patch_size=4, layer_norm_eps=1e-6)  # fmt: skip
    config = transformers.Idefics3Config(
        text_config=text.to_dict(), vision_config=vision, scale_factor=3,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), tie_word_embeddings=False,
    )  # fmt: skip
    image_processor = Idefics3ImageProcessorPil(size={"longest_edge": 108}, max_image_size={"longest_edge": 36})
    processor = transformers.Idefics3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_len=9, chat_template=IDEFICS3_TEMPLATE
    )
    torch.manual_seed(SEED)
    model = transformers.Idefics3ForConditionalGeneration(config)
    return _randomised(model), processor


def build_gemma3():
    """(model, processor): Gemma 3 with its SigLIP tower, tiny. A 12 x 12 patch grid pooled by 3 gives 16 image
    tokens, more than the sliding window (8), so the window cuts into an image's bidirectional attention."""
    import torch
    import transformers
    from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil

    tokenizer = _tokenizer(
        GEMMA3_SPECIAL, bos_token="<bos>", eos_token="<eos>",
        extra_special_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                              "image_token": "<image_soft_token>"},
    )  # fmt: skip
    text = dict(
        vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], query_pre_attn_scalar=24,
        rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=0,
    )  # fmt: skip
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, image_size=36, patch_size=3, layer_norm_eps=1e-6, vision_use_head=False)  # fmt: skip
    config = transformers.Gemma3Config(
        text_config=text, vision_config=vision, mm_tokens_per_image=16,
        boi_token_index=tokenizer.convert_tokens_to_ids("<start_of_image>"),
        eoi_token_index=tokenizer.convert_tokens_to_ids("<end_of_image>"),
        image_token_index=tokenizer.convert_tokens_to_ids("<image_soft_token>"),
    )  # fmt: skip
    image_processor = Gemma3ImageProcessorPil(
        size={"height": 36, "width": 36}, resample=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        pan_and_scan_min_crop_size=8, pan_and_scan_max_num_crops=4, pan_and_scan_min_ratio_to_activate=1.2,
    )  # fmt: skip
    processor = transformers.Gemma3Processor(
        image_processor=image_processor, tokenizer=tokenizer, image_seq_length=16, chat_template=GEMMA3_TEMPLATE
    )
    torch.manual_seed(SEED)
    model = transformers.Gemma3ForConditionalGeneration(config)
    return _randomised(model), processor


BUILDERS = {"idefics3": build_idefics3, "gemma3_vision": build_gemma3}


def _randomised(model):
    """Every weight drawn afresh, large enough that each mechanism moves the logits: matrices and embeddings
    N(0, 0.1), norm weights and biases around their initial values (Gemma 3's projector starts at zero)."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim >= 2 or "embedding" in name:
                param.normal_(0.0, 0.1)
            else:
                param.add_(torch.randn_like(param) * 0.1)
        # the vision tower's inputs are pixels of size 1: a larger patch projection keeps its features large
        for name, param in model.named_parameters():
            if "patch_embedding.weight" in name or "mm_input_projection_weight" in name:
                param.normal_(0.0, 0.3)
            # a tied LM head scores the token just fed highest unless its embedding (scaled by sqrt(D) in Gemma)
            # is small beside what the layers add: greedy decoding would repeat one token
            if name.endswith("language_model.embed_tokens.weight"):
                param.normal_(0.0, 0.03)
    model.config._attn_implementation = "eager"
    model.set_attn_implementation("eager")
    return model.eval()


def messages(content: list[str]) -> list[dict]:
    """One user message whose ``.png`` entries are images and the rest text."""
    parts = [{"type": "image"} if c.endswith(".png") else {"type": "text", "text": c} for c in content]
    return [{"role": "user", "content": parts}]


def hf_reference(case: str, model, processor, directory: Path, content: list[str], options: dict) -> dict:
    """What transformers' processor and model make of one prompt."""
    import torch
    from PIL import Image

    text = processor.apply_chat_template(messages(content), add_generation_prompt=True, tokenize=False)
    images = [Image.open(directory / "images" / c) for c in content if c.endswith(".png")]
    inputs = processor(text=[text], images=[images] if images else None, return_tensors="pt", **options)
    captured = {}

    def capture(module, args, kwargs):
        captured["embeddings"] = kwargs["inputs_embeds"][0].detach().numpy().copy()

    text_model = model.model.text_model if case == "idefics3" else model.model.language_model
    hook = text_model.register_forward_pre_hook(capture, with_kwargs=True)
    first = {k: v for k, v in inputs.items() if k != "attention_mask"}
    with torch.no_grad():
        logits = model(**first).logits[0].numpy()
        hook.remove()
        out = {"text": np.array(text), "input_ids": inputs["input_ids"][0].numpy(), "logits": logits,
               "embeddings": captured["embeddings"]}  # fmt: skip
        if images:
            pixels = inputs["pixel_values"]
            if case == "idefics3":
                features = model.model.get_image_features(pixels, inputs["pixel_attention_mask"]).pooler_output
                out["pixel_values"] = pixels[0].numpy()
                out["pixel_attention_mask"] = inputs["pixel_attention_mask"][0].numpy()
                out["image_features"] = torch.cat(features).numpy()
            else:
                out["pixel_values"] = pixels.numpy()
                out["image_features"] = model.model.get_image_features(pixels).pooler_output.reshape(
                    -1, model.config.text_config.hidden_size
                ).numpy()
            out["tiles_per_image"] = np.array(_tiles_per_image(case, processor, images, options))
        out["greedy"] = np.array(_greedy(model, first))
    return out


def _tiles_per_image(case: str, processor, images, options: dict) -> list[int]:
    """How many pixel batches (tiles and global image, or original and crops) each image became."""
    counts = []
    for image in images:
        single = processor.image_processor(images=[[image]] if case == "idefics3" else [image], **options)
        pixels = single["pixel_values"]
        counts.append(len(pixels[0]) if case == "idefics3" else len(pixels))
    return counts


def _greedy(model, first: dict) -> list[int]:
    """NEW_TOKENS greedy tokens: the prompt (with its images) once, then one token at a time through the cache."""
    import inspect

    import torch
    from transformers import DynamicCache

    cache_kwarg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    cache = DynamicCache(config=model.config.get_text_config())
    out = model(**first, use_cache=True, **{cache_kwarg: cache})
    tokens = []
    for _ in range(NEW_TOKENS):
        token = int(out.logits[0, -1].argmax())
        tokens.append(token)
        out = model(input_ids=torch.tensor([[token]]), use_cache=True, **{cache_kwarg: cache})
    return tokens


def reference(case: str, scenario: str) -> dict:
    """What ``tests/data/hf/<case>/reference.npz`` stores for one scenario, by key."""
    stored = np.load(HF_DATA / case / "reference.npz")
    return {key.split(".", 1)[1]: stored[key] for key in stored if key.startswith(scenario + ".")}


def images_of(ref: dict) -> list[np.ndarray]:
    """The stored pixel values, split into one batch per image."""
    if "pixel_values" not in ref:
        return []
    return np.split(ref["pixel_values"], np.cumsum(ref["tiles_per_image"])[:-1])
