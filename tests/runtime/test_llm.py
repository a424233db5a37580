"""LLM: cache-id keyed prefill/decode/decode_batch equal fresh single-sequence runs; bad input changes nothing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from refllm import CacheConfig
from refllm.errors import (
    ContextLengthError,
    InvalidInputError,
    PositionError,
    TokenOutOfRangeError,
    UnknownSequenceError,
)
from refllm.kv import OutOfBlocksError
from refllm.models.decoder import DecoderModel
from refllm.runtime.llm import LLM
from tests.helpers.random_models import CLOSE, fresh_logits, model_for
from tests.helpers.state import assert_same_state, snapshot


def make_llm(arch: str = "llama", **cache) -> LLM:
    return LLM(model_for(arch), CacheConfig(**({"block_size": 4, "num_blocks": 96} | cache)))


@pytest.mark.parametrize("arch", ["llama", "qwen3", "gemma3_text", "gemma2", "smollm3", "olmo2", "deepseek_v3"])
def test_decode_batch_of_ragged_sequences_equals_per_sequence_decode(arch):
    rng = np.random.default_rng(0)
    prompts = {f"seq{i}": list(rng.integers(0, 64, size=n)) for i, n in enumerate([1, 3, 6, 9, 14])}
    batched, single = make_llm(arch), make_llm(arch)
    for cache_id, prompt in prompts.items():
        batched.prefill(cache_id, prompt)
        single.prefill(cache_id, prompt)
    for _ in range(4):
        items = [(c, int(rng.integers(64)), batched.length(c)) for c in prompts]
        rows = batched.decode_batch(items)
        for (cache_id, token, pos), row in zip(items, rows):
            np.testing.assert_allclose(row, single.decode(cache_id, token, pos), **CLOSE)
            prompts[cache_id].append(token)
            np.testing.assert_allclose(row, fresh_logits(batched.model, prompts[cache_id]), **CLOSE)


def test_decode_batch_applies_each_weight_once_to_the_whole_batch(monkeypatch):
    plain = model_for("llama")
    rows_seen, forwards = [], []

    def recording_linear(x, *args):
        rows_seen.append(x.shape[:-1])
        return plain.ops.linear(x, *args)

    # every projection (attention, MLP, LM head) goes through the op set's linear
    ops = dataclasses.replace(plain.ops, linear=recording_linear)
    llm = LLM(DecoderModel(plain.config, plain.weights, ops=ops), CacheConfig(block_size=4, num_blocks=96))
    for i, n in enumerate([2, 5, 7]):
        llm.prefill(i, list(range(n)))
    rows_seen.clear()
    real_forward = llm.model.forward_step
    monkeypatch.setattr(llm.model, "forward_step", lambda *a: forwards.append(1) or real_forward(*a))
    llm.decode_batch([(0, 1, 2), (1, 2, 5), (2, 3, 7)])
    assert len(forwards) == 1
    per_layer = 7  # q, k, v, o, gate, up, down
    assert rows_seen == [(3, 1)] * (per_layer * llm.model.config.num_hidden_layers) + [(3,)]


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_interleaved_calls_over_many_cache_ids_match_fresh_runs(data):
    """Random prefill / chunk / decode / decode_batch / release orders; every logits row equals a fresh run."""
    llm = make_llm(block_size=data.draw(st.sampled_from([1, 4, 16]), label="block_size"))
    history: dict[int, list[int]] = {}
    token_lists = st.lists(st.integers(0, 63), min_size=1, max_size=6)
    for _ in range(data.draw(st.integers(4, 14), label="steps")):
        live = sorted(history)
        op = data.draw(st.sampled_from(["prefill", "decode", "batch", "release"] if live else ["prefill"]))
        if op == "prefill":
            cache_id = data.draw(st.integers(0, 5), label="cache id")  # a live id takes the tokens as a chunk
            tokens = data.draw(token_lists, label="tokens")
            if len(history.get(cache_id, [])) + len(tokens) > 64:
                continue
            row = llm.prefill(cache_id, tokens)
            history.setdefault(cache_id, []).extend(tokens)
            np.testing.assert_allclose(row, fresh_logits(llm.model, history[cache_id]), **CLOSE)
        elif op == "release":
            cache_id = data.draw(st.sampled_from(live), label="released")
            llm.release(cache_id)
            del history[cache_id]
        else:
            chosen = (
                [data.draw(st.sampled_from(live), label="decoded")]
                if op == "decode"
                else data.draw(
                    st.permutations(live).flatmap(lambda p: st.lists(st.sampled_from(p), min_size=1, unique=True)),
                    label="batch",
                )
            )
            chosen = [c for c in chosen if len(history[c]) < 64]
            if not chosen:
                continue
            items = [(c, data.draw(st.integers(0, 63), label="token"), len(history[c])) for c in chosen]
            rows = [llm.decode(*items[0])] if op == "decode" else llm.decode_batch(items)
            for (cache_id, token, _), row in zip(items, rows):
                history[cache_id].append(token)
                np.testing.assert_allclose(row, fresh_logits(llm.model, history[cache_id]), **CLOSE)
    for cache_id in history:
        assert llm.length(cache_id) == len(history[cache_id])
    llm.reset()
    assert llm.config.blocks_free == llm.config.num_blocks


def test_prefill_reuses_a_shared_prefix_and_equals_the_uncached_run():
    llm = make_llm()
    system = list(range(10, 30))  # 20 tokens: five full blocks of 4
    llm.prefill("a", system + [1, 2, 3])
    before = llm.stats().prefix_hit_tokens
    row = llm.prefill("b", system + [4, 5])
    assert llm.stats().prefix_hit_tokens - before == 20
    np.testing.assert_allclose(row, fresh_logits(llm.model, system + [4, 5]), **CLOSE)
    # A prompt that is wholly cached still gets the logits of its last position.
    np.testing.assert_allclose(llm.prefill("c", system), fresh_logits(llm.model, system), **CLOSE)


def test_generated_tokens_become_reusable_prefix():
    llm = make_llm()
    tokens = list(range(5))
    llm.prefill("turn-1", tokens)
    for token in [7, 8, 9]:
        llm.decode("turn-1", token, len(tokens))
        tokens.append(token)
    llm.release("turn-1")
    before = llm.stats().prefix_hit_tokens
    row = llm.prefill("turn-2", tokens + [1, 2])
    assert llm.stats().prefix_hit_tokens - before == 8
    np.testing.assert_allclose(row, fresh_logits(llm.model, tokens + [1, 2]), **CLOSE)


def test_fork_truncate_and_decode_all_logits():
    llm = make_llm()
    llm.prefill("parent", [1, 2, 3, 4, 5])
    llm.fork("parent", "child")
    np.testing.assert_allclose(llm.decode("child", 9, 5), fresh_logits(llm.model, [1, 2, 3, 4, 5, 9]), **CLOSE)
    np.testing.assert_allclose(llm.decode("parent", 8, 5), fresh_logits(llm.model, [1, 2, 3, 4, 5, 8]), **CLOSE)
    rows = llm.decode_all_logits("child", [4, 4, 4], 6)
    for t in range(3):
        np.testing.assert_allclose(rows[t], fresh_logits(llm.model, [1, 2, 3, 4, 5, 9] + [4] * (t + 1)), **CLOSE)
    llm.truncate("child", 7)
    np.testing.assert_allclose(llm.decode("child", 6, 7), fresh_logits(llm.model, [1, 2, 3, 4, 5, 9, 4, 6]), **CLOSE)


def test_blocks_free_is_live_and_counts_evictable_cached_blocks():
    llm = make_llm(num_blocks=8)
    assert llm.config.blocks_free == 8
    llm.prefill("a", list(range(10)))  # 3 blocks
    assert llm.config.blocks_free == 5
    llm.release("a")  # two full blocks stay cached, unreferenced: free all the same
    assert llm.config.blocks_free == 8 and llm.stats().blocks_cached == 2
    llm.prefill("b", list(range(30)))  # needs all 8: evicts the cached ones
    assert llm.config.blocks_free == 0


def test_running_out_of_blocks_changes_nothing_and_the_sequences_carry_on():
    llm = make_llm(num_blocks=4)
    llm.prefill("a", list(range(8)))  # 2 full blocks
    llm.prefill("b", list(range(20, 28)))  # 2 full blocks: the arena is full
    before = snapshot((llm.arena, llm._seq_ids))
    with pytest.raises(OutOfBlocksError):
        llm.decode_batch([("a", 1, 8), ("b", 2, 8)])
    assert_same_state(before, snapshot((llm.arena, llm._seq_ids)))
    # A new prompt is refused after its prefix is matched: the arena's bookkeeping is back as it was.
    with pytest.raises(OutOfBlocksError):
        llm.prefill("c", [40, 41])
    assert_same_state(bookkeeping(before[0]), bookkeeping(llm.arena))
    assert "c" not in llm
    llm.release("b")
    np.testing.assert_allclose(llm.decode("a", 1, 8), fresh_logits(llm.model, list(range(8)) + [1]), **CLOSE)


def bookkeeping(arena) -> dict:
    """The arena's state less its batch-view memo and the version counter that keys it."""
    return {name: value for name, value in vars(arena).items() if name not in ("_version", "_batch_memo")}


