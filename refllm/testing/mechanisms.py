"""How often the draws reach each mechanism: the expected number of cases per default run.

A mechanism is something a backend can get wrong that only some drawn cases reach: a
family's setting (SmolLM3's NoPE layers derived from an interval, DeepSeek-V3's scaling
factor under renormalisation), a pattern in the weights (router scores that tie) or a
path (decode_batch over several rows, a plain callable past position 24). A bug in a
mechanism is caught only by a case that exercises it, so every mechanism must be reached
several times by a default run: DEFAULT_EXAMPLES cases per property, as the pytest
plugin runs them.

``expected_cases()`` draws the cases of default runs under several seeds, the way the
runner draws them, and averages how many exercise each mechanism;

    python -m refllm.testing.mechanisms [--examples N] [--runs R]

prints the table, fewest first.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed

from refllm.config import ModelConfig
from refllm.testing.configs import ARCHITECTURES, optional_keys
from refllm.testing.explain import Case
from refllm.testing.properties import PROPERTIES
from refllm.testing.strategies import MOE_ARCHITECTURES
from refllm.testing.suite import cases

DEFAULT_EXAMPLES = 25  # cases per property in a default run (the pytest plugin's --refllm-examples)
DEFAULT_RUNS = 20  # seeds averaged over: hypothesis' runs of 25 cases vary a lot
LEAST_EXPECTED = 5  # cases a default run must be expected to spend on every mechanism
CALLABLE_HORIZON = 24  # the longest prompt the logits property draws


@dataclass(frozen=True)
class Drawn:
    """A drawn case with its config read by refllm, for the mechanisms' predicates."""

    case: Case
    config: ModelConfig

    @property
    def keys(self) -> dict:
        return self.case.config_json

    @property
    def family(self) -> str:
        return self.keys["model_type"]

    @property
    def sparse(self) -> bool:
        return any(self.config.is_sparse(layer) for layer in range(self.config.num_hidden_layers))

    @property
    def tied_router(self) -> bool:
        """Whether router scores tie (duplicated rows, saturated or not)."""
        return self.sparse and self.case.weights.get("router", "random") != "random"

    @property
    def rows_batched(self) -> bool:
        """Whether the case decodes several sequences in one call (decode_batch, or forked branches)."""
        if self.case.property in ("batch", "branches"):
            return True
        steps = self.case.args.get("steps", []) if self.case.property == "schedule" else []
        return any(step[0] == "decode_batch" and len(step[1]) > 1 for step in steps)


@dataclass(frozen=True)
class Mechanism:
    family: str  # an architecture, or "any"
    name: str
    exercised: Callable[[Drawn], bool]


def _rope_type(kind: str) -> Callable[[Drawn], bool]:
    return lambda d: any(rope.rope_type == kind for rope in d.config.rope.values())


def _family(name: str, test: Callable[[Drawn], bool]) -> Callable[[Drawn], bool]:
    return lambda d: d.family == name and test(d)


def _sliding(d: Drawn) -> bool:
    return d.config.sliding_window is not None and "sliding_attention" in d.config.layer_types


def _deepseek(name: str, test: Callable[[Drawn], bool]) -> Mechanism:
    return Mechanism("deepseek_v3", name, _family("deepseek_v3", test))


