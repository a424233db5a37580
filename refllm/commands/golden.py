"""Golden files on the command line: ``refllm golden dump`` and ``golden check``, on one machine or on Ray."""

from __future__ import annotations

import argparse

from refllm.cluster.golden import check_on_ray, dump_on_ray
from refllm.commands.flags import add_cluster_flags, cluster_options
from refllm.models.decoder import DTYPES
from refllm.testing.backends import as_backend
from refllm.testing.checkpoint import Checkpoint
from refllm.testing.factories import load_factory
from refllm.testing.golden import (
    DEFAULT_BACKEND,
    DumpOptions,
    Golden,
    GoldenModelMismatchError,
    check,
    dump,
    golden_kl,
    read_prompts,
)
from refllm.testing.tolerances import PROFILES, get_profile


DUMP_EXAMPLE = "refllm golden dump -m smollm2-135m --prompts prompts.txt --out smollm2.safetensors"
CHECK_EXAMPLE = "refllm golden check smollm2.safetensors"


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register ``golden dump`` and ``golden check`` on a ``refllm``-style subparsers object."""
    golden = subparsers.add_parser(
        "golden",
        help="write or check golden files of reference outputs",
        description="Golden files (docs/golden-format.md): `dump` runs refllm's reference on prompts and\n"
        "writes its greedy tokens and logits; `check` compares a backend with such a file.",
        epilog=f"examples:\n  {DUMP_EXAMPLE}\n  {CHECK_EXAMPLE}\nRun 'refllm golden ACTION --help' for its flags.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = golden.add_subparsers(dest="golden_command", required=True, metavar="ACTION")

    dump_parser = commands.add_parser(
        "dump",
        help="run the reference on prompts and write a golden file",
        description="Run refllm's reference on each prompt (greedy) and write a golden file: the tokens, the\n"
        "top candidates at every position and the full logits of the first few.",
        epilog=f"examples:\n  {DUMP_EXAMPLE}\n  {DUMP_EXAMPLE.replace('.safetensors', '-f64.safetensors')} --dtype float64",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    dump_parser.add_argument("-m", "--model", required=True, help="catalog name or Hugging Face directory")
    dump_parser.add_argument("--prompts", required=True, help="one prompt per line: text, or a JSON array of token ids")
    dump_parser.add_argument("--out", required=True, help="the golden file to write (.safetensors)")
    dump_parser.add_argument("--new-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    dump_parser.add_argument("--top-k", type=int, default=10, help="candidates stored per position (default 10)")
    dump_parser.add_argument(
        "--positions", type=int, default=8, help="positions whose full logits are stored (default 8)"
    )
    dump_parser.add_argument("--hidden-states", action="store_true", help="also store hidden states around every layer")
    dump_parser.add_argument(
        "--dtype", default="float32", choices=DTYPES, help="compute and store in float32 (default) or float64 (truth)"
    )
    dump_parser.add_argument(
        "--profile", default="float32", choices=sorted(PROFILES), help="tolerance profile a check uses"
    )
    add_cluster_flags(
        dump_parser, "where finished shards wait to be merged, and an interrupted dump resumes (default OUT.shards)"
    )
    dump_parser.set_defaults(handler=cmd_dump)

    check_parser = commands.add_parser(
        "check",
        help="compare a backend with a golden file; non-zero exit on failure",
        description="Run a backend (refllm's own by default, or module:factory) on a golden file's prompts and\n"
        "compare it within the file's tolerance profile; exit status 1 if any prompt fails.",
        epilog=f"examples:\n  {CHECK_EXAMPLE}\n  {CHECK_EXAMPLE} --backend mypackage.backend:build",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    check_parser.add_argument("golden", help="the golden file")
    check_parser.add_argument("--backend", default=DEFAULT_BACKEND, help=f"module:factory (default {DEFAULT_BACKEND})")
    check_parser.add_argument(
        "-m", "--model", help="the weights to build the backend from (default: the golden file's model)"
    )
    check_parser.add_argument(
        "--profile", choices=sorted(PROFILES), help="override the golden file's tolerance profile"
    )
    add_cluster_flags(check_parser, "keep finished shards here, so an interrupted check resumes")
    check_parser.set_defaults(handler=cmd_check)


def cmd_dump(args: argparse.Namespace) -> int:
    on_ray = cluster_options(args)
    checkpoint = Checkpoint.open(args.model, args.dtype)
    prompts = read_prompts(args.prompts, checkpoint.tokenizer)
    options = DumpOptions(args.new_tokens, args.top_k, args.positions, args.hidden_states)
    if on_ray is None:
        metadata = dump(
            checkpoint, prompts, args.out, args.model, args.profile, args.new_tokens, args.top_k, args.positions,
            args.hidden_states, args.dtype,
        )  # fmt: skip
    else:
        metadata, _ = dump_on_ray(
            checkpoint, prompts, args.out, args.model, args.profile, options, args.dtype, **on_ray
        )
    weights = metadata["weights_sha256"][:12]
    print(f"{args.out}: {len(prompts)} {args.dtype} prompts from {args.model} (weights sha256 {weights})")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    on_ray = cluster_options(args)
    golden = Golden.load(args.golden)
    model = args.model or golden.metadata["model"]
    checkpoint = Checkpoint.open(model, golden.metadata.get("dtype", "float32"))  # as dump read the weights
    expected_hash, actual_hash = golden.metadata["weights_sha256"], checkpoint.weights_sha256()
    if actual_hash != expected_hash:
        raise GoldenModelMismatchError(
            f"{model} has weights sha256 {actual_hash[:12]}; {args.golden} was made from {expected_hash[:12]}"
        )
    backend = as_backend(load_factory(args.backend)(checkpoint))
    profile = get_profile(args.profile or golden.metadata.get("tolerance_profile", "float32"))
    made_by = golden.metadata.get("refllm_version")
    print(f"{args.golden}: {golden.num_prompts} prompts from {model} (refllm {made_by}), profile {profile.name}")
    print(f"backend: {backend.name} ({args.backend})")
    if on_ray is None:
        reports = check(golden, backend, profile)
    else:
        reports = check_on_ray(args.golden, golden, model, args.backend, profile.name, **on_ray)
    for report in reports:
        print(report.line)
    passed = sum(r.ok for r in reports)
    statistics = golden_kl(reports)
    if statistics is not None:
        print(f"against the golden's {golden.metadata.get('dtype', 'float32')} logits:")
        for line in statistics.lines():
            print(f"  {line}")
    print(f"{passed}/{len(reports)} prompts pass")
    return 0 if passed == len(reports) else 1
