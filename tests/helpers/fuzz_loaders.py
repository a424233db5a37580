"""Hostile model files: small valid ones, mutated, loaded under a cap on memory and on time.

Each case takes a seed (a tiny Llama as a GGUF file and as a Hugging Face directory,
both with a tokenizer; or a tiny checkpoint of a newer family from tests/data/hf, as
transformers' ``save_pretrained`` wrote it, one tensor per expert for Mixtral, Qwen3-MoE
and DeepSeek-V3), changes some bytes or one field to a hostile value, and loads
it with ``refllm.load_model``. It must load, or be refused with a ValueError or a
KeyError; a MemoryError (past the cap of address space) or running past the time cap
is a failure. tests/robustness/test_fuzz_loaders.py runs a few hundred cases in CI;
benchmarks/fuzz_loaders.py runs many more and reports them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import resource
import shutil
import signal
import struct
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import refllm
from refllm.io.gguf_header import map_file
from refllm.io.safetensors import HFDirectorySource
from tests.helpers.gguf_convert import convert
from tests.helpers.model_directory import CHATML, write_tiny_model
from tests.helpers.paths import HF_DATA

MEMORY_CAP = 512 << 20  # address space a case may add to the process
TIME_CAP = 10.0  # seconds

HOSTILE_INTEGERS = [0, 1, 3, 2**16 - 1, 10**7, 2**26, 2**28, 2**30, 2**31 - 1, 2**31, 2**32 - 1, 2**40, 2**62,
                    2**63 - 1, 2**64 - 1]
HOSTILE_VALUES = st.one_of(
    st.sampled_from(HOSTILE_INTEGERS),
    st.sampled_from([-1, -(2**31), 0.0, -0.5, 0.5, math.nan, math.inf, -math.inf, 1e308, 1e-320, True, False, None,
                     "", "x", "banana", "chunked_attention", "yarn", [], {}]),
    st.lists(st.sampled_from([0, -1, 1, 99, 2**40, "a", "full_attention", "banana"]), max_size=4),
    st.integers(1, 400).map(lambda depth: json.loads("[" * depth + "]" * depth)),  # deeper: a test of its own
)
GGUF_VALUES = st.one_of(  # what gguf's writer can store: scalars, and arrays of numbers or of strings
    st.sampled_from(HOSTILE_INTEGERS),
    st.sampled_from([-1, -(2**31), 0.0, -0.5, math.nan, math.inf, 1e308, True, False, "", "x", "gpt2", "llama"]),
    st.lists(st.sampled_from([0, 2**40, 2**63 - 1]), min_size=1, max_size=4),
    st.lists(st.sampled_from(["a", "a b", ""]), min_size=1, max_size=4),
)


class TimeCapExceeded(Exception):
    pass


@dataclass
class Stats:
    """What a run of cases did: how many, how each ended, the worst peak of resident memory a case added."""

    cases: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    worst_peak_bytes: int = 0
    worst_case: str = ""


def _status_kib(field_name: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1])
    raise LookupError(field_name)


@contextlib.contextmanager
def capped(stats: Stats, label: str, memory: int = MEMORY_CAP, seconds: float = TIME_CAP) -> Iterator[None]:
    """Run the block with at most ``memory`` more bytes of address space and ``seconds`` of time.

    Past either, the block fails (MemoryError, TimeCapExceeded). The block's peak resident
    memory over what the process held before is measured by resetting the kernel's
    high-water mark (``/proc/self/clear_refs``) and reading it after.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmRSS") * 1024
    resource.setrlimit(resource.RLIMIT_AS, (_status_kib("VmSize") * 1024 + memory, hard))

    def out_of_time(signum, frame):
        raise TimeCapExceeded(f"{label} ran past {seconds} s")

    previous = signal.signal(signal.SIGALRM, out_of_time)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))  # first: what follows may need memory
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        peak = _status_kib("VmHWM") * 1024 - before
        stats.cases += 1
        if peak > stats.worst_peak_bytes:
            stats.worst_peak_bytes, stats.worst_case = peak, label


