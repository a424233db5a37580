"""Golden files: a model's outputs on a set of prompts, in one safetensors file any language can read.

    refllm golden dump --model M --prompts prompts.txt --out golden.safetensors
    refllm golden check golden.safetensors --backend mypkg.backend:factory

``dump`` runs the reference (refllm's spec path, in float32 or, with
``dtype="float64"``, in float64: the truth) and records, per
prompt, the token ids, logits at the last and at chosen positions (full and
top-k), a greedy continuation with each step's top-k, and optionally the
hidden states around every layer, plus metadata naming the model, a hash of
its weights and the tolerance profile to check with. ``check`` builds the
backend from the same weights, compares prompt by prompt (logits under the
profile, greedy tokens under the near-tie rule), prints a report and exits
non-zero on any failure. The format is specified in docs/golden-format.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import refllm
from refllm.errors import InvalidInputError
from refllm.models.decoder import dtype_name
from refllm.testing.backends import Backend, as_backend
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.explain import count, state_name
from refllm.testing.factories import refllm_contiguous, refllm_float64
from refllm.testing.greedy import compare_greedy_outputs, greedy_tokens, top_candidates
from refllm.testing.kld import KLStatistics, kl_statistics
from refllm.testing.tolerances import Tolerance, get_profile

FORMAT = "refllm-golden"
FORMAT_VERSION = "1"
DEFAULT_BACKEND = "refllm.testing.factories:refllm_paged"


class GoldenFormatError(InvalidInputError):
    """A file that is not a golden file this version of refllm reads, or a prompts file it cannot parse."""


class GoldenModelMismatchError(InvalidInputError):
    """The model given to ``check`` is not the one the golden file was made from."""


@dataclass(frozen=True)
class Prompt:
    text: str | None  # None for a prompt given as token ids
    token_ids: list[int]


def read_prompts(path: str | Path, tokenizer) -> list[Prompt]:
    """One prompt per line: a JSON array of token ids, or text (encoded with ``tokenizer``). Blank lines are skipped."""
    prompts = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("["):
            try:
                ids = json.loads(line)
            except json.JSONDecodeError as error:
                raise GoldenFormatError(f"{path}:{number}: not a JSON array of token ids ({error})") from None
            if not ids or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
                raise GoldenFormatError(f"{path}:{number}: {line.strip()[:60]!r} is not a non-empty list of token ids")
            prompts.append(Prompt(None, ids))
        elif tokenizer is None:
            raise GoldenFormatError(
                f"{path}:{number}: a text prompt needs a model with a tokenizer; give token ids as a JSON array"
            )
        else:
            prompts.append(Prompt(line, tokenizer.encode(line)))
    if not prompts:
        raise GoldenFormatError(f"{path} holds no prompts")
    return prompts


def chosen_positions(length: int, count: int) -> np.ndarray:
    """Up to ``count`` positions spread evenly over [0, length), always ending with the last. [P] int64."""
    return np.unique(np.linspace(0, length - 1, min(count, length)).round().astype(np.int64))


@dataclass(frozen=True)
class DumpOptions:
    """What ``dump`` records per prompt."""

    new_tokens: int = 32
    top_k: int = 10
    positions: int = 8
    hidden_states: bool = False


def golden_reference(checkpoint: Checkpoint, dtype: str = "float32") -> Backend:
    """The reference a golden file records: refllm's spec path in ``dtype``."""
    return {"float32": refllm_contiguous, "float64": refllm_float64}[dtype_name(dtype)](checkpoint)


def prompt_tensors(
    reference: Backend, context: int, i: int, prompt: Prompt, options: DumpOptions
) -> dict[str, np.ndarray]:
    """The golden file's tensors of prompt ``i``; one that cannot fit ``context`` with its new tokens is refused."""
    ids = np.asarray(prompt.token_ids, np.int64)
    if len(ids) + options.new_tokens > context:
        text = "" if prompt.text is None else f" ({prompt.text[:40]!r})"
        raise InvalidInputError(
            f"prompt {i}{text} has {len(ids)} tokens; with {options.new_tokens} new ones it passes"
            f" the context length {context}"
        )
    everything = reference.all_logits(ids)  # [T, V]
    chosen = chosen_positions(len(ids), options.positions)
    top = top_candidates(everything[chosen], options.top_k)  # [P, k]
    greedy, greedy_top = greedy_tokens(reference, ids, options.new_tokens, options.top_k)
    tensors = {
        f"prompt.{i}.token_ids": ids,
        f"prompt.{i}.last_logits": everything[-1],
        f"prompt.{i}.positions": chosen,
        f"prompt.{i}.logits": everything[chosen],
        f"prompt.{i}.topk_ids": top.astype(np.int64),
        f"prompt.{i}.topk_logits": np.take_along_axis(everything[chosen], top, axis=-1),
        f"prompt.{i}.greedy_ids": np.asarray(greedy, np.int64),
        f"prompt.{i}.greedy_topk_ids": greedy_top.astype(np.int64),
    }
    if options.hidden_states:
        tensors[f"prompt.{i}.hidden_states"] = reference.layer_states(ids)
    return tensors


