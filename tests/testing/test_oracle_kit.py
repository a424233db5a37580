"""The oracle kit (refllm.testing) on refllm's own paths, and its pieces one by one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import refllm
from refllm.config import ModelConfig
from refllm.testing import (
    PROFILES,
    Checkpoint,
    ConformanceFailure,
    check_greedy,
    check_logits,
    compare_greedy_outputs,
    first_failure,
    get_profile,
    load_factory,
    refllm_llm,
    refllm_paged,
    run_conformance,
    run_properties,
)
from refllm.testing.backends import NotABackendError, as_backend
from refllm.testing.configs import ARCHITECTURES, UnknownArchitectureError, tiny_config_json
from refllm.testing.factories import BackendSpecError
from refllm.testing.repro import main as repro_main
from refllm.testing.strategies import MAX_TOTAL_TOKENS, WEIGHT_STDS, checkpoints, chunk_splits, hf_configs, schedules
from refllm.testing.checkpoint import ROUTERS
from refllm.testing.tolerances import CONDITIONING_FILE, UnknownProfileError, drawn_model
from tests.helpers import mutants
from tests.helpers.paths import ROOT

FAST = dict(seed=0, threads=1)  # tiny models: one thread is faster than waking a pool


def _assert_all_pass(results, allowed_skips=()):
    bad = [r for r in results if r.status == "failed" or (r.status == "skipped" and r.name not in allowed_skips)]
    assert not bad, "\n\n".join(f"{r.name}: {r.status}\n{r.detail}" for r in bad)


# --- refllm's own paths pass ---------------------------------------------------------------


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_numba_paged_path_conforms_to_the_spec(arch):
    results = run_conformance(refllm_paged, max_examples=6, architectures=(arch,), **FAST)
    _assert_all_pass(results, allowed_skips=("own_greedy",))  # a GenerativeModel has no sampler


def test_runtime_llm_conforms_to_the_spec():
    _assert_all_pass(run_conformance(refllm_llm, max_examples=6, **FAST))


def test_a_plain_callable_gets_the_stateless_properties_and_the_long_horizon():
    def factory(checkpoint):
        model = checkpoint.reference()
        return lambda tokens: model.prefill_all_logits(np.array([tokens]), model.create_kv_cache(), range(len(tokens)))[
            0
        ]

    results = {r.name: r for r in run_conformance(factory, max_examples=3, **FAST)}
    assert {name for name, r in results.items() if r.status == "passed"} == {"logits", "long_horizon", "greedy"}
    assert all(r.status == "skipped" for name, r in results.items() if name not in ("logits", "long_horizon", "greedy"))


# --- failures explain themselves -------------------------------------------------------------


def test_a_failure_shrinks_and_names_the_first_divergent_layer_and_a_repro(capsys):
    with pytest.raises(ConformanceFailure) as failure:
        # one architecture: the shrinker's path depends on the space it draws from, and this test is about
        # where shrinking ends and what the report says, whatever the family
        run_properties(["logits"], mutants.rope_base_off, max_examples=50, architectures=("llama",), **FAST)
    report = str(failure.value)
    assert "property 'logits' fails on backend 'RopeBaseOff'" in report
    drawn = json.loads(report.split("input:  ")[1].splitlines()[0])
    assert "1 layer," in report and len(drawn["tokens"]) == 2  # shrunk to one layer, two tokens
    assert "first diverge at the output of layer 0" in report
    repro = report.split("repro:  ")[1]
    argv = repro.split(" ", 4)  # python -m refllm.testing.repro --backend SPEC 'CASE'
    assert argv[:4] == ["python", "-m", "refllm.testing.repro", "--backend"]
    spec, case = argv[4].split(" ", 1)
    assert spec == "tests.helpers.mutants:rope_base_off"
    assert repro_main(["--backend", spec, case.strip("'")]) == 1
    assert "fails on backend 'RopeBaseOff'" in capsys.readouterr().out
    assert repro_main(["--backend", "refllm.testing.factories:refllm_paged", case.strip("'")]) == 0


def test_plain_function_checks_raise_with_an_explanation():
    checkpoint = Checkpoint.random(tiny_config_json("mistral"), seed=3)
    tokens = list(range(3, 15))
    check_logits(refllm_paged(checkpoint), checkpoint, tokens)
    check_greedy(refllm_paged(checkpoint), checkpoint, tokens[:4], new_tokens=16)
    with pytest.raises(ConformanceFailure, match="sliding window: 5") as failure:
        check_logits(mutants.sliding_window_off_by_one(checkpoint), checkpoint, tokens)
    assert "logits at position 5" in str(failure.value)  # the first position that sees past the window
    assert "case:" in str(failure.value)  # no module:factory given, so the case JSON instead of a repro line


def test_first_failure_reports_how_many_cases_it_took():
    failure, cases = first_failure(mutants.gemma_norm_everywhere, max_examples=10, threads=1)
    assert failure.property == "logits" and 1 <= cases <= 10
    assert first_failure(refllm.testing.refllm_contiguous, max_examples=1, properties=["logits"], threads=1) == (
        None,
        1,
    )


# --- greedy comparison: the near-tie rule ----------------------------------------------------


def test_near_tie_rule():
    top = np.array([[5, 6, 7]] * 3)  # each step's candidates, best first
    same = compare_greedy_outputs([5, 5, 5], top, [5, 5, 5], top, top_n=2)
    assert same.ok and same.step is None
    swapped = np.array([[6, 5, 7]] * 3)
    tie = compare_greedy_outputs([5, 5, 9], top, [5, 6, 1], swapped, top_n=2)
    assert tie.ok and tie.near_tie and tie.step == 1  # each token is the other's runner-up; nothing after counts
    one_sided = compare_greedy_outputs([5, 5], top, [5, 6], np.array([[6, 7, 5]] * 2), top_n=2)
    assert not one_sided.ok  # 6 is in this side's top 2, but 5 is not in the other's
    real = compare_greedy_outputs([5, 5], top, [5, 9], np.array([[9, 8, 7]] * 2), top_n=2)
    assert not real.ok and real.step == 1
    assert real.describe() == (
        "greedy: first real divergence at step 1 (backend 5, reference 9), after [5];"
        " backend's top 2: [5, 6], reference's top 2: [9, 8]"
    )
    wide = np.array([[5, 6, 9]] * 2)
    assert compare_greedy_outputs([5, 5], wide, [5, 9], np.array([[9, 8, 5]] * 2), top_n=3).ok  # a wider n forgives


# --- profiles, factories, adapters: refusals name the bad value --------------------------------


def test_every_profile_says_why():
    assert set(PROFILES) == {"float32", "float16", "bfloat16", "int8", "q4"}
    for profile in PROFILES.values():
        assert len(profile.reason) > 80 and profile.top_n >= 2
    tolerances = [get_profile(name).spread_tol for name in ("q4", "int8", "bfloat16", "float16", "float32")]
    assert tolerances == sorted(tolerances, reverse=True)
    with pytest.raises(UnknownProfileError, match="'fp8'"):
        get_profile("fp8")


def test_low_precision_allowances_grow_with_the_position():
    expected = np.random.default_rng(0).normal(0, 2, (3, 40))
    positions = np.array([0, 64, 192])
    bfloat16, float32 = get_profile("bfloat16"), get_profile("float32")
    at_zero = bfloat16.allowance(expected)[:, 0]
    np.testing.assert_allclose(bfloat16.allowance(expected, positions)[:, 0], at_zero * [1, np.sqrt(2), 2])
    np.testing.assert_array_equal(float32.allowance(expected, positions), float32.allowance(expected))
    actual = expected + 1.3 * at_zero[:, None]  # past the allowance at position 0, within it at 64 and 192
    assert not bfloat16.close(actual, expected) and bfloat16.close(actual[1:], expected[1:], positions[1:])
    with pytest.raises(ValueError, match="-1"):
        bfloat16.allowance(expected, -1)


def test_low_precision_profiles_take_the_allowance_measured_on_the_drawn_model():
    conditioning = json.loads(CONDITIONING_FILE.read_text())
    assert conditioning["command"].startswith("python benchmarks/calibrate_profiles.py --conditioning")
    drawn = {
        drawn_model(Checkpoint.random(tiny_config_json(arch), std=std, router=router))
        for arch in ARCHITECTURES for std in WEIGHT_STDS for router in ROUTERS
    }  # fmt: skip
    assert set(conditioning["allowances"]) == {"float16", "bfloat16", "int8"}  # the emulated profiles
    for by_model in conditioning["allowances"].values():
        assert set(by_model) == drawn  # every model the kit draws was measured

    llama_tenth = Checkpoint.random(tiny_config_json("llama"), seed=0, std=0.1)
    measured = get_profile("bfloat16").for_checkpoint(llama_tenth)
    assert measured.spread_tol == conditioning["allowances"]["bfloat16"]["llama std 0.1"] < get_profile("bfloat16").spread_tol
    assert measured.growth_positions == get_profile("bfloat16").growth_positions and "llama std 0.1" in measured.reason
    assert get_profile("float32").for_checkpoint(llama_tenth) == get_profile("float32")  # measured flat, no table
    real = Checkpoint(llama_tenth.config_json, llama_tenth._source, "a real checkpoint")  # no drawn weight std
    assert get_profile("bfloat16").for_checkpoint(real) == get_profile("bfloat16")
    custom = replace(get_profile("bfloat16"), spread_tol=0.8)  # a profile of one's own is taken as given
    assert custom.for_checkpoint(llama_tenth) == custom


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no-colon", "must look like 'module:factory'"),
        ("refllm.no_such_module:f", "cannot import 'refllm.no_such_module'"),
        ("refllm.testing:no_such_factory", "has no attribute 'no_such_factory'"),
        ("refllm.testing.hf:__doc__", "names a str, not a factory"),
    ],
)
def test_bad_backend_specs_are_refused(spec, message):
    with pytest.raises(BackendSpecError, match=message):
        load_factory(spec)


def test_an_object_without_a_contract_is_refused():
    with pytest.raises(NotABackendError, match="int is not a backend"):
        as_backend(42)


def test_unknown_architecture_is_refused():
    with pytest.raises(UnknownArchitectureError, match="'gpt2'"):
        run_conformance(refllm_paged, max_examples=1, architectures=("gpt2",))


# --- strategies and checkpoints -------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(config=hf_configs(), data=st.data())
def test_drawn_configs_build_models_and_schedules_stay_valid(config, data):
    model_config = ModelConfig.from_hf(config)
    assert model_config.context_length >= MAX_TOTAL_TOKENS
    steps = data.draw(schedules(config["vocab_size"]))
    lengths: dict[int, int] = {}
    for step in steps:
        if step[0] == "prefill":
            lengths[step[1]] = lengths.get(step[1], 0) + len(step[2])
        elif step[0] == "decode":
            assert lengths[step[1]] >= 1
            lengths[step[1]] += 1
        elif step[0] == "decode_batch":
            ids = [i for i, _ in step[1]]
            assert len(set(ids)) == len(ids) and all(lengths[i] >= 1 for i in ids)
            for i in ids:
                lengths[i] += 1
        elif step[0] == "release":
            del lengths[step[1]]
        elif step[0] == "truncate":
            assert 0 <= step[2] <= lengths[step[1]]
            lengths[step[1]] = step[2]
        else:
            lengths.clear()
        assert all(n <= MAX_TOTAL_TOKENS for n in lengths.values())
    total = data.draw(st.integers(1, 30))
    chunks = data.draw(chunk_splits(total))
    assert sum(chunks) == total and min(chunks) >= 1


def test_strategies_reach_every_architecture_and_flag():
    seen: set[str] = set()

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)  # the draws cluster: fixed
    @given(hf_configs())
    def collect(config):
        c = ModelConfig.from_hf(config)
        a = c.attention
        group = a.num_heads // getattr(a, "num_kv_heads", a.num_heads)  # latent attention: a key per head
        seen.update({c.model_type, f"group {group}", f"eps {c.norms.eps:g}"})
        seen.update(p.rope_type for p in c.rope.values())
        flags = dict(bias=a.bias, mlp_bias=c.mlp.bias, tied=c.tie_word_embeddings, cap=c.final_logit_softcapping)
        seen.update(name for name, on in flags.items() if on)
        if c.sliding_window is not None and "sliding_attention" in c.layer_types:
            seen.add("window")
        if a.rope_dim * a.num_heads != c.hidden_size:
            seen.add("own head dim")

    collect()
    wanted = {*ARCHITECTURES, "group 1", "group 2", "group 3", "eps 0.5", "linear", "dynamic", "llama3", "yarn"}
    wanted |= {"bias", "mlp_bias", "tied", "cap", "window", "own head dim"}
    assert wanted <= seen, wanted - seen


@settings(max_examples=4, deadline=None)
@given(checkpoint=checkpoints())
def test_checkpoint_in_memory_and_as_safetensors_are_the_same_model(checkpoint):
    from_files = refllm.load_model(checkpoint.path, reference=True)  # the spec ops, as checkpoint.reference()
    in_memory = checkpoint.reference()
    ids = np.arange(3, 12)[None]
    expected = in_memory.prefill_all_logits(ids, in_memory.create_kv_cache(), range(9))
    np.testing.assert_array_equal(from_files.prefill_all_logits(ids, from_files.create_kv_cache(), range(9)), expected)
    assert checkpoint.weights_sha256() == Checkpoint.open(checkpoint.path).weights_sha256()
    assert (
        checkpoint.weights_sha256() != Checkpoint.random(checkpoint.config_json, checkpoint.seed + 1).weights_sha256()
    )


# --- the pytest plugin ------------------------------------------------------------------------------


def test_pytest_plugin_runs_the_suite_and_explains_failures():
    command = [sys.executable, "-m", "pytest", "-p", "refllm.testing.plugin", "-p", "no:cacheprovider", "-q"]
    command += ["--refllm-backend", "tests.helpers.mutants:truncate_forgets_to_free", "--refllm-examples", "4"]
    command += ["--refllm-seed", "0", "--refllm-threads", "1", "--refllm-arch", "llama,qwen3"]
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)}
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "test_property[memory]" in result.stdout and "1 failed, 10 passed, 1 skipped" in result.stdout
    assert "property 'memory' fails on backend 'TruncateForgetsToFree'" in result.stdout
    assert "was refused" in result.stdout and "repro:  python -m refllm.testing.repro" in result.stdout