def load_or_refuse(path: Path, stats: Stats, label: str) -> None:
    """Load ``path`` under the caps; a refusal must be a ValueError or a KeyError (anything else is raised)."""
    try:
        with capped(stats, label):
            refllm.load_model(path)
        outcome = "loaded"
    except (ValueError, KeyError) as error:
        assert str(error), f"{label}: a refusal with no message ({type(error).__name__})"
        outcome = type(error).__name__
    stats.outcomes[outcome] = stats.outcomes.get(outcome, 0) + 1


# --- the seeds ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Seeds:
    hf: Path  # config.json, model.safetensors, tokenizer.json, tokenizer_config.json
    gguf: Path  # the same model and tokenizer as llama.cpp's converter would write them
    gguf_header_bytes: int
    families: dict[str, Path] = field(default_factory=dict)  # a tiny checkpoint of each of FAMILY_KEYS


def make_seeds(directory: Path) -> Seeds:
    hf = write_tiny_model(directory / "hf")
    path = convert(hf, directory / "tiny.gguf", more=functools.partial(_add_tokenizer, hf / "tokenizer.json"))
    mapped, header = map_file(path)
    mapped.close()
    return Seeds(hf, path, header.data_offset, {family: HF_DATA / family for family in FAMILY_KEYS})


def _add_tokenizer(tokenizer_file: Path, writer: gguf.GGUFWriter) -> None:
    """The byte-level BPE of ``tokenizer_file`` as GGUF metadata, as llama.cpp's converter writes it."""
    tokenizer = json.loads(tokenizer_file.read_text())
    vocab = tokenizer["model"]["vocab"] | {t["content"]: t["id"] for t in tokenizer["added_tokens"]}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(sorted(vocab, key=vocab.get))
    writer.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tokenizer["model"]["merges"]])
    writer.add_chat_template(CHATML)


# --- mutations ----------------------------------------------------------------------------------------

Writes = list[tuple[int, bytes]]


@st.composite
def byte_writes(draw: st.DrawFn, size: int) -> Writes:
    """A few overwrites at positions below ``size``: a byte, or a hostile u32 or u64 (little-endian)."""
    writes = []
    for _ in range(draw(st.integers(1, 4))):
        position = draw(st.integers(0, size - 1))
        number = draw(st.sampled_from(HOSTILE_INTEGERS))
        kind = draw(st.sampled_from(["byte", "u32", "u64"]))
        raw = bytes([draw(st.integers(0, 255))]) if kind == "byte" else struct.pack("<Q", number)[: 4 if kind == "u32" else 8]
        writes.append((position, raw))
    return writes


def overwrite(path: Path, writes: Writes, cut: int | None = None) -> None:
    data = bytearray(path.read_bytes())
    for position, raw in writes:
        data[position : position + len(raw)] = raw
    path.write_bytes(bytes(data[:cut]) if cut is not None else bytes(data))


def gguf_with(seed: Path, out: Path, key: str, value: object) -> None:
    """The seed GGUF file with metadata ``key`` set to ``value`` (of the GGUF type that fits it)."""
    reader = gguf.GGUFReader(seed)
    writer = gguf.GGUFWriter(out, "llama")
    fields = {name: (f.contents(), f.types) for name, f in reader.fields.items() if not name.startswith("GGUF.")}
    fields[key] = (value, None)
    writer.kv_data[0].pop("general.architecture", None)  # written again from the fields, or changed
    for name, (contents, types) in fields.items():
        writer.add_key_value(name, contents, *_gguf_types(contents, types))
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, np.array(tensor.data))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _gguf_types(value: object, types: list | None) -> tuple:
    if types:
        return (types[0], types[-1]) if types[0] == gguf.GGUFValueType.ARRAY else (types[0], None)
    if isinstance(value, list):
        item = gguf.GGUFValueType.STRING if isinstance(value[0], str) else gguf.GGUFValueType.UINT64
        return gguf.GGUFValueType.ARRAY, item
    if isinstance(value, bool):
        return gguf.GGUFValueType.BOOL, None
    if isinstance(value, int):
        return (gguf.GGUFValueType.UINT64 if value >= 0 else gguf.GGUFValueType.INT64), None
    return (gguf.GGUFValueType.FLOAT64 if isinstance(value, float) else gguf.GGUFValueType.STRING), None