def golden_metadata(
    checkpoint: Checkpoint, prompts: list[Prompt], model: str, profile: str, options: DumpOptions, dtype: str
) -> dict[str, str]:
    """The golden file's metadata (docs/golden-format.md); an unknown ``profile`` is refused."""
    get_profile(profile)
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "refllm_version": refllm.__version__,
        "model": model,
        "config": json.dumps(
            checkpoint.config_json if checkpoint.config_json is not None else vars(checkpoint.config), default=str
        ),
        "weights_sha256": checkpoint.weights_sha256(),
        "dtype": dtype_name(dtype),
        "tolerance_profile": profile,
        "num_prompts": str(len(prompts)),
        "new_tokens": str(options.new_tokens),
        "top_k": str(options.top_k),
        "prompts": json.dumps([p.text for p in prompts]),
    }


def write_golden(tensors: dict[str, np.ndarray], metadata: dict[str, str], out: str | Path) -> None:
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(out), metadata=metadata)


def dump(
    checkpoint: Checkpoint,
    prompts: list[Prompt],
    out: str | Path,
    model: str,
    profile: str = "float32",
    new_tokens: int = 32,
    top_k: int = 10,
    positions: int = 8,
    hidden_states: bool = False,
    dtype: str = "float32",
) -> dict[str, str]:
    """Run the reference on ``prompts`` in ``dtype`` and write the golden file ``out`` -> its metadata.

    The logits and hidden states are stored in ``dtype`` (F32 or F64 tensors; the metadata's ``dtype``
    says which): a float64 file holds the truth a backend's error is measured against.
    """
    options = DumpOptions(new_tokens, top_k, positions, hidden_states)
    metadata = golden_metadata(checkpoint, prompts, model, profile, options, dtype)
    reference, context = golden_reference(checkpoint, dtype), checkpoint.config.context_length
    tensors: dict[str, np.ndarray] = {}
    for i, prompt in enumerate(prompts):
        tensors |= prompt_tensors(reference, context, i, prompt, options)
    write_golden(tensors, metadata, out)
    return metadata


@dataclass(frozen=True)
class Golden:
    metadata: dict[str, str]
    tensors: dict[str, np.ndarray]

    @classmethod
    def load(cls, path: str | Path) -> Golden:
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), "np") as f:
                metadata = f.metadata() or {}
                tensors = {name: f.get_tensor(name) for name in f.keys()}
        except (SafetensorError, OSError) as error:
            raise GoldenFormatError(f"{path} is not a readable safetensors file ({error})") from None
        if metadata.get("format") != FORMAT:
            raise GoldenFormatError(
                f"{path} is not a golden file: its format is {metadata.get('format')!r}, not {FORMAT!r}"
            )
        if metadata.get("format_version") != FORMAT_VERSION:
            version = metadata.get("format_version")
            raise GoldenFormatError(
                f"{path} has golden format version {version!r}; this refllm reads {FORMAT_VERSION!r}"
            )
        return cls(metadata, tensors)

    @property
    def num_prompts(self) -> int:
        return int(self.metadata["num_prompts"])

    def get(self, i: int, field: str) -> np.ndarray | None:
        return self.tensors.get(f"prompt.{i}.{field}")

    def require(self, i: int, field: str) -> np.ndarray:
        array = self.get(i, field)
        if array is None:
            raise GoldenFormatError(f"golden file has no tensor 'prompt.{i}.{field}'")
        return array


@dataclass(frozen=True)
class PromptReport:
    index: int
    ok: bool
    line: str
    logits: np.ndarray | None = None  # the backend's [P, V] at the stored positions that have a next token
    expected: np.ndarray | None = None  # the golden's, the same rows
    next_tokens: np.ndarray | None = None  # [P]


