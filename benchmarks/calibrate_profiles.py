"""Measure the logit error of each arithmetic against float64 truth, relative to the logits' spread.

    python benchmarks/calibrate_profiles.py [--seeds 8]
    python benchmarks/calibrate_profiles.py --horizons 1000 --seed 0   the profiles at every horizon
    python benchmarks/calibrate_profiles.py --check 1000 --seed 7      the kit on each emulated engine
    python benchmarks/calibrate_profiles.py --gallery bfloat16         the mutant gallery under a profile
    python benchmarks/calibrate_profiles.py --gallery bfloat16:0.8     ... under it flat at spread_tol 0.8
    python benchmarks/calibrate_profiles.py --gallery int8 --cases 300 --mutants a,b   ... those, 300 cases a property
    python benchmarks/calibrate_profiles.py --conditioning 4000 --seed 0  each profile's allowance by drawn model
    python benchmarks/calibrate_profiles.py --check 1000 --seed 7 --profile bfloat16:0.8   (the 24-token one)

For every architecture's tiny config, several weight seeds and weight scales
(std 0.02, 0.1, 0.5: logits from near-uniform to peaked), and a prompt of 24
token ids over the whole vocabulary, it runs refllm's spec forward in
float64 (the truth) and in each arithmetic a backend may use:

    float32   the float32 spec ops, and the fast ops over the paged arena
    float16   weights and every projection's input rounded to float16 (and attention's q, k, v)
    bfloat16  the same, rounded to bfloat16 (8 significant bits)
    int8      weights in blocks of 32 (or the row) quantized to 8 bits (Q8_0's absmax scale), float32 math
    q4        the same with 4 bits (Q4_0's 16 levels)

and records, per position, max |logits - truth| / std(truth) over the
vocabulary. It prints the percentiles of that ratio per arithmetic; each
profile in ``refllm/testing/tolerances.py`` is the worst ratio observed
times a margin, both stated in its reason (docs/oracle.md has the table).

``--horizons N`` measures the engines of ``refllm/testing/emulated.py`` (right
but for their rounding) on N of the kit's own ``long_horizon`` draws, up to
320 positions, by position; the low-precision profiles' spread_tol is twice the
worst ratio over their growth sqrt(1 + t / 64). ``--check N`` runs the kit's
properties on each of those engines under its profile (0 false alarms is the
claim), ``--gallery PROFILE`` the mutant gallery under a profile (what the
profile still catches). ``--conditioning N`` measures those engines against
the float32 spec by drawn model (architecture, weight std, routers) and writes
each low-precision profile's allowance per model to
``refllm/testing/conditioning.json``, which ``Tolerance.for_checkpoint`` reads.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from refllm.kv.base import CacheConfig
from refllm.models.decoder import DecoderModel
from refllm.models.ops import SPEC_OPS
from refllm.nn.attention import attention
from refllm.nn.linear import linear
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.configs import ARCHITECTURES, tiny_config_json
from refllm.testing.emulated import EMULATED, bfloat16_round, float16_round
from refllm.testing.factories import refllm_contiguous, refllm_float64
from refllm.testing.compare import ConformanceFailure
from refllm.testing.suite import cases, first_failure, run_properties
from refllm.testing.tolerances import (
    CONDITIONING_FILE,
    CONDITIONING_MARGIN,
    PROFILES,
    Tolerance,
    drawn_model,
    get_profile,
)

WEIGHT_STDS = (0.02, 0.1, 0.5)
PROMPT_LENGTH = 24


def rounded_ops(round_to):
    """The spec ops with each projection's input and weight, and attention's inputs, rounded by ``round_to``."""

    def rounded_linear(x, weight, bias=None):
        return linear(round_to(x), round_to(weight), bias)

    def rounded_attention(q, k, v, *args, **options):
        return attention(round_to(q), round_to(k), round_to(v), *args, **options)

    return replace(SPEC_OPS, name="rounded", linear=rounded_linear, attention=rounded_attention)


def block_quantized(weight: np.ndarray, bits: int) -> np.ndarray:
    """Symmetric absmax block quantization (Q8_0 / Q4_0 style) along the input dim, dequantized to float32."""
    rows, cols = weight.shape
    block = 32 if cols % 32 == 0 else cols
    blocks = weight.reshape(rows, cols // block, block).astype(np.float64)
    if bits == 8:
        scale = np.abs(blocks).max(-1, keepdims=True) / 127
        levels = np.round(blocks / np.where(scale == 0, 1, scale))
    else:  # Q4_0: d = max / -8 over the signed extreme, levels -8..7
        extreme = np.take_along_axis(blocks, np.abs(blocks).argmax(-1)[..., None], -1)
        scale = extreme / -8
        levels = np.clip(np.round(blocks / np.where(scale == 0, 1, scale)), -8, 7)
    return (levels * scale).reshape(rows, cols).astype(np.float32)


def quantized_checkpoint(checkpoint: Checkpoint, bits: int) -> Checkpoint:
    from refllm.models.contract import InMemorySource

    tensors = {
        name: block_quantized(array, bits) if array.ndim == 2 and "embed" not in name else array
        for name, array in checkpoint.tensors.items()
    }
    source = InMemorySource(checkpoint.config, tensors)
    return Checkpoint(checkpoint.config_json, source, f"{checkpoint.description}, {bits}-bit weights")


def spread_errors(logits: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """[T, V] each -> max |Δ| / std(truth) per position, [T]."""
    return np.abs(np.asarray(logits, np.float64) - truth).max(-1) / truth.std(-1)


def arithmetics(checkpoint: Checkpoint) -> dict:
    """Name -> a function tokens -> all-position logits [T, V]."""

    def run(model, cache_config=None):
        def all_logits(tokens):
            cache = model.create_kv_cache(cache_config)
            return model.prefill_all_logits(np.array([tokens]), cache, range(len(tokens)))[0]

        return all_logits

    def rounded(round_to):
        model = DecoderModel.load(checkpoint, ops=rounded_ops(round_to))
        return run(model, CacheConfig(kind="contiguous"))

    return {
        "float32 spec": run(checkpoint.reference(), CacheConfig(kind="contiguous")),
        "float32 fast paged": run(DecoderModel.load(checkpoint), CacheConfig(kind="paged", block_size=4)),
        "float16": rounded(float16_round),
        "bfloat16": rounded(bfloat16_round),
        "int8": run(quantized_checkpoint(checkpoint, 8).reference(), CacheConfig(kind="contiguous")),
        "q4": run(quantized_checkpoint(checkpoint, 4).reference(), CacheConfig(kind="contiguous")),
    }


def measure(seeds: int) -> dict[str, np.ndarray]:
    errors: dict[str, list[np.ndarray]] = {}
    rng = np.random.default_rng(0)
    for arch in ARCHITECTURES:
        for seed in range(seeds):
            for std in WEIGHT_STDS:
                checkpoint = Checkpoint.random(tiny_config_json(arch), seed, std=std)
                tokens = rng.integers(0, checkpoint.config.vocab_size, PROMPT_LENGTH).tolist()
                truth = checkpoint.reference("float64")
                expected = truth.prefill_all_logits(np.array([tokens]), truth.create_kv_cache(), range(len(tokens)))[0]
                for name, all_logits in arithmetics(checkpoint).items():
                    errors.setdefault(name, []).append(spread_errors(all_logits(tokens), expected))
    return {name: np.concatenate(values) for name, values in errors.items()}


FLIPPING_STD = 1.0  # random routers of this weight std flip under rounding often enough to need the profile's own
POSITION_BINS = (0, 32, 64, 128, 256, 321)  # edges; the kit's longest long_horizon sequence is 320


def horizon_errors(
    case_count: int, seed: int, reference: Callable = refllm_float64
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Each emulated engine (and the float32 spec) against ``reference`` (float64 truth) on the kit's own
    ``long_horizon`` draws -> (position, model, {name: max |Δ| / std(reference)}), one entry per position of
    every case; the model is named as ``Tolerance.for_checkpoint`` looks it up (``drawn_model``)."""
    engines = {"float32 spec": refllm_contiguous} | {name: factory for name, (factory, _) in EMULATED.items()}
    positions: list[np.ndarray] = []
    models: list[str] = []
    ratios: dict[str, list[np.ndarray]] = {name: [] for name in engines}

    @settings(max_examples=case_count, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=cases(("long_horizon",), "float32"))
    def measure_case(case) -> None:
        checkpoint, tokens = case.checkpoint(), case.args["tokens"]
        truth = reference(checkpoint).all_logits(tokens)
        positions.append(np.arange(len(tokens)))
        models.extend([drawn_model(checkpoint)] * len(tokens))
        for name, factory in engines.items():
            ratios[name].append(spread_errors(factory(checkpoint).all_logits(tokens), truth))

    hypothesis_seed(seed)(measure_case)()
    return np.concatenate(positions), np.array(models), {name: np.concatenate(v) for name, v in ratios.items()}