def with_json_field(path: Path, keys: tuple, value: object) -> None:
    """The JSON file at ``path`` with the field at ``keys`` (dict keys and list indices) set to ``value``;
    a missing object on the way is added."""
    document = json.loads(path.read_text())
    holder = document
    for key in keys[:-1]:
        holder = holder.setdefault(key, {}) if isinstance(holder, dict) else holder[key]
    holder[keys[-1]] = value
    path.write_text(json.dumps(document))


def safetensors_with(path: Path, name: str | None, field_name: str, value: object) -> None:
    """The safetensors file with one field of tensor ``name``'s header entry set to ``value``, or
    (``name`` None) with its header length set to ``value``."""
    data = path.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header, rest = json.loads(data[8 : 8 + length]), data[8 + length :]
    if name is None:
        path.write_bytes(struct.pack("<Q", value % 2**64) + data[8:])
        return
    header[name][field_name] = value
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + rest)


@contextlib.contextmanager
def scratch_copy(seed: Path) -> Iterator[Path]:
    """A copy of the seed (a file or a directory) in a fresh temporary directory."""
    with tempfile.TemporaryDirectory(prefix="refllm-fuzz-") as directory:
        target = Path(directory) / seed.name
        (shutil.copytree if seed.is_dir() else shutil.copyfile)(seed, target)
        yield target


# --- the cases: a strategy of what to change, and how to change a seed with it and load it ----------------

CONFIG_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings", "rms_norm_eps", "rope_theta",
               "rope_scaling", "sliding_window", "layer_types", "bos_token_id", "eos_token_id", "model_type",
               "tie_word_embeddings", "hidden_act"]  # fmt: skip
GGUF_KEYS = ["llama.block_count", "llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
             "llama.attention.head_count", "llama.attention.head_count_kv", "llama.attention.key_length",
             "llama.attention.layer_norm_rms_epsilon", "llama.rope.freq_base", "llama.rope.dimension_count",
             "llama.rope.scaling.type", "general.alignment", "general.architecture", "tokenizer.ggml.model",
             "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type",
             "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"]  # fmt: skip
GGUF_KEYS += ["llama.expert_count", "llama.expert_used_count", "llama.rope.scaling.type", "llama.rope.scaling.factor",
              "llama.rope.scaling.original_context_length", "llama.attention.sliding_window"]  # fmt: skip
TENSOR_FIELDS = ["dtype", "shape", "data_offsets"]
# The newer families' own config.json keys (beside CONFIG_KEYS); a tuple is a path into the RoPE settings.
ROPE_KEYS = [("rope_parameters", key) for key in (
    "rope_type", "rope_theta", "factor", "partial_rotary_factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim",
    "truncate")]  # fmt: skip
