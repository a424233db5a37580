"""Every fixture model's logits, saved to compare two commits: float64 bit for bit, float32 to noise.

    python tests/tools/compare_float64_logits.py run INPUTS OUT.npz
    python tests/tools/compare_float64_logits.py compare BEFORE.npz AFTER.npz

``run`` first writes, into the directory INPUTS (outside the repository), the inputs
that are not files of the repository already, unless they are there from an earlier
run (so two commits read the same files): the oracle kit's tiny config of every
architecture with its seeded random weights, as Hugging Face directories, and the
fixtures of tests/data/hf converted to GGUF as llama.cpp converts them (float32,
and a Q8_0 copy of one). Then it runs every model it finds (those, the fixtures of
tests/data/hf and the real SmolLM2 GGUF file when $REFLLM_HOME holds it):

- in float64 (the spec ops) on the contiguous cache: the logits of every position of
  a 26-token prompt at once, and of the same tokens as a 12-token prompt then one
  decode step each;
- in float32 on the paged arena (the fast ops), the same two;
- for a GGUF file, the same with its quantized blocks kept (``quantized=True``);
- for a vision-language fixture (tests/helpers/hf_vision_fixtures.py), each stored scenario's
  prompt with its images, in float64 on the contiguous cache and float32 on the paged arena.

``compare`` says, per model and run, whether the float64 logits are bit-identical
(``np.array_equal``) and how far the float32 ones moved (largest difference over
the largest logit), and exits 1 when a float64 array of the earlier run differs or is
missing from the later one (models new in the later run are listed as new).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import refllm  # noqa: E402
from refllm.kv import CacheConfig  # noqa: E402
from tests.helpers.paths import HF_DATA  # noqa: E402

PROMPT, TOTAL = 12, 26  # a 12-token prompt, then 14 decode steps (fewer where the context is shorter)
QUANTIZED_COPY = "qwen3"  # the fixture also written with Q8_0 blocks


def prepare(inputs: Path) -> None:
    """Write the kit's tiny checkpoints and the GGUF conversions into ``inputs``, unless already there."""
    from refllm.testing.checkpoint import Checkpoint
    from refllm.testing.configs import ARCHITECTURES, tiny_config_json

    for arch in ARCHITECTURES:
        directory = inputs / f"kit-{arch}"
        if not (directory / "config.json").exists():
            Checkpoint.random(tiny_config_json(arch), seed=0).save(directory)
    from tests.helpers.gguf_convert import GGUF_ARCHITECTURES, convert

    for fixture in sorted(HF_DATA.iterdir()):
        if fixture.name in vision_scenarios():
            continue  # llama.cpp's converter writes no GGUF file of a vision-language checkpoint here
        config = refllm.load_model(fixture).config
        if config.model_type not in GGUF_ARCHITECTURES:
            continue
        types = ["F32", "Q8_0"] if fixture.name == QUANTIZED_COPY else ["F32"]
        for tensor_type in types:
            path = inputs / f"gguf-{fixture.name}-{tensor_type}.gguf"
            if not path.exists():
                convert(fixture.name, path, tensor_type)


def vision_scenarios() -> dict[str, list[str]]:
    """The vision-language fixtures and their scenarios, where the repository has them."""
    try:
        from tests.helpers.hf_vision_fixtures import SCENARIOS
    except ImportError:
        return {}
    return {case: list(scenarios) for case, scenarios in SCENARIOS.items()}


def models(inputs: Path) -> dict[str, Path]:
    vision = vision_scenarios()
    found = {
        f"hf-{p.name}": p for p in sorted(HF_DATA.iterdir()) if (p / "config.json").exists() and p.name not in vision
    }
    from refllm.testing.configs import ARCHITECTURES

    found |= {f"kit-{arch}": inputs / f"kit-{arch}" for arch in ARCHITECTURES}
    found |= {p.name: p for p in sorted(inputs.iterdir()) if p.suffix == ".gguf"}
    real = Path(os.environ.get("REFLLM_HOME", Path.home() / ".cache" / "refllm"))
    real /= "models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"
    if real.exists():
        found["real-smollm2-135m"] = real
    return found