def print_horizons(case_count: int, seed: int) -> None:
    started = time.perf_counter()
    at, models, measured = horizon_errors(case_count, seed)
    print(f"max |Δ| / std(truth logits) by position, {case_count} long_horizon draws of the kit (seed {seed}),"
          f" {time.perf_counter() - started:.0f} s")  # fmt: skip
    bins = list(zip(POSITION_BINS[:-1], POSITION_BINS[1:]))
    print(f"{'engine':22} {'profile':9}" + "".join(f" {f'{lo}-{hi - 1}':>17}" for lo, hi in bins) + "   (p99.9 / max)")
    for name, ratios in measured.items():
        profile = EMULATED[name][1] if name in EMULATED else "float32"
        cells = []
        for lo, hi in bins:
            inside = ratios[(at >= lo) & (at < hi)]
            cells.append(f"{np.percentile(inside, 99.9):8.2g}/{inside.max():<8.2g}" if len(inside) else "-")
        tolerance = PROFILES[profile]
        needed = (ratios / tolerance.growth(at)).max()
        print(f"{name:22} {profile:9}" + "".join(f" {cell:>17}" for cell in cells)
              + f"   worst / growth {needed:.3g} at {at[np.argmax(ratios / tolerance.growth(at))]},"
              f" spread_tol {tolerance.spread_tol:g}: margin {tolerance.spread_tol / needed:.2g}")  # fmt: skip
    print("the worst models (architecture, weight std: worst ratio)")
    for name, ratios in measured.items():
        worst = {model: ratios[models == model].max() for model in np.unique(models)}
        ranked = sorted(worst, key=worst.get, reverse=True)[:5]
        print(f"{name:22} " + ", ".join(f"{model}: {worst[model]:.2g}" for model in ranked))


