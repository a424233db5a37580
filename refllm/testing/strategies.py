"""Hypothesis strategies for conformance tests: models, weights, inputs and schedules.

Sizes are tiny (a model runs in milliseconds) but every flag that changes the
arithmetic is drawn: grouped-query ratios, head dims apart from hidden / heads,
RoPE bases and scaling variants, partial rotary dims, sliding windows shorter
than the inputs, biases, q/k norms, tied embeddings, Gemma's soft-capping and
layer-type patterns, SmolLM3's NoPE layers (listed, or derived from an interval),
OLMo 2's post-norms, mixture-of-experts routing (experts, experts per token,
renormalisation, dense layers among sparse ones, gpt-oss's router bias, sinks and
clamp), DeepSeek-V3's latent attention and grouped routing, and RMSNorm epsilons
large enough that misplacing one shows in the logits.

Optional keys are left out in one draw of three (``configs.OPTIONAL_KEYS``), as real
checkpoints leave many out, so a backend must apply the family's defaults;
architectures whose mechanisms few draws reach are drawn more often
(``configs.ARCHITECTURE_WEIGHTS``), so that every mechanism is exercised at the default
budget (``mechanisms.py`` measures it).

``hf_configs()`` draws ``config.json`` dicts that both refllm and transformers
read; ``checkpoints()`` adds seeded random weights, their scale drawn over
orders of magnitude (``weight_options``: std 0.01 to 1, so attention scores
reach the hundreds, and tied checkpoints that also carry a stray
``lm_head.weight``, and mixture-of-experts routers whose scores tie: duplicated
rows, or scores saturated to 1). Token ids cover the whole vocabulary, favouring
its ends: the special ids 0..2 (pad, bos, eos) and the last id. ``long_horizon_cuts``
draws sequences of hundreds of positions cut near block, window and chunk edges.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from refllm.testing.checkpoint import Checkpoint
from refllm.testing.configs import (
    ARCHITECTURES,
    CLASS_NAMES,
    DRAWN_KEYS,
    check_architectures,
    optional_keys,
    weighted,
)

SPECIAL_IDS = (0, 1, 2)  # pad, bos, eos in every drawn config
MAX_POSITION_EMBEDDINGS = 64  # of every drawn config but the dynamic NTK ones (16, so inputs run past it)
# Room every drawn config leaves for inputs: prompts plus continuations stay below this.
MAX_TOTAL_TOKENS = 32
LONG_HORIZON_POSITIONS = 512  # max_position_embeddings of the configs drawn for long_horizon
LONG_HORIZON_MAX = 320  # longest long_horizon sequence
WEIGHT_STDS = (0.01, 0.1, 0.1, 1.0)  # 0.1 twice: the usual scale is drawn most; past 1, float32 itself drifts past 2e-4 of the spread over hundreds of positions
# Checkpoint.random's router: duplicated rows tie every family's scores, saturated ones DeepSeek-V3's sigmoids too.
# In these lists the plain value comes first, where hypothesis shrinks to; repeats weight the others.
ROUTERS = ("random", "duplicated", "saturated", "duplicated", "saturated", "saturated")
BIASES = st.sampled_from([False, True, True, True])  # on in 1 draw of 2, once left out (off) one draw in three


@st.composite
def without_some_defaults(draw, config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with each of its optional keys left out with probability 1/3."""
    return {
        key: value
        for key, value in config.items()
        if key not in optional_keys(config["model_type"]) or draw(st.sampled_from([True, True, False]))
    }


@st.composite
def rope_scalings(draw, max_positions: int = MAX_POSITION_EMBEDDINGS, dynamic: bool = True) -> dict[str, Any] | None:
    """None or a ``rope_scaling`` dict of one of the scaling variants (dynamic NTK only if ``dynamic``)."""
    kind = draw(st.sampled_from([None, "linear", "llama3", "yarn"] + (["dynamic"] if dynamic else [])))
    if kind is None:
        return None
    scaling: dict[str, Any] = {"rope_type": kind, "factor": draw(st.sampled_from([2.0, 4.0]))}
    if kind == "llama3":
        scaling |= dict(low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16)
    if kind == "yarn":  # transformers expects max_position_embeddings = factor x the original
        scaling |= dict(original_max_position_embeddings=int(max_positions / scaling["factor"]))
    return scaling


