"""An independent float64 forward pass: the check on refllm's float64 spec path.

Written apart from ``refllm/nn``, ``refllm/models`` and ``refllm/io``, on
purpose differently: it reads the checkpoint's bytes itself, runs one token at a
time, loops over heads and keys, rotates query/key pairs as complex numbers,
and computes the RoPE frequencies anew from transformers' definitions. DeepSeek's
latent attention decompresses every cached latent per head and rotates its
interleaved RoPE pairs as they come, as do Cohere's q and k; DeepSeek's router
sorts Python lists. It
shares only the parsed ``ModelConfig`` (hyper-parameters, which the parity
tests check against transformers).

``reference_logits(directory, token_ids, chunks)`` runs the tokens in the
given chunks, as a cached backend would receive them (dynamic NTK RoPE
depends on how long the sequence is when each chunk arrives), and returns the
logits of every position, [T, V] float64.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from refllm.config import ModelConfig, RopeParameters
from refllm.moe_parameters import GroupedExperts
from refllm.recipe import LatentAttention, NormKind, NormPlacement, QKNorm

# Model types whose checkpoints pair RoPE dims (2i, 2i + 1), as their transformers code rotates them
INTERLEAVED_ROPE = ("cohere",)


def reference_logits(directory: Path, token_ids: list[int], chunks: list[int]) -> np.ndarray:
    """token_ids: T ids; chunks: sizes adding up to T -> logits [T, V] float64."""
    assert sum(chunks) == len(token_ids)
    config = ModelConfig.from_hf(json.loads((directory / "config.json").read_text()))
    tensors = text_tensors(_read_safetensors(directory / "model.safetensors"))
    cache: list[tuple[list, list]] = [([], []) for _ in range(config.num_hidden_layers)]
    rows, position = [], 0
    for size in chunks:
        seq_len = position + size  # what the sequence is long when this chunk arrives
        for token in token_ids[position:seq_len]:
            rows.append(_one_token(config, tensors, cache, token, position, seq_len))
            position += 1
    return np.stack(rows)


def _read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as float64: u64 header length, JSON header, raw little-endian data."""
    raw = path.read_bytes()
    header_length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + header_length])
    data = raw[8 + header_length :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        chunk = data[begin:end]
        if info["dtype"] == "BF16":  # the top 16 bits of a float32
            values = (np.frombuffer(chunk, "<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            values = np.frombuffer(chunk, {"F32": "<f4", "F16": "<f2", "F64": "<f8"}[info["dtype"]])
        tensors[name] = values.astype(np.float64).reshape(info["shape"])
    return tensors


# A vision-language checkpoint's text model, under the names its wrapper gives it -> the text model's names
TEXT_PREFIXES = {"model.text_model.": "model.", "language_model.model.": "model.", "model.language_model.": "model.",
                 "language_model.lm_head.": "lm_head."}  # fmt: skip


def text_tensors(tensors: dict) -> dict:
    """The tensors of the text model, by its own names (a text checkpoint's pass through unchanged)."""
    out = {}
    for name, value in tensors.items():
        for prefix, plain in TEXT_PREFIXES.items():
            if name.startswith(prefix):
                name = plain + name[len(prefix) :]
        out[name] = value
    return out


def _one_token(config: ModelConfig, w: dict, cache: list, token: int, position: int, seq_len: int) -> np.ndarray:
    c, a = config, config.attention
    placement = c.norms.placement
    residual = 1.0 if c.residual_scale is None else c.residual_scale
    x = w["model.embed_tokens.weight"][token] * c.embedding_scale
    for layer in range(c.num_hidden_layers):
        p = f"model.layers.{layer}."
        # OLMo 2 feeds the raw residual stream to attention and the MLP; the others a normed copy.
        h = x if placement is NormPlacement.POST else _norm(x, w[p + "input_layernorm.weight"], c)
        if isinstance(a, LatentAttention):
            attended = _latent_attend(w, p, h, c, c.rope_for_layer(layer), cache[layer][0], position, seq_len)
        else:
            H, K, E = a.num_heads, a.num_kv_heads, a.head_dim
            q, k, v = _qkv(w, p, h, c)
            if a.qk_norm is QKNorm.WHOLE:  # one RMS over all heads' dims together
                q = _norm(q, w[p + "self_attn.q_norm.weight"], c)
                k = _norm(k, w[p + "self_attn.k_norm.weight"], c)
            q, k, v = q.reshape(H, E), k.reshape(K, E), v.reshape(K, E)
            if a.qk_norm is QKNorm.PER_HEAD:  # a weight [E] all heads share, or (Cohere) a row of [H, E] per head
                q_norm, k_norm = w[p + "self_attn.q_norm.weight"], w[p + "self_attn.k_norm.weight"]
                q = np.stack([_norm(row, q_norm[i] if q_norm.ndim == 2 else q_norm, c) for i, row in enumerate(q)])
                k = np.stack([_norm(row, k_norm[i] if k_norm.ndim == 2 else k_norm, c) for i, row in enumerate(k)])
            if layer not in c.nope_layers:  # a NoPE layer attends with unrotated queries and keys
                rope = c.rope_for_layer(layer)
                rotate = _rotate_pairs if c.model_type in INTERLEAVED_ROPE else _rotate
                q, k = rotate(q, rope, c, position, seq_len), rotate(k, rope, c, position, seq_len)
            keys, values = cache[layer]
            keys.append(k)
            values.append(v)
            window = c.window_for_layer(layer)
            attended = _attend(q, keys, values, position, window, c, w.get(p + "self_attn.sinks"))
        out = w[p + "self_attn.o_proj.weight"] @ attended.reshape(-1) + w.get(p + "self_attn.o_proj.bias", 0.0)
        if placement in (NormPlacement.SANDWICH, NormPlacement.POST):
            out = _norm(out, w[p + "post_attention_layernorm.weight"], c)
        if placement is NormPlacement.PARALLEL:  # Cohere: the MLP reads the normed x attention read
            x = x + out + _mlp(w, p + "mlp.", h, c)
            continue
        x = x + out * residual  # Granite's residual_multiplier (1 elsewhere)
        if placement is NormPlacement.POST:
            h = x
        else:
            pre_mlp = "pre_feedforward_layernorm" if placement is NormPlacement.SANDWICH else "post_attention_layernorm"
            h = _norm(x, w[p + pre_mlp + ".weight"], c)
        if not c.is_sparse(layer):
            m = _mlp(w, p + "mlp.", h, c)
        elif isinstance(c.experts, GroupedExperts):
            m = _routed_experts(w, p + "mlp.", h, c)
        else:
            m = _experts(w, p, h, c)
        if placement in (NormPlacement.SANDWICH, NormPlacement.POST):
            m = _norm(m, w[p + "post_feedforward_layernorm.weight"], c)
        x = x + m * residual
    x = _norm(x, w["model.norm.weight"], c)
    head = w["model.embed_tokens.weight"] if c.tie_word_embeddings else w["lm_head.weight"]
    logits = head @ x
    if c.logit_scale is not None:  # Granite: 1 / logits_scaling
        logits = logits * c.logit_scale
    if c.final_logit_softcapping:  # squash into (-cap, cap)
        logits = np.array([c.final_logit_softcapping * math.tanh(z / c.final_logit_softcapping) for z in logits])
    return logits


def _norm(x: np.ndarray, weight: np.ndarray, c: ModelConfig, eps: float | None = None) -> np.ndarray:
    """The model's norm: RMSNorm (eps given: latent attention's, always RMS), or Cohere's LayerNorm."""
    if c.norms.kind is NormKind.LAYER and eps is None:
        centred = x - sum(x) / x.size
        return centred / math.sqrt(sum(centred * centred) / x.size + c.norms.eps) * weight
    rms = np.linalg.norm(x) / math.sqrt(x.size)
    return x / math.sqrt(rms * rms + (c.norms.eps if eps is None else eps)) * (c.norms.weight_offset + weight)


def _qkv(w: dict, p: str, h: np.ndarray, c: ModelConfig) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    a = c.attention
    q_rows, kv_rows = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    if p + "self_attn.qkv_proj.weight" in w:  # Phi-3 stores [q | k | v] as one projection
        qkv = w[p + "self_attn.qkv_proj.weight"] @ h
        return qkv[:q_rows], qkv[q_rows : q_rows + kv_rows], qkv[q_rows + kv_rows :]
    return tuple(
        w[p + f"self_attn.{name}.weight"] @ h + w.get(p + f"self_attn.{name}.bias", 0.0)
        for name in ("q_proj", "k_proj", "v_proj")
    )


def _mlp(w: dict, p: str, h: np.ndarray, c: ModelConfig) -> np.ndarray:
    """The gated MLP whose tensors are named ``p`` + gate_proj..., p ending in "mlp." or an expert's prefix."""
    if p + "gate_up_proj.weight" in w:  # Phi-3: [gate | up]
        gate_up = w[p + "gate_up_proj.weight"] @ h
        gate, up = np.split(gate_up, 2)
    else:
        gate = w[p + "gate_proj.weight"] @ h + w.get(p + "gate_proj.bias", 0.0)
        up = w[p + "up_proj.weight"] @ h + w.get(p + "up_proj.bias", 0.0)
    return w[p + "down_proj.weight"] @ (_activate(gate, c) * up) + w.get(p + "down_proj.bias", 0.0)


def _activate(gate: np.ndarray, c: ModelConfig) -> np.ndarray:
    if c.mlp.activation == "silu":
        return gate / (1.0 + np.exp(-gate))
    return 0.5 * gate * (1.0 + np.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))  # gelu_pytorch_tanh


def _routed_experts(w: dict, p: str, h: np.ndarray, c: ModelConfig) -> np.ndarray:
    """DeepSeek's sparse MLP for one token, its routing spelled out with Python sorts."""
    moe = c.experts
    scores = 1.0 / (1.0 + np.exp(-(w[p + "gate.weight"] @ h)))
    choice = scores + w[p + "gate.e_score_correction_bias"]
    size = moe.num_experts // moe.num_groups
    group_score = [sum(sorted(choice[g * size : (g + 1) * size])[-2:]) for g in range(moe.num_groups)]
    groups = sorted(range(moe.num_groups), key=lambda g: (-group_score[g], g))[: moe.groups_per_token]
    candidates = [e for e in range(moe.num_experts) if e // size in groups]
    chosen = sorted(candidates, key=lambda e: (-choice[e], e))[: moe.experts_per_token]
    total = sum(scores[e] for e in chosen) + 1e-20 if moe.norm_topk_prob else 1.0
    out = sum(scores[e] / total * moe.routed_scaling_factor * _mlp(w, f"{p}experts.{e}.", h, c) for e in chosen)
    if p + "shared_experts.gate_proj.weight" in w:
        out = out + _mlp(w, p + "shared_experts.", h, c)
    return out


def _latent_attend(
    w: dict, p: str, h: np.ndarray, c: ModelConfig, rope: RopeParameters, latents: list, position: int, seq_len: int
) -> np.ndarray:
    """DeepSeek's latent attention for one token: [H, U]. ``latents`` keeps (normed kv, rotated key) per token,
    and every key and value is decompressed again, per head, from the checkpoint's kv_b_proj rows."""
    a = p + "self_attn."
    mla = c.attention
    H, N, C = mla.num_heads, mla.qk_nope_head_dim, mla.kv_lora_rank
    if mla.q_lora_rank is None:
        q = w[a + "q_proj.weight"] @ h
    else:
        low = _norm(w[a + "q_a_proj.weight"] @ h + w.get(a + "q_a_proj.bias", 0.0), w[a + "q_a_layernorm.weight"], c, 1e-6)
        q = w[a + "q_b_proj.weight"] @ low
    q = q.reshape(H, N + mla.qk_rope_head_dim)
    compressed = w[a + "kv_a_proj_with_mqa.weight"] @ h + w.get(a + "kv_a_proj_with_mqa.bias", 0.0)
    rotate = _rotate_pairs if mla.rope_interleave else _rotate
    latents.append(
        (_norm(compressed[:C], w[a + "kv_a_layernorm.weight"], c, 1e-6), rotate(compressed[None, C:], rope, c, position, seq_len)[0])
    )
    q_rope = rotate(q[:, N:], rope, c, position, seq_len)
    kv_b = w[a + "kv_b_proj.weight"].reshape(H, -1, C)  # per head: N key rows, then U value rows
    scale = (N + mla.qk_rope_head_dim) ** -0.5
    if rope.rope_type != "default" and rope.mscale_all_dim and rope.factor > 1:
        scale *= (0.1 * rope.mscale_all_dim * math.log(rope.factor) + 1.0) ** 2
    out = np.zeros((H, kv_b.shape[1] - N))
    for head in range(H):
        scores = np.array([scale * (q[head, :N] @ (kv_b[head, :N] @ kv) + q_rope[head] @ k_rope) for kv, k_rope in latents])
        weights = np.exp(scores - scores.max())
        weights /= weights.sum()
        for weight, (kv, _) in zip(weights, latents):
            out[head] += weight * (kv_b[head, N:] @ kv)
    return out


def _experts(w: dict, p: str, h: np.ndarray, c: ModelConfig) -> np.ndarray:
    """One token through a sparse layer, read straight from the checkpoint's names (per expert, or gpt-oss fused)."""
    moe = c.experts
    fused = p + "mlp.experts.gate_up_proj" in w
    if fused:  # gpt-oss: [X, D, 2M] with gate and up columns interleaved, [X, M, D] down, biases throughout
        scores = w[p + "mlp.router.weight"] @ h + w[p + "mlp.router.bias"]
    else:
        router = p + ("block_sparse_moe.gate.weight" if p + "block_sparse_moe.gate.weight" in w else "mlp.gate.weight")
        scores = w[router] @ h
    # Python's sort is stable: a tie goes to the lower expert id
    ranked = sorted(range(len(scores)), key=lambda e: -scores[e])[: moe.experts_per_token]
    if moe.routing == "topk_then_softmax":
        exps = [math.exp(scores[e] - scores[ranked[0]]) for e in ranked]
        chosen = [(e, x / sum(exps)) for e, x in zip(ranked, exps)]
    else:
        exps = np.exp(scores - scores.max())
        chosen = [(e, exps[e] / exps.sum()) for e in ranked]
        if moe.norm_topk_prob:
            total = sum(weight for _, weight in chosen)
            chosen = [(e, weight / total) for e, weight in chosen]
    out = np.zeros_like(h)
    for e, weight in chosen:
        if fused:
            gate_up = h @ w[p + "mlp.experts.gate_up_proj"][e] + w[p + "mlp.experts.gate_up_proj_bias"][e]
            gate = np.minimum(gate_up[0::2], moe.swiglu_limit)
            up = np.clip(gate_up[1::2], -moe.swiglu_limit, moe.swiglu_limit)
            hidden = (up + 1) * gate / (1 + np.exp(-moe.swiglu_alpha * gate))
            y = hidden @ w[p + "mlp.experts.down_proj"][e] + w[p + "mlp.experts.down_proj_bias"][e]
        else:
            names = [f"{p}block_sparse_moe.experts.{e}.{n}.weight" for n in ("w1", "w3", "w2")]
            if names[0] not in w:
                names = [f"{p}mlp.experts.{e}.{n}.weight" for n in ("gate_proj", "up_proj", "down_proj")]
            gate_w, up_w, down_w = (w[name] for name in names)
            y = down_w @ (_activate(gate_w @ h, c) * (up_w @ h))
        out += weight * y
    return out


def _attend(
    q: np.ndarray, keys: list, values: list, position: int, window: int | None, c: ModelConfig, sinks=None
) -> np.ndarray:
    """q [H, E] over the keys of positions 0 .. position (within the window) -> [H, E].

    sinks: [H] logits that join each head's softmax denominator and weigh no value (gpt-oss)."""
    group = c.attention.num_heads // c.attention.num_kv_heads
    first = 0 if window is None else max(0, position - window + 1)
    out = np.zeros_like(q)
    for head in range(q.shape[0]):
        kv_head = head // group
        scores = np.array([c.attention.scale * (q[head] @ keys[j][kv_head]) for j in range(first, position + 1)])
        if c.attention.softcap:
            scores = c.attention.softcap * np.tanh(scores / c.attention.softcap)
        top = scores.max() if sinks is None else max(scores.max(), sinks[head])
        weights = np.exp(scores - top)
        weights /= weights.sum() + (0.0 if sinks is None else math.exp(sinks[head] - top))
        for weight, j in zip(weights, range(first, position + 1)):
            out[head] += weight * values[j][kv_head]
    return out


def _rotate(x: np.ndarray, rope: RopeParameters, c: ModelConfig, position: int, seq_len: int) -> np.ndarray:
    """Rotate dims (i, i + R/2) of each head [heads, E] by position * freq_i, as complex numbers."""
    frequencies, attention_factor = _frequencies(rope, _rope_width(c), c.max_position_embeddings, seq_len)
    half = len(frequencies)
    pairs = x[:, :half] + 1j * x[:, half : 2 * half]
    turned = pairs * np.exp(1j * position * frequencies) * attention_factor
    return np.concatenate([turned.real, turned.imag, x[:, 2 * half :]], axis=1)


def _rotate_pairs(x: np.ndarray, rope: RopeParameters, c: ModelConfig, position: int, seq_len: int) -> np.ndarray:
    """Rotate adjacent dims (2i, 2i + 1) of each head [heads, R], DeepSeek's interleaved layout, in place."""
    frequencies, attention_factor = _frequencies(rope, _rope_width(c), c.max_position_embeddings, seq_len)
    turned = (x[:, 0::2] + 1j * x[:, 1::2]) * np.exp(1j * position * frequencies) * attention_factor
    out = np.empty_like(x)
    out[:, 0::2], out[:, 1::2] = turned.real, turned.imag
    return out


def _rope_width(c: ModelConfig) -> int:
    """The head width RoPE's partial_rotary_factor applies to: E, or latent attention's RoPE dims P."""
    a = c.attention
    return a.qk_rope_head_dim if isinstance(a, LatentAttention) else a.head_dim


def _frequencies(rope: RopeParameters, head_dim: int, max_positions: int, seq_len: int) -> tuple[np.ndarray, float]:
    """The R/2 rotation frequencies and the attention factor, from transformers' rope-init definitions."""
    dim = int(head_dim * rope.partial_rotary_factor)
    base = rope.theta
    if rope.rope_type == "dynamic" and seq_len > max_positions:
        base *= (rope.factor * seq_len / max_positions - (rope.factor - 1)) ** (dim / (dim - 2))
    frequencies = np.array([base ** (-2.0 * i / dim) for i in range(dim // 2)])
    if rope.rope_type == "linear":
        return frequencies / rope.factor, 1.0
    if rope.rope_type == "llama3":
        return np.array([_llama3(f, rope) for f in frequencies]), 1.0
    if rope.rope_type == "yarn":
        return _yarn(frequencies, rope, dim, base)
    return frequencies, 1.0


def _llama3(frequency: float, rope: RopeParameters) -> float:
    wavelength = 2 * math.pi / frequency
    old = rope.original_max_position_embeddings
    if wavelength < old / rope.high_freq_factor:
        return frequency
    if wavelength > old / rope.low_freq_factor:
        return frequency / rope.factor
    smooth = (old / wavelength - rope.low_freq_factor) / (rope.high_freq_factor - rope.low_freq_factor)
    return (1 - smooth) * frequency / rope.factor + smooth * frequency


def _yarn(frequencies: np.ndarray, rope: RopeParameters, dim: int, base: float) -> tuple[np.ndarray, float]:
    def mscale(scale: float, m: float = 1.0) -> float:
        return 0.1 * m * math.log(scale) + 1.0 if scale > 1 else 1.0

    if rope.attention_factor is not None:
        attention_factor = rope.attention_factor
    elif rope.mscale and rope.mscale_all_dim:
        attention_factor = mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim)
    else:
        attention_factor = mscale(rope.factor)

    def correction_dim(rotations: float) -> float:
        wavelengths = rope.original_max_position_embeddings / (rotations * 2 * math.pi)
        return dim * math.log(wavelengths) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    high = high + 0.001 if low == high else high
    blended = []
    for i, frequency in enumerate(frequencies):
        extrapolate = 1 - min(max((i - low) / (high - low), 0.0), 1.0)  # 1: keep the frequency; 0: divide it
        blended.append(frequency / rope.factor * (1 - extrapolate) + frequency * extrapolate)
    return np.array(blended), attention_factor