EXPERT_KEYS = ["num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size"]
FAMILY_KEYS = {
    "gemma2": ["attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar", "sliding_window_pattern",
               "hidden_activation"],
    "smollm3": ["no_rope_layers", "no_rope_layer_interval", "use_sliding_window"],
    "olmo2": ["attention_bias"],
    "mixtral": EXPERT_KEYS,
    "qwen3_moe": [*EXPERT_KEYS, "mlp_only_layers", "decoder_sparse_step", "norm_topk_prob"],
    "gpt_oss": [*EXPERT_KEYS, "swiglu_limit", "swiglu_alpha"],
    "deepseek_v3": ["n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts", "n_group",
                    "topk_group", "routed_scaling_factor", "first_k_dense_replace", "moe_layer_freq", "q_lora_rank",
                    "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "num_nextn_predict_layers"],
    "llama3-rope": [],
}  # fmt: skip
TOKENIZER_CONFIG_KEYS = ["bos_token", "eos_token", "add_bos_token", "add_eos_token", "chat_template"]


def _gguf_bytes(seeds: Seeds, stats: Stats, writes: Writes, cut: int | None) -> None:
    with scratch_copy(seeds.gguf) as path:
        overwrite(path, writes, cut)
        load_or_refuse(path, stats, f"GGUF bytes {writes} cut at {cut}")


def _gguf_field(seeds: Seeds, stats: Stats, key: str, value: object) -> None:
    with scratch_copy(seeds.gguf) as path:
        gguf_with(seeds.gguf, path, key, value)
        load_or_refuse(path, stats, f"GGUF {key} = {value!r:.60}")


def _safetensors_field(seeds: Seeds, stats: Stats, name: str | None, field_name: str, value: object) -> None:
    with scratch_copy(seeds.hf) as directory:
        if name is None and not isinstance(value, int):
            value = 2**62
        safetensors_with(directory / "model.safetensors", name, field_name, value)
        load_or_refuse(directory, stats, f"safetensors {name}.{field_name} = {value!r:.60}")


def _safetensors_bytes(seeds: Seeds, stats: Stats, writes: Writes) -> None:
    with scratch_copy(seeds.hf) as directory:
        overwrite(directory / "model.safetensors", writes)
        load_or_refuse(directory, stats, f"safetensors bytes {writes}")


def _json_field(seeds: Seeds, stats: Stats, file: str, key: str, value: object) -> None:
    with scratch_copy(seeds.hf) as directory:
        with_json_field(directory / file, (key,), value)
        load_or_refuse(directory, stats, f"{file} {key} = {value!r:.60}")


def _family_field(seeds: Seeds, stats: Stats, family: str, key: str | tuple, value: object) -> None:
    with scratch_copy(seeds.families[family]) as directory:
        with_json_field(directory / "config.json", key if isinstance(key, tuple) else (key,), value)
        load_or_refuse(directory, stats, f"{family} config.json {key} = {value!r:.60}")


def _family_keys(family: str) -> st.SearchStrategy:
    keys = [*CONFIG_KEYS, "rope_parameters", *ROPE_KEYS, *FAMILY_KEYS[family]]
    return st.tuples(st.just(family), st.sampled_from(keys), HOSTILE_VALUES)


def _tokenizer_bytes(seeds: Seeds, stats: Stats, writes: Writes) -> None:
    with scratch_copy(seeds.hf) as directory:
        overwrite(directory / "tokenizer.json", writes)
        load_or_refuse(directory, stats, f"tokenizer.json bytes {writes}")


def _tensor_names(seeds: Seeds) -> list[str]:
    return HFDirectorySource(seeds.hf).tensor_names()


def cases(seeds: Seeds) -> dict[str, tuple[st.SearchStrategy, Callable[..., None]]]:
    """Each kind of case: (a strategy of its arguments after the seeds and stats, the case)."""
    gguf_size, safetensors_header = seeds.gguf_header_bytes, 8 + 2000
    return {
        "GGUF header bytes": (
            st.tuples(byte_writes(gguf_size), st.none() | st.integers(0, gguf_size)),
            _gguf_bytes,
        ),
        "GGUF metadata field": (st.tuples(st.sampled_from(GGUF_KEYS), GGUF_VALUES), _gguf_field),
        "safetensors header field": (
            st.tuples(st.sampled_from([None, *_tensor_names(seeds)]), st.sampled_from(TENSOR_FIELDS), HOSTILE_VALUES),
            _safetensors_field,
        ),
        "safetensors header bytes": (st.tuples(byte_writes(safetensors_header)), _safetensors_bytes),
        "config.json field": (
            st.tuples(st.just("config.json"), st.sampled_from(CONFIG_KEYS), HOSTILE_VALUES),
            _json_field,
        ),
        "tokenizer_config.json field": (
            st.tuples(st.just("tokenizer_config.json"), st.sampled_from(TOKENIZER_CONFIG_KEYS), HOSTILE_VALUES),
            _json_field,
        ),
        "tokenizer.json bytes": (st.tuples(byte_writes(4000)), _tokenizer_bytes),
        "family config.json field": (st.sampled_from(sorted(seeds.families)).flatmap(_family_keys), _family_field),
    }


def run_cases(name: str, seeds: Seeds, stats: Stats, examples: int) -> None:
    """``examples`` cases of kind ``name``, drawn by hypothesis (which shrinks a failing one before raising it)."""
    strategy, case = cases(seeds)[name]

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(strategy)
    def run(arguments: tuple) -> None:
        case(seeds, stats, *arguments)

    run()