def write_conditioning(case_count: int, seed: int) -> None:
    """Measure each emulated engine against the float32 spec (what every property compares with, or
    within it) by drawn model, and write each low-precision profile's allowance per model to
    CONDITIONING_FILE: CONDITIONING_MARGIN x the worst ratio over the growth, of any engine of the profile
    (for routers drawn to tie, or of weights of std FLIPPING_STD, at least the profile's own spread_tol)."""
    started = time.perf_counter()
    at, models, measured = horizon_errors(case_count, seed, reference=refllm_contiguous)
    worst: dict[str, dict[str, float]] = {}
    for name, (_, profile) in EMULATED.items():
        needed = measured[name] / PROFILES[profile].growth(at)
        for model in np.unique(models):
            by_model = worst.setdefault(profile, {})
            by_model[str(model)] = max(by_model.get(str(model), 0.0), float(needed[models == model].max()))
    def allowance(profile: str, model: str, ratio: float) -> float:
        # where rounding makes routers pick other experts now and then (scores drawn to tie, or weights of
        # std 1), the errors' tail is too heavy for a sample's worst: keep the profile's own if larger
        std, _, routers = model.partition(" std ")[2].partition(" ")
        flips = routers.endswith("router") and (routers != "random router" or float(std) >= FLIPPING_STD)
        return max(float(f"{CONDITIONING_MARGIN * ratio:.2g}"), PROFILES[profile].spread_tol if flips else 0.0)

    allowances = {
        profile: {model: allowance(profile, model, ratio) for model, ratio in sorted(by_model.items())}
        for profile, by_model in worst.items()
    }
    command = f"python benchmarks/calibrate_profiles.py --conditioning {case_count} --seed {seed}"
    CONDITIONING_FILE.write_text(json.dumps(
        {"command": command, "margin": CONDITIONING_MARGIN, "allowances": allowances}, indent=1) + "\n"
    )  # fmt: skip
    print(f"{command}: {len(np.unique(models))} models, {len(at)} positions ({time.perf_counter() - started:.0f} s)")
    for profile, by_model in allowances.items():
        print(f"{profile:9} spread_tol by model (the profile's own, for any other model: {PROFILES[profile].spread_tol:g})")
        print("    " + ", ".join(f"{model}: {value:g}" for model, value in by_model.items()))


def profile_named(text: str) -> Tolerance:
    """"bfloat16" -> that profile; "bfloat16:0.8" -> the same flat at spread_tol 0.8 (an old or proposed one)."""
    name, _, spread_tol = text.partition(":")
    profile = get_profile(name)
    if not spread_tol:
        return profile
    return replace(profile, spread_tol=float(spread_tol), growth_positions=None, reason=f"{name} flat at {spread_tol}")


