"""An independent float64 forward of the vision-language models: the check on refllm's float64 path.

Written apart from ``refllm/nn`` and ``refllm/models``, and on purpose differently: the
patch embedding slides the convolution kernel patch by patch, the tower's attention and
LayerNorm loop over heads and patches, pixel shuffle and pooling gather each image token's
neighbourhood by index, and the text model runs layer by layer over the whole sequence with
an explicit visibility rule per (query, key) pair (causal, or within one image for Gemma 3;
within the sliding window). It reads the checkpoint and config.json itself and shares with
refllm only the parsed ``ModelConfig`` of the text model, and with ``float64_reference.py``
its text-layer pieces (norm, projections, MLP, rotations).

``reference_logits(directory, token_ids, pixels)``: pixels [N, C, S, S] for the prompt's runs of
image tokens, in order -> logits [T, V] float64.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from refllm.config import ModelConfig
from refllm.recipe import NormPlacement, QKNorm
from tests.helpers.float64_reference import _mlp, _norm, _qkv, _read_safetensors, _rotate, text_tensors


def reference_logits(directory: Path, token_ids: list[int], pixels: np.ndarray | None) -> np.ndarray:
    raw = json.loads((directory / "config.json").read_text())
    config = ModelConfig.from_hf(raw)
    tensors = _read_safetensors(directory / "model.safetensors")
    image_token = raw.get("image_token_id", raw.get("image_token_index"))
    x = _embeddings(config, tensors, token_ids, image_token)
    runs = _runs(token_ids, image_token)
    if pixels is not None:
        features = _image_tokens(raw, tensors, pixels.astype(np.float64))  # [N * L, D]
        positions = [p for start, end in runs for p in range(start, end)]
        x[positions] = features
    spans = runs if raw["model_type"] == "gemma3" and pixels is not None else []
    return _text_model(config, text_tensors(tensors), x, spans)


def _runs(tokens: list[int], image_token: int) -> list[tuple[int, int]]:
    runs, start = [], None
    for position, token in enumerate([*tokens, None]):
        if token == image_token and start is None:
            start = position
        elif token != image_token and start is not None:
            runs.append((start, position))
            start = None
    return runs


def _embeddings(config: ModelConfig, tensors: dict, tokens: list[int], image_token: int) -> np.ndarray:
    table = text_tensors(tensors)["model.embed_tokens.weight"]
    return np.stack([table[0 if t == image_token else t] * config.embedding_scale for t in tokens])


# ---- the vision tower and the connector ----------------------------------------------------------------


def _image_tokens(raw: dict, tensors: dict, pixels: np.ndarray) -> np.ndarray:
    vision = raw["vision_config"]
    if raw["model_type"] == "idefics3":
        prefix, connector = "model.vision_model.", "model.connector."
    else:
        prefix = next(p for p in ("vision_tower.vision_model.", "model.vision_tower.vision_model.", "vision_tower.",
                                  "model.vision_tower.") if p + "post_layernorm.weight" in tensors)  # fmt: skip
        connector = next(p for p in ("multi_modal_projector.", "model.multi_modal_projector.")
                         if p + "mm_soft_emb_norm.weight" in tensors)  # fmt: skip
    tokens = []
    for image in pixels:
        patches = _tower(vision, tensors, prefix, image)  # [S, S, Dv]
        if raw["model_type"] == "idefics3":
            tokens += _shuffled_and_projected(patches, raw.get("scale_factor", 2), tensors[connector + "modality_projection.proj.weight"])
        else:
            tokens += _pooled_normed_projected(patches, raw["mm_tokens_per_image"], tensors, connector, vision)
    return np.stack(tokens)


def _tower(vision: dict, w: dict, p: str, image: np.ndarray) -> np.ndarray:
    """One image [C, S*Z, S*Z] -> features [S, S, Dv], a patch at a time."""
    Z = vision["patch_size"]
    side = vision["image_size"] // Z
    kernel, bias = w[p + "embeddings.patch_embedding.weight"], w[p + "embeddings.patch_embedding.bias"]
    table = w[p + "embeddings.position_embedding.weight"]
    x = np.empty((side * side, kernel.shape[0]))
    for i in range(side):
        for j in range(side):
            window = image[:, i * Z : (i + 1) * Z, j * Z : (j + 1) * Z]
            x[i * side + j] = np.tensordot(kernel, window, axes=([1, 2, 3], [0, 1, 2])) + bias + table[i * side + j]
    eps = vision.get("layer_norm_eps", 1e-6)
    heads = vision["num_attention_heads"]
    for layer in range(vision["num_hidden_layers"]):
        q = f"{p}encoder.layers.{layer}."
        h = _layer_norm(x, w[q + "layer_norm1.weight"], w[q + "layer_norm1.bias"], eps)
        x = x + _encoder_attention(h, w, q + "self_attn.", heads)
        h = _layer_norm(x, w[q + "layer_norm2.weight"], w[q + "layer_norm2.bias"], eps)
        up = h @ w[q + "mlp.fc1.weight"].T + w[q + "mlp.fc1.bias"]
        x = x + _gelu_tanh(up) @ w[q + "mlp.fc2.weight"].T + w[q + "mlp.fc2.bias"]
    x = _layer_norm(x, w[p + "post_layernorm.weight"], w[p + "post_layernorm.bias"], eps)
    return x.reshape(side, side, -1)


def _layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> np.ndarray:
    out = np.empty_like(x)
    for row in range(len(x)):
        mean = math.fsum(x[row]) / x.shape[1]
        variance = math.fsum((v - mean) ** 2 for v in x[row]) / x.shape[1]
        out[row] = (x[row] - mean) / math.sqrt(variance + eps) * weight + bias
    return out


def _encoder_attention(h: np.ndarray, w: dict, a: str, heads: int) -> np.ndarray:
    """Every patch attends to every patch, head by head."""
    q, k, v = (h @ w[a + f"{n}.weight"].T + w[a + f"{n}.bias"] for n in ("q_proj", "k_proj", "v_proj"))
    E = h.shape[1] // heads
    out = np.zeros_like(h)
    for head in range(heads):
        cols = slice(head * E, (head + 1) * E)
        for p in range(len(h)):
            scores = k[:, cols] @ q[p, cols] / math.sqrt(E)
            weights = np.exp(scores - scores.max())
            out[p, cols] = weights @ v[:, cols] / weights.sum()
    return out @ w[a + "out_proj.weight"].T + w[a + "out_proj.bias"]


def _gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _shuffled_and_projected(patches: np.ndarray, scale: int, proj: np.ndarray) -> list[np.ndarray]:
    """Idefics3: each scale x scale neighbourhood's features side by side, row by row, then projected."""
    side = patches.shape[0] // scale
    return [
        proj @ np.concatenate([patches[I * scale + dy, J * scale + dx] for dy in range(scale) for dx in range(scale)])
        for I in range(side)
        for J in range(side)
    ]