def check_golden_prompt(golden: Golden, i: int, backend: Backend, profile: Tolerance) -> PromptReport:
    """Compare one prompt's stored outputs with the backend's."""
    ids = golden.require(i, "token_ids").tolist()
    chosen, expected = golden.require(i, "positions"), golden.require(i, "logits")  # [P], [P, V]
    actual = np.asarray(backend.all_logits(ids))[chosen]
    results = [_check_logits(actual, chosen, expected, profile), _check_greedy(golden, i, backend, profile)]
    if golden.get(i, "hidden_states") is not None:
        results.append(_check_hidden(golden, i, backend, profile))
    ok = all(passed for passed, _ in results)
    text = golden_prompts(golden)[i]
    label = f"prompt {i} ({count(len(ids), 'token')}{', ' + repr(text[:30]) if text else ''})"
    line = f"{label} {'ok' if ok else 'FAIL'}: " + "; ".join(finding for _, finding in results)
    inner = chosen < len(ids) - 1
    if actual.shape != expected.shape:
        return PromptReport(i, ok, line)
    return PromptReport(i, ok, line, actual[inner], expected[inner], np.asarray(ids)[chosen[inner] + 1])


def golden_kl(reports: list[PromptReport]) -> KLStatistics | None:
    """KL statistics over the stored positions (those with a next token) of every prompt; None if there are none."""
    usable = [r for r in reports if r.logits is not None and len(r.logits)]
    if not usable:
        return None
    return kl_statistics(
        np.concatenate([r.logits for r in usable]),
        np.concatenate([r.expected for r in usable]),
        np.concatenate([r.next_tokens for r in usable]),
    )


def _check_logits(actual: np.ndarray, chosen: np.ndarray, expected: np.ndarray, profile: Tolerance) -> tuple[bool, str]:
    if actual.shape != expected.shape:
        return False, f"logits have shape {actual.shape}, the golden's {expected.shape}"
    excess, delta = profile.excess(actual, expected), np.abs(actual - expected)
    if np.any(excess > 0):
        row = int(np.unravel_index(np.argmax(excess), excess.shape)[0])
        return False, (
            f"logits differ: max |Δ| {delta.max():.3g}, worst at position {chosen[row]}"
            f" (allowed {profile.describe()})"
        )
    return True, f"logits max |Δ| {delta.max():.2g} at {count(len(chosen), 'position')}"


def _check_greedy(golden: Golden, i: int, backend: Backend, profile: Tolerance) -> tuple[bool, str]:
    stored, stored_top = golden.require(i, "greedy_ids"), golden.require(i, "greedy_topk_ids")  # [N], [N, k]
    tokens, top = greedy_tokens(backend, golden.require(i, "token_ids").tolist(), len(stored), stored_top.shape[1])
    comparison = compare_greedy_outputs(tokens, top, stored.tolist(), stored_top, profile.top_n)
    if comparison.step is None:
        return True, f"greedy {len(stored)}/{len(stored)} agree"
    return comparison.ok, comparison.describe("backend", "golden")


def _check_hidden(golden: Golden, i: int, backend: Backend, profile: Tolerance) -> tuple[bool, str]:
    expected = golden.require(i, "hidden_states")  # [L + 1, T, D]
    states = backend.layer_states(golden.require(i, "token_ids").tolist())
    if states is None:
        return True, f"hidden states not compared ({backend.name} exposes none)"
    if np.shape(states) != expected.shape:
        return False, f"hidden states have shape {np.shape(states)}, the golden's {expected.shape}"
    for index, (got, want) in enumerate(zip(states, expected)):
        if not profile.close(got, want):
            return False, f"hidden states first diverge at {state_name(index)}"
    return True, "hidden states agree"


def golden_prompts(golden: Golden) -> list[str | None]:
    return json.loads(golden.metadata.get("prompts", "null")) or [None] * golden.num_prompts


def check(golden: Golden, backend, profile: str | Tolerance | None = None) -> list[PromptReport]:
    """Every prompt of ``golden`` against ``backend`` under ``profile`` (default: the file's)."""
    if golden.metadata.get("images"):
        raise GoldenFormatError("this golden file carries images; check it with refllm.testing.vision_golden")
    profile = get_profile(profile or golden.metadata.get("tolerance_profile", "float32"))
    backend = as_backend(backend)
    return [check_golden_prompt(golden, i, backend, profile) for i in range(golden.num_prompts)]