def check_emulated(case_count: int, seed: int, properties: tuple[str, ...], profile: str | None) -> None:
    """Run the kit on each emulated engine under its profile (or only those of ``profile``'s name, under it):
    cases run, and the first failure if any."""
    for name, (factory, own) in EMULATED.items():
        tolerance = profile_named(profile or own)
        if tolerance.name != own:
            continue
        started = time.perf_counter()
        failure = ""
        try:
            runs = run_properties(properties, factory, tolerance, case_count, shrink=False, seed=seed, threads=1)
        except ConformanceFailure as error:
            runs, failure = error.examples, str(error).splitlines()[0]
        seconds = time.perf_counter() - started
        allowed = "by drawn model" if tolerance == PROFILES[own] else tolerance.describe()
        print(f"{name:22} {tolerance.name} {allowed}: {', '.join(properties)}: {runs} cases,"
              f" {1 if failure else 0} false alarms ({seconds:.0f} s) {failure}", flush=True)  # fmt: skip


def gallery_under(profile: str, max_cases: int, names: tuple[str, ...] = ()) -> None:
    """The mutant gallery (tests/helpers/mutants.py), or its mutants ``names``, under ``profile``: which
    mutants the kit still catches."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root, for tests.helpers
    from tests.helpers.mutants import MUTANTS

    started, missed = time.perf_counter(), []
    mutants = [mutant for mutant in MUTANTS if not names or mutant.__name__ in names]
    for mutant in mutants:
        try:
            failure, cases_run = first_failure(
                mutant, max_examples=max_cases, profile=profile_named(profile), threads=1
            )
            found = f"caught by {failure.property} after {cases_run} cases" if failure else None
        except Exception as error:  # noqa: BLE001 - a mutant that crashes on a drawn case is found too
            found = f"raised {type(error).__name__}"
        print(f"  {mutant.__name__:36} {found or f'MISSED after {cases_run} cases'}", flush=True)
        missed += [] if found else [mutant.__name__]
    print(f"{profile}: {len(mutants) - len(missed)}/{len(mutants)} mutants caught, up to {max_cases} cases a property"
          f" ({time.perf_counter() - started:.0f} s)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=8, help="weight seeds per architecture and scale (default 8)")
    parser.add_argument("--horizons", type=int, default=0, metavar="N",
                        help="also measure the emulated engines on N of the kit's long_horizon draws")  # fmt: skip
    parser.add_argument("--conditioning", type=int, default=0, metavar="N",
                        help="measure the emulated engines by drawn model on N draws; write the allowances")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0, help="hypothesis seed of those draws (default 0)")
    parser.add_argument("--check", type=int, default=0, metavar="N",
                        help="run N cases of the kit's properties (--properties) on each emulated engine")  # fmt: skip
    parser.add_argument("--properties", default="long_horizon", help="comma-separated (default long_horizon)")
    parser.add_argument("--gallery", metavar="PROFILE", help="run the mutant gallery under this profile")
    parser.add_argument("--cases", type=int, default=60, help="--gallery: cases a property (default 60, as its test)")
    parser.add_argument("--mutants", default="", help="--gallery: only these mutants (comma-separated)")
    parser.add_argument("--profile", help="--check only the engines of this profile, under it (NAME or NAME:TOL)")
    args = parser.parse_args()
    if args.gallery:
        gallery_under(args.gallery, args.cases, tuple(filter(None, args.mutants.split(","))))
        return
    if args.conditioning:
        write_conditioning(args.conditioning, args.seed)
        return
    if args.check:
        check_emulated(args.check, args.seed, tuple(args.properties.split(",")), args.profile)
        return
    if args.horizons:
        print_horizons(args.horizons, args.seed)
        return
    measured = measure(args.seeds)
    print("max |Δ| / std(truth logits) per position, against float64 truth")
    print(f"{'arithmetic':20} {'positions':>9} {'median':>9} {'p99':>9} {'p99.9':>9} {'max':>9}")
    for name, ratios in measured.items():
        p50, p99, p999 = np.percentile(ratios, [50, 99, 99.9])
        print(f"{name:20} {len(ratios):9} {p50:9.2e} {p99:9.2e} {p999:9.2e} {ratios.max():9.2e}")


if __name__ == "__main__":
    main()