def _pooled_normed_projected(patches, tokens: int, w: dict, c: str, vision: dict) -> list[np.ndarray]:
    """Gemma 3: the mean of each neighbourhood, RMS-normed with (1 + w), times the stored [Dv, D] matrix."""
    side = math.isqrt(tokens)
    scale = patches.shape[0] // side
    norm, proj = w[c + "mm_soft_emb_norm.weight"], w[c + "mm_input_projection_weight"]
    eps = vision.get("layer_norm_eps", 1e-6)
    out = []
    for I in range(side):
        for J in range(side):
            mean = patches[I * scale : (I + 1) * scale, J * scale : (J + 1) * scale].reshape(-1, patches.shape[2]).mean(0)
            rms = math.sqrt(math.fsum(v * v for v in mean) / len(mean) + eps)
            out.append((mean / rms * (1.0 + norm)) @ proj)
    return out


# ---- the text model over the whole sequence ----------------------------------------------------------------


def _text_model(c: ModelConfig, w: dict, x: np.ndarray, spans: list[tuple[int, int]]) -> np.ndarray:
    """x [T, D] -> logits [T, V]; a query sees the keys before it, and with ``spans`` every key of its image."""
    T = len(x)
    image_of = {p: i for i, (start, end) in enumerate(spans) for p in range(start, end)}
    attention = c.attention
    H, K, E = attention.num_heads, attention.num_kv_heads, attention.head_dim
    sandwich = c.norms.placement is NormPlacement.SANDWICH
    for layer in range(c.num_hidden_layers):
        p = f"model.layers.{layer}."
        window = c.window_for_layer(layer)
        qs, ks, vs = [], [], []
        for t in range(T):
            q, k, v = _qkv(w, p, _norm(x[t], w[p + "input_layernorm.weight"], c), c)
            q, k, v = q.reshape(H, E), k.reshape(K, E), v.reshape(K, E)
            if attention.qk_norm is QKNorm.PER_HEAD:
                q = np.stack([_norm(row, w[p + "self_attn.q_norm.weight"], c) for row in q])
                k = np.stack([_norm(row, w[p + "self_attn.k_norm.weight"], c) for row in k])
            rope = c.rope_for_layer(layer)
            qs.append(_rotate(q, rope, c, t, T))
            ks.append(_rotate(k, rope, c, t, T))
            vs.append(v)
        out = []
        for t in range(T):
            seen = [j for j in range(T) if (j <= t or image_of.get(j, -1) == image_of.get(t, -2))
                    and (window is None or t - j < window)]  # fmt: skip
            attended = np.zeros((H, E))
            for head in range(H):
                g = head // (H // K)
                scores = np.array([attention.scale * (qs[t][head] @ ks[j][g]) for j in seen])
                weights = np.exp(scores - scores.max())
                attended[head] = sum(wt * vs[j][g] for wt, j in zip(weights / weights.sum(), seen))
            out.append(w[p + "self_attn.o_proj.weight"] @ attended.reshape(-1))
        for t in range(T):
            a = out[t]
            if sandwich:
                a = _norm(a, w[p + "post_attention_layernorm.weight"], c)
            x[t] = x[t] + a
            pre_mlp = "pre_feedforward_layernorm" if sandwich else "post_attention_layernorm"
            m = _mlp(w, p + "mlp.", _norm(x[t], w[p + pre_mlp + ".weight"], c), c)
            if sandwich:
                m = _norm(m, w[p + "post_feedforward_layernorm.weight"], c)
            x[t] = x[t] + m
    head = w["model.embed_tokens.weight"] if c.tie_word_embeddings else w["lm_head.weight"]
    logits = np.stack([head @ _norm(row, w["model.norm.weight"], c) for row in x])
    if c.final_logit_softcapping:
        logits = c.final_logit_softcapping * np.tanh(logits / c.final_logit_softcapping)
    return logits