BAD_CALLS = {
    "unknown cache id": (lambda llm: llm.decode("nobody", 1, 0), UnknownSequenceError),
    "unknown cache id in a batch": (
        lambda llm: llm.decode_batch([("a", 1, 5), ("nobody", 1, 0)]),
        UnknownSequenceError,
    ),
    "duplicate cache id in a batch": (
        lambda llm: llm.decode_batch([("a", 1, 5), ("b", 1, 3), ("a", 2, 5)]),
        InvalidInputError,
    ),
    "wrong pos": (lambda llm: llm.decode("a", 1, 4), PositionError),
    "wrong pos in a batch": (lambda llm: llm.decode_batch([("a", 1, 5), ("b", 1, 4)]), PositionError),
    "pos that is not an int": (lambda llm: llm.decode("a", 1, 5.0), PositionError),
    "token past the vocabulary": (lambda llm: llm.decode_batch([("a", 1, 5), ("b", 64, 3)]), TokenOutOfRangeError),
    "negative token": (lambda llm: llm.decode("a", -1, 5), TokenOutOfRangeError),
    "float token": (lambda llm: llm.decode("a", 1.5, 5), InvalidInputError),
    "token out of range in a prompt": (lambda llm: llm.prefill("new", [1, 2, 99]), TokenOutOfRangeError),
    "token out of range in an append": (lambda llm: llm.prefill("a", [1, 64]), TokenOutOfRangeError),
    "empty prompt": (lambda llm: llm.prefill("new", []), InvalidInputError),
    "empty append": (lambda llm: llm.prefill("a", []), InvalidInputError),
    "a 2-D prompt": (lambda llm: llm.prefill("new", [[1, 2]]), InvalidInputError),
    "empty batch": (lambda llm: llm.decode_batch([]), InvalidInputError),
    "malformed batch item": (lambda llm: llm.decode_batch([("a", 1)]), InvalidInputError),
    "prompt past the context length": (lambda llm: llm.prefill("new", [1] * 65), ContextLengthError),
    "append past the context length": (lambda llm: llm.prefill("a", [1] * 60), ContextLengthError),
    "decode past the context length": (lambda llm: llm.decode("full", 1, 64), ContextLengthError),
    "verify past the context length": (lambda llm: llm.decode_all_logits("a", [1] * 60, 5), ContextLengthError),
    "unhashable cache id": (lambda llm: llm.prefill(["a"], [1]), InvalidInputError),
    "a NaN cache id": (lambda llm: llm.prefill(float("nan"), [1]), InvalidInputError),
    "a NumPy NaN cache id": (lambda llm: llm.prefill(np.float64("nan"), [1]), InvalidInputError),
    "a NaN inside a tuple cache id": (lambda llm: llm.prefill(("x", float("nan")), [1]), InvalidInputError),
    "a NaN cache id in a batch": (lambda llm: llm.decode_batch([(float("nan"), 1, 0)]), InvalidInputError),
    "release of an unknown id": (lambda llm: llm.release("nobody"), UnknownSequenceError),
    "fork into a live id": (lambda llm: llm.fork("a", "b"), InvalidInputError),
    "truncate past the length": (lambda llm: llm.truncate("a", 6), ValueError),
    "truncate to a float length": (lambda llm: llm.truncate("a", 2.0), InvalidInputError),
}


@pytest.mark.parametrize("name", BAD_CALLS)
def test_bad_input_is_refused_and_changes_nothing(name):
    call, error = BAD_CALLS[name]
    llm = make_llm()
    llm.prefill("a", [1, 2, 3, 4, 5])
    llm.prefill("b", [6, 7, 8])
    llm.prefill("full", [0] * 64)
    before = snapshot((llm.arena, llm._seq_ids))
    with pytest.raises(error):
        call(llm)
    assert_same_state(before, snapshot((llm.arena, llm._seq_ids)))
    assert isinstance(error(""), (ValueError, KeyError))


def test_a_token_list_of_mixed_integer_types_is_accepted():
    """int and np.uint64 together make a float64 array under np.asarray; each id is an integer all the same."""
    llm = make_llm()
    mixed = [1, np.uint64(2), np.int8(3), np.int32(4)]
    np.testing.assert_array_equal(llm.prefill("mixed", mixed), llm.prefill("plain", [1, 2, 3, 4]))
    assert llm.length("mixed") == 4


def test_the_llm_refuses_a_contiguous_cache():
    with pytest.raises(InvalidInputError, match="paged"):
        LLM(model_for("llama"), CacheConfig(kind="contiguous"))