MECHANISMS: tuple[Mechanism, ...] = (
    Mechanism("any", "grouped-query attention (2 or 3 query heads per KV head)",
              lambda d: d.family != "deepseek_v3" and d.keys["num_attention_heads"] > d.keys["num_key_value_heads"]),
    Mechanism("any", "weights of std 1 (attention scores in the hundreds)", lambda d: d.case.weights["std"] == 1.0),
    Mechanism("any", "a tied checkpoint with a stray lm_head", lambda d: d.config.tie_word_embeddings
              and d.case.weights["lm_head"]),
    Mechanism("any", "an optional key left out (the family's default applies)",
              lambda d: any(key not in d.keys for key in optional_keys(d.family))),
    Mechanism("any", "RoPE scaling: linear", _rope_type("linear")),
    Mechanism("any", "RoPE scaling: dynamic NTK", _rope_type("dynamic")),
    Mechanism("any", "RoPE scaling: llama3", _rope_type("llama3")),
    Mechanism("any", "RoPE scaling: YaRN", _rope_type("yarn")),
    Mechanism("any", f"a plain callable's logits past position {CALLABLE_HORIZON}",
              lambda d: d.case.property == "long_horizon"),
    Mechanism("llama", "attention biases", _family("llama", lambda d: d.config.attention.bias)),
    Mechanism("llama", "MLP biases", _family("llama", lambda d: d.config.mlp.bias)),
    Mechanism("mistral", "a sliding window", _family("mistral", _sliding)),
    Mechanism("qwen2", "sliding layers past max_window_layers", _family("qwen2", _sliding)),
    Mechanism("qwen3", "q/k norms", _family("qwen3", lambda d: True)),
    Mechanism("phi3", "partial rotary dims", _family("phi3", lambda d: any(rope.partial_rotary_factor < 1
              for rope in d.config.rope.values()))),
    Mechanism("gemma3_text", "sliding and global layers", _family("gemma3_text", _sliding)),
    Mechanism("gemma3_text", "final-logit soft-cap",
              _family("gemma3_text", lambda d: d.config.final_logit_softcapping)),
    Mechanism("gemma2", "attention soft-cap", _family("gemma2", lambda d: d.config.attention.softcap)),
    Mechanism("gemma2", "final-logit soft-cap", _family("gemma2", lambda d: d.config.final_logit_softcapping)),
    Mechanism("smollm3", "NoPE layers listed (no_rope_layers)",
              _family("smollm3", lambda d: "no_rope_layers" in d.keys)),
    Mechanism("smollm3", "NoPE layers derived from no_rope_layer_interval",
              _family("smollm3", lambda d: "no_rope_layers" not in d.keys and "no_rope_layer_interval" in d.keys)),
    Mechanism("smollm3", "NoPE layers from the default interval (neither key)", _family("smollm3",
              lambda d: "no_rope_layers" not in d.keys and "no_rope_layer_interval" not in d.keys)),
    Mechanism("olmo2", "norms after the sublayers", _family("olmo2", lambda d: True)),
    Mechanism("granite", "multipliers other than 1", _family("granite", lambda d: any(d.keys.get(key, 1.0) != 1.0
              for key in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling")))),
    Mechanism("cohere", "q/k norms", _family("cohere", lambda d: d.keys.get("use_qk_norm", False))),
    Mechanism("mixtral", "a sparse layer, fewer experts per token than experts", _family("mixtral", lambda d:
              d.sparse and d.config.experts.experts_per_token < d.config.experts.num_experts)),
    Mechanism("qwen3_moe", "renormalised expert weights", _family("qwen3_moe", lambda d: d.sparse
              and d.config.experts.norm_topk_prob)),
    Mechanism("qwen3_moe", "expert weights not renormalised", _family("qwen3_moe", lambda d: d.sparse
              and not d.config.experts.norm_topk_prob)),
    Mechanism("qwen3_moe", "dense layers among sparse ones", _family("qwen3_moe", lambda d: d.sparse
              and not all(d.config.is_sparse(layer) for layer in range(d.config.num_hidden_layers)))),
    Mechanism("gpt_oss", "a clamped SwiGLU (limit 0.5)",
              _family("gpt_oss", lambda d: d.keys.get("swiglu_limit") == 0.5)),
    Mechanism("gpt_oss", "YaRN with sinks", _family("gpt_oss", _rope_type("yarn"))),
    _deepseek("full-rank queries", lambda d: d.config.attention.q_lora_rank is None),
    _deepseek("interleaved RoPE", lambda d: d.config.attention.rope_interleave),
    _deepseek("groups left out of the routing", lambda d: d.sparse
              and d.config.experts.groups_per_token < d.config.experts.num_groups),
    _deepseek("routed_scaling_factor under renormalisation", lambda d: d.sparse and d.config.experts.norm_topk_prob
              and d.config.experts.routed_scaling_factor != 1.0),
    _deepseek("dense first layers before a sparse one",
              lambda d: d.sparse and d.config.experts.first_k_dense_replace > 0),
    _deepseek("sigmoid scores saturated to ties", lambda d: d.tied_router and d.case.weights["router"] == "saturated"),
    *(Mechanism(family, "router scores that tie", _family(family, lambda d: d.tied_router))
      for family in (*MOE_ARCHITECTURES, "deepseek_v3")),
    Mechanism("any", "router scores that tie, in a batch of sequences (decode_batch, forks)",
              lambda d: d.tied_router and d.rows_batched),
)  # fmt: skip


def drawn_cases(name: str, examples: int, seed: int, architectures: tuple[str, ...] = ARCHITECTURES) -> list[Case]:
    """The cases a run of ``examples`` cases of property ``name`` draws under ``seed`` (for a backend that can
    run every drawn model and has every capability)."""
    drawn: list[Case] = []

    @settings(max_examples=examples, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(case=cases((name,), "float32", architectures))
    def collect(case: Case) -> None:
        drawn.append(case)

    hypothesis_seed(seed)(collect)()
    return drawn


def expected_cases(
    examples: int = DEFAULT_EXAMPLES, runs: int = DEFAULT_RUNS, architectures: tuple[str, ...] = ARCHITECTURES
) -> dict[Mechanism, float]:
    """Per mechanism, the mean number of cases that exercise it in a run of ``examples`` cases per property
    (every property of PROPERTIES), over ``runs`` seeds."""
    totals = dict.fromkeys(MECHANISMS, 0)
    for seed in range(runs):
        for name in PROPERTIES:
            for case in drawn_cases(name, examples, seed, architectures):
                drawn = Drawn(case, ModelConfig.from_hf(case.config_json))
                for mechanism in MECHANISMS:
                    totals[mechanism] += bool(mechanism.exercised(drawn))
    return {mechanism: total / runs for mechanism, total in totals.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m refllm.testing.mechanisms",
        description="The expected number of cases that exercise each mechanism in a conformance run.",
    )
    parser.add_argument("--examples", type=int, default=DEFAULT_EXAMPLES, help="cases per property (default 25)")
    parser.add_argument("--runs", type=int, default=DEFAULT_RUNS, help="seeds to average over (default 20)")
    options = parser.parse_args(argv)
    if options.examples < 1 or options.runs < 1:
        parser.error(f"--examples and --runs must be at least 1; got {options.examples} and {options.runs}")
    expected = expected_cases(options.examples, options.runs)
    print(f"expected cases per run of {options.examples} cases x {len(PROPERTIES)} properties ({options.runs} seeds)")
    for mechanism, count in sorted(expected.items(), key=lambda item: item[1]):
        flag = "" if count >= LEAST_EXPECTED else f"   < {LEAST_EXPECTED}"
        print(f"{count:7.1f}  {mechanism.family:12} {mechanism.name}{flag}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