@st.composite
def hf_configs(draw, architectures: tuple[str, ...] = ARCHITECTURES, long_horizon: bool = False) -> dict[str, Any]:
    """A tiny ``config.json`` dict for one of ``architectures`` (weighted by ARCHITECTURE_WEIGHTS), some of
    its optional keys left out.

    ``long_horizon``: room for LONG_HORIZON_POSITIONS positions, and no dynamic NTK scaling
    (whose cached and one-shot forwards differ by design: ``history.py``).
    """
    model_type = draw(st.sampled_from(weighted(check_architectures(architectures))))
    return draw(without_some_defaults(draw(full_configs(model_type, long_horizon))))


@st.composite
def full_configs(draw, model_type: str, long_horizon: bool = False) -> dict[str, Any]:
    """A tiny ``config.json`` dict of ``model_type`` with every key written (but SmolLM3's NoPE keys)."""
    max_positions = LONG_HORIZON_POSITIONS if long_horizon else MAX_POSITION_EMBEDDINGS
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 3))  # GQA ratios 1, 2, 3 (and multi-query)
    head_dim = draw(st.sampled_from([4, 8, 12, 16]))
    mixture = model_type in (*MOE_ARCHITECTURES, "deepseek_v3")
    layers = draw(st.sampled_from([1, 2, 2] if mixture else [1, 2]))  # sparse and dense layers together need two
    if model_type == "deepseek_v3":
        kv_heads = heads  # transformers' latent attention expands one key per query head
    if model_type in ("phi3", "qwen2"):
        hidden = heads * head_dim  # these derive head_dim from hidden / heads
    else:  # a head dim of its own; transformers still wants hidden % heads == 0
        hidden = heads * draw(st.sampled_from([4, 8]))
    config: dict[str, Any] = dict(
        model_type=model_type,
        architectures=[CLASS_NAMES[model_type]],
        vocab_size=draw(st.sampled_from([32, 48, 64])),
        hidden_size=hidden,
        intermediate_size=draw(st.sampled_from([16, 32, 40])),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        rms_norm_eps=draw(st.sampled_from([1e-6, 1e-5, 1e-2, 0.5])),
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    window = draw(st.integers(2, 8))
    theta = draw(st.sampled_from([10_000.0, 500.0, 1_000_000.0]))
    if model_type == "gemma3_text":
        config |= dict(
            hidden_activation="gelu_pytorch_tanh",
            sliding_window=window,
            layer_types=draw(
                st.lists(st.sampled_from(["sliding_attention", "full_attention"]), min_size=layers, max_size=layers)
            ),
            query_pre_attn_scalar=draw(st.sampled_from([head_dim, 24, 256])),
            final_logit_softcapping=draw(st.sampled_from([None, 3.0, 3.0])),
            attention_bias=draw(st.booleans()),
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": theta}
                | (draw(rope_scalings(max_positions, not long_horizon)) or {}),
                "sliding_attention": {"rope_type": "default", "rope_theta": draw(st.sampled_from([10_000.0, 100.0]))},
            },
        )
        return config
    if model_type == "deepseek_v3":
        config |= draw(deepseek_options(head_dim, layers))
        rope = {"rope_type": "default", "rope_theta": theta} | (draw(rope_scalings(max_positions, not long_horizon)) or {})
        if rope["rope_type"] == "yarn":  # DeepSeek's YaRN: mscale_all_dim also scales the softmax
            rope |= dict(mscale=draw(st.sampled_from([0.8, 1.0])), mscale_all_dim=draw(st.sampled_from([0.0, 1.0])))
        if rope["rope_type"] == "dynamic":
            config["max_position_embeddings"] = 16
        return config | dict(rope_parameters=rope)
    if model_type in MOE_ARCHITECTURES:
        return config | draw(moe_keys(model_type, layers, window, theta, max_positions, not long_horizon))
    if model_type == "gemma2":
        return config | dict(
            hidden_activation="gelu_pytorch_tanh",
            sliding_window=window,
            layer_types=draw(
                st.lists(st.sampled_from(["sliding_attention", "full_attention"]), min_size=layers, max_size=layers)
            ),
            query_pre_attn_scalar=draw(st.sampled_from([head_dim, 24, 256])),
            attn_logit_softcapping=draw(st.sampled_from([None, 1.0, 5.0])),
            final_logit_softcapping=draw(st.sampled_from([None, 3.0])),
            attention_bias=draw(st.booleans()),
            rope_theta=theta,
        )
    config |= dict(
        rope_theta=theta,
        hidden_act=draw(st.sampled_from(["silu", "gelu_pytorch_tanh"])),
        tie_word_embeddings=draw(st.booleans()),
    )
    scaling = draw(rope_scalings(max_positions, not long_horizon)) if model_type != "phi3" else None
    if scaling is not None:
        config["rope_scaling"] = scaling
        if scaling["rope_type"] == "dynamic":
            config["max_position_embeddings"] = 16  # so inputs run past it and the base grows
    if model_type == "llama":
        config |= dict(attention_bias=draw(BIASES), mlp_bias=draw(BIASES))
    elif model_type in ("qwen3", "olmo2"):
        config |= dict(attention_bias=draw(st.booleans()))
    elif model_type == "smollm3":
        config |= dict(attention_bias=draw(BIASES), mlp_bias=draw(BIASES)) | draw(nope_keys(layers))
    elif model_type == "phi3":
        config |= dict(
            partial_rotary_factor=draw(st.sampled_from([1.0, 0.5, 0.5])),
            sliding_window=draw(st.sampled_from([None, window])),
        )
    elif model_type == "mistral":
        config |= dict(sliding_window=draw(st.sampled_from([None, window, window])))
    elif model_type == "qwen2":
        config |= dict(
            use_sliding_window=draw(st.sampled_from([False, True, True])),
            sliding_window=window,
            max_window_layers=draw(st.sampled_from([*range(layers)] * 2 + [layers])),  # layers from there on slide
        )
    # a family's own keys, as its module declares the values to draw (refllm/families/)
    return config | {key: draw(st.sampled_from(values)) for key, values in DRAWN_KEYS[model_type].items()}