def logits_of(path: Path, dtype: str, kind: str, quantized: bool = False) -> dict[str, np.ndarray]:
    model = refllm.load_model(path, dtype=dtype, quantized=quantized)
    total = min(TOTAL, model.metadata.context_length)  # a GGUF file without dynamic RoPE's stretch: 16
    prompt = min(PROMPT, total // 2)
    tokens = np.random.default_rng(7).integers(0, min(model.metadata.vocab_size, 128), size=(1, total))
    cache = model.create_kv_cache(CacheConfig(kind=kind, block_size=4))
    at_once = model.prefill_all_logits(tokens, cache, range(total))[0]
    cache = model.create_kv_cache(CacheConfig(kind=kind, block_size=4))
    steps = [model.prefill(tokens[:, :prompt], cache, range(prompt))[0]]
    steps += [model.decode(tokens[:, [t]], cache)[0] for t in range(prompt, total)]
    return {"all": at_once, "steps": np.stack(steps)}


def vision_logits(path: Path, scenario: str, dtype: str, kind: str) -> np.ndarray:
    """The stored scenario's prompt, its images spliced in, at every position: [T, V]."""
    stored = np.load(path / "reference.npz")
    ref = {key.split(".", 1)[1]: stored[key] for key in stored if key.startswith(scenario + ".")}
    model = refllm.load_model(path, dtype=dtype)
    ids = ref["input_ids"][None]
    images = []
    if "pixel_values" in ref:
        images = np.split(ref["pixel_values"].astype(dtype), np.cumsum(ref["tiles_per_image"])[:-1])
    x = model.embed_multimodal(ids, images)
    cache = model.create_kv_cache(CacheConfig(kind=kind, block_size=4))
    return model.prefill_all_logits(x, cache, range(ids.shape[1]), image_spans=[model.image_spans(ids[0])])[0]


def run(inputs: Path, out: Path) -> None:
    inputs.mkdir(parents=True, exist_ok=True)
    prepare(inputs)
    arrays = {}
    for name, path in models(inputs).items():
        runs = {"float64": ("float64", "contiguous", False), "float32": ("float32", "paged", False)}
        if path.suffix == ".gguf":
            runs["quantized"] = ("float32", "paged", True)
        for label, (dtype, kind, quantized) in runs.items():
            for run_name, logits in logits_of(path, dtype, kind, quantized).items():
                arrays[f"{name}/{label}/{run_name}"] = logits
        print(f"{name}: done", flush=True)
    for case, scenarios in vision_scenarios().items():
        for scenario in scenarios:
            for dtype, kind in (("float64", "contiguous"), ("float32", "paged")):
                arrays[f"vision-{case}-{scenario}/{dtype}/all"] = vision_logits(HF_DATA / case, scenario, dtype, kind)
        print(f"vision-{case}: done", flush=True)
    np.savez_compressed(out, **arrays)
    print(f"{len(arrays)} arrays -> {out}")


def compare(before_path: Path, after_path: Path) -> int:
    before, after = np.load(before_path), np.load(after_path)
    failures = 0
    for key in sorted(set(before.files) | set(after.files)):
        if key not in after.files:
            print(f"{key:60s} MISSING")
            failures += key.split("/")[1] == "float64"
            continue
        if key not in before.files:
            print(f"{key:60s} new (a model the earlier run did not have)")
            continue
        old, new = before[key], after[key]
        same = old.shape == new.shape and np.array_equal(old, new)
        if key.split("/")[1] == "float64":
            print(f"{key:60s} {'bit-identical' if same else 'DIFFERENT'}")
            failures += not same
        else:
            moved = np.max(np.abs(old - new)) / np.max(np.abs(old)) if old.shape == new.shape else np.inf
            print(f"{key:60s} {'bit-identical' if same else f'moved {moved:.2e} of the largest logit'}")
    compared = sum(key.split("/")[1] == "float64" and key in after.files for key in before.files)
    print(f"{compared} float64 arrays compared, {failures} different or missing")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run_parser = commands.add_parser("run", help="write the inputs if missing, then save every model's logits")
    run_parser.add_argument("inputs", type=Path)
    run_parser.add_argument("out", type=Path)
    compare_parser = commands.add_parser("compare", help="compare two saved runs")
    compare_parser.add_argument("before", type=Path)
    compare_parser.add_argument("after", type=Path)
    args = parser.parse_args()
    if args.command == "run":
        run(args.inputs, args.out)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