MOE_ARCHITECTURES = ("mixtral", "qwen3_moe", "gpt_oss")


@st.composite
def nope_keys(draw, layers: int) -> dict[str, Any]:
    """SmolLM3's NoPE layers as checkpoints spell them: listed in ``no_rope_layers`` (1 where the layer
    rotates, 0 for a NoPE layer; with or without the interval beside it), derived from
    ``no_rope_layer_interval`` alone (layer i skips RoPE where (i + 1) % interval == 0), or neither
    (transformers' default interval, 4)."""
    flags = st.lists(st.sampled_from([0, 1]), min_size=layers, max_size=layers)
    interval = st.integers(1, 4)
    spelling = draw(st.sampled_from(["interval", "neither", "listed", "interval", "neither", "listed and interval"]))
    keys = {}
    if "listed" in spelling:
        keys["no_rope_layers"] = draw(flags)
    if "interval" in spelling:
        keys["no_rope_layer_interval"] = draw(interval)
    return keys


@st.composite
def moe_keys(
    draw, model_type: str, layers: int, window: int, theta: float, max_positions: int, dynamic: bool = True
) -> dict[str, Any]:
    """The config.json keys of a mixture-of-experts family, drawn: experts, routing, sparse layers, RoPE
    scaling (dynamic NTK only if ``dynamic``)."""
    experts = draw(st.integers(2, 6))
    keys: dict[str, Any] = dict(
        num_local_experts=experts, num_experts_per_tok=draw(st.integers(1, min(experts, 3))), tie_word_embeddings=False
    )
    scaling = draw(rope_scalings(max_positions, dynamic)) if model_type != "gpt_oss" else None
    if scaling is not None:
        keys["rope_scaling"] = scaling
        if scaling["rope_type"] == "dynamic":
            keys["max_position_embeddings"] = 16  # so inputs run past it and the base grows
    if model_type == "mixtral":
        return keys | dict(rope_theta=theta, sliding_window=draw(st.none() | st.just(window)))
    if model_type == "qwen3_moe":
        return keys | dict(
            rope_theta=theta,
            moe_intermediate_size=draw(st.sampled_from([8, 16, 24])),
            norm_topk_prob=draw(st.sampled_from([False, True, True])),
            decoder_sparse_step=draw(st.sampled_from([1, 2])),
            mlp_only_layers=draw(st.lists(st.integers(0, layers - 1), max_size=1)),
            attention_bias=draw(st.booleans()),
        )
    yarn = dict(rope_type="yarn", factor=2.0, truncate=False, original_max_position_embeddings=max_positions // 2)
    return keys | dict(  # gpt_oss
        sliding_window=window,
        layer_types=draw(
            st.lists(st.sampled_from(["sliding_attention", "full_attention"]), min_size=layers, max_size=layers)
        ),
        swiglu_limit=draw(st.sampled_from([0.5, 0.5, 7.0])),
        rope_parameters={"rope_theta": theta} | draw(st.sampled_from([{"rope_type": "default"}, yarn])),
    )


@st.composite
def deepseek_options(draw, head_dim: int, layers: int) -> dict[str, Any]:
    """DeepSeek-V3's latent widths and expert routing: low-rank or plain queries, groups kept or all."""
    num_groups = draw(st.sampled_from([1, 2, 4]))
    experts = num_groups * draw(st.sampled_from([2, 3]))
    groups_per_token = draw(st.integers(1, num_groups))
    return dict(
        q_lora_rank=draw(st.none() | st.sampled_from([8, 12])),
        kv_lora_rank=draw(st.sampled_from([4, 8, 16])),
        qk_nope_head_dim=draw(st.sampled_from([4, 8])),
        qk_rope_head_dim=head_dim,
        v_head_dim=draw(st.sampled_from([4, 6, 8])),
        rope_interleave=draw(st.booleans()),
        attention_bias=draw(st.booleans()),
        moe_intermediate_size=draw(st.sampled_from([8, 16])),
        n_routed_experts=experts,
        n_group=num_groups,
        topk_group=groups_per_token,
        num_experts_per_tok=draw(st.integers(1, groups_per_token * experts // num_groups)),
        n_shared_experts=draw(st.integers(1, 2)),  # transformers builds 0 as empty tensors
        norm_topk_prob=draw(st.sampled_from([False, True, True])),
        routed_scaling_factor=draw(st.sampled_from([1.0, 2.5, 0.5])),
        # mostly a sparse layer, after a dense one where there are two layers
        first_k_dense_replace=draw(st.sampled_from([0, 0, 1] if layers == 1 else [0, 1, 1, 2])),
        tie_word_embeddings=draw(st.booleans()),
    )


def weight_options() -> st.SearchStrategy[dict[str, Any]]:
    """Keyword arguments of ``Checkpoint.random`` besides config and seed: the weights' std, a stray lm_head,
    the routers' ties (mixtures of experts only)."""
    return st.fixed_dictionaries(
        {"std": st.sampled_from(WEIGHT_STDS), "lm_head": st.booleans(), "router": st.sampled_from(ROUTERS)}
    )


def checkpoints(configs: st.SearchStrategy[dict[str, Any]] | None = None) -> st.SearchStrategy[Checkpoint]:
    """Seeded random weights for a drawn config, in memory (``Checkpoint.path`` writes safetensors on demand)."""
    configs = configs if configs is not None else hf_configs()
    return st.builds(
        lambda config, seed, options: Checkpoint.random(config, seed, **options),
        configs,
        st.integers(0, 2**16),
        weight_options(),
    )


def token_id(vocab_size: int) -> st.SearchStrategy[int]:
    """Any id of the vocabulary, its ends (the special ids, the last id) drawn more often than their share."""
    return st.one_of(
        st.integers(0, vocab_size - 1), st.sampled_from([*SPECIAL_IDS, vocab_size - 1])
    )


def token_ids(vocab_size: int, min_size: int = 1, max_size: int = 24) -> st.SearchStrategy[list[int]]:
    return st.lists(token_id(vocab_size), min_size=min_size, max_size=max_size)


@st.composite
def long_horizon_cuts(draw, window: int | None, block_sizes=(4, 16, 32)) -> tuple[int, list[int]]:
    """(length, prefill chunk ends) of a sequence of up to LONG_HORIZON_MAX positions.

    Lengths and cuts sit near edges where bugs live: multiples of usual block
    sizes and of the sliding window, plus or minus one; past the last cut the
    sequence is decoded token by token.
    """
    edges = {b * n + d for b in block_sizes for n in range(1, LONG_HORIZON_MAX // b + 1) for d in (-1, 0, 1)}
    if window:
        edges |= {window * n + d for n in range(1, 4) for d in (-1, 0, 1)}
    edges = sorted(e for e in edges if 1 <= e <= LONG_HORIZON_MAX)
    length = draw(st.sampled_from([e for e in edges if e > 32]) | st.integers(33, LONG_HORIZON_MAX))
    inside = [e for e in edges if e < length]
    cuts = sorted(set(draw(st.lists(st.sampled_from(inside), min_size=1, max_size=4))))
    return length, cuts


def chunk_splits(total: int, max_chunks: int = 5) -> st.SearchStrategy[list[int]]:
    """Chunk lengths (each >= 1) that sum to ``total``."""

    def chunks(cuts: list[int]) -> list[int]:
        edges = [0, *sorted({c for c in cuts if 0 < c < total}), total]
        return [b - a for a, b in zip(edges, edges[1:])]

    return st.lists(st.integers(1, max(total - 1, 1)), max_size=max_chunks - 1).map(chunks)


OPS = ("prefill", "decode", "decode_batch", "release", "truncate", "reset")


@st.composite
def schedules(
    draw,
    vocab_size: int,
    max_ids: int = 3,
    max_steps: int = 10,
    max_len: int = MAX_TOTAL_TOKENS,
    ops: tuple[str, ...] = OPS,
) -> list[list]:
    """An interleaved schedule of operations across cache ids, valid at every step.

    Steps are JSON-ready lists: ``["prefill", id, tokens]`` (starts or continues
    the sequence), ``["decode", id, token]``, ``["decode_batch", [[id, token], ...]]``
    (distinct live ids, of any lengths), ``["release", id]``, ``["truncate", id, length]``
    and ``["reset"]``. No sequence grows past ``max_len`` tokens.
    """
    lengths: dict[int, int] = {}
    steps: list[list] = []
    for _ in range(draw(st.integers(1, max_steps))):
        live = sorted(lengths)
        decodable = [i for i in live if 1 <= lengths[i] < max_len]
        roomy = [i for i in range(max_ids) if lengths.get(i, 0) < max_len]
        allowed = dict(prefill=roomy, decode=decodable, decode_batch=decodable, release=live, truncate=live, reset=live)
        options = [op for op in ops if allowed[op]]
        if not options:
            break
        op = draw(st.sampled_from(options))
        if op == "prefill":
            cache_id = draw(st.sampled_from(roomy))
            tokens = draw(token_ids(vocab_size, 1, min(max_len - lengths.get(cache_id, 0), 12)))
            lengths[cache_id] = lengths.get(cache_id, 0) + len(tokens)
            steps.append([op, cache_id, tokens])
        elif op == "decode":
            cache_id = draw(st.sampled_from(decodable))
            lengths[cache_id] += 1
            steps.append([op, cache_id, draw(token_id(vocab_size))])
        elif op == "decode_batch":
            ids = draw(st.lists(st.sampled_from(decodable), min_size=1, max_size=len(decodable), unique=True))
            for cache_id in ids:
                lengths[cache_id] += 1
            steps.append([op, [[i, draw(token_id(vocab_size))] for i in ids]])
        elif op == "release":
            cache_id = draw(st.sampled_from(live))
            del lengths[cache_id]
            steps.append([op, cache_id])
        elif op == "truncate":
            cache_id = draw(st.sampled_from(live))
            lengths[cache_id] = draw(st.integers(0, lengths[cache_id]))
            steps.append([op, cache_id, lengths[cache_id]])
        else:
            lengths.clear()
            steps.append(["reset"])
    return steps
