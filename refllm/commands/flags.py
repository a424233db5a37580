"""Flags shared by several commands, checked in the flag's own name before any model loads.

A value argparse can judge alone is checked by the flag's ``type``; a value
judged with the others (sampling settings, a prompt read from stdin) raises
``UsageError``. Both end the command with exit status 2 and one line.
"""

from __future__ import annotations

import argparse
import re
import sys

from refllm import catalog
from refllm.cluster import LOCAL, check_reachable, import_ray
from refllm.commands.parsing import closest
from refllm.errors import InvalidInputError
from refllm.models.decoder import DTYPES
from refllm.quant.formats import ACTIVATIONS
from refllm.runtime.sampling import LOGIT_BIAS_LIMIT, TEMPERATURE_FLOOR, SamplingParams, SamplingParamsError

MODEL_HELP = (
    f"catalog name ({', '.join(catalog.CATALOG)}), .gguf file or Hugging Face directory"
    f" (default {catalog.DEFAULT_MODEL})"
)
SAMPLING_FLAGS = {  # SamplingParams field -> its flag; `chat`'s /set takes the same names without the dashes
    "temperature": "--temperature",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "min_p": "--min-p",
    "repetition_penalty": "--repetition-penalty",
    "seed": "--seed",
    "max_tokens": "--max-tokens",
}


class UsageError(InvalidInputError):
    """A flag or argument the command cannot accept: exit status 2, like argparse's own refusals."""


def add_command(
    commands: argparse._SubParsersAction, name: str, handler, summary: str, description: str, *examples: str
) -> argparse.ArgumentParser:
    """A sub-command whose --help ends with its examples; ``handler(args)`` runs it."""
    parser = commands.add_parser(
        name,
        help=summary,
        description=description,
        epilog="example" + "s" * (len(examples) > 1) + ":\n" + "\n".join(f"  {e}" for e in examples),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(handler=handler)
    return parser


def positive_int(text: str) -> int:
    return _whole_number(text, least=1)


def seed_number(text: str) -> int:
    return _whole_number(text, least=0)


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"{value} must be at least {least}")
    return value


def positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value:g} must be positive")
    return value


def catalog_name(text: str) -> str:
    """A name in the catalog; another is refused with the closest one."""
    if text not in catalog.CATALOG:
        names = ", ".join(catalog.CATALOG)
        raise argparse.ArgumentTypeError(f"{text!r} is not in the catalog ({names}){closest(text, catalog.CATALOG)}")
    return text


def logit_bias_entry(text: str) -> tuple[int, float]:
    """``TOKEN_ID=BIAS`` (``50256=-100``) -> (token id, bias), the bias in [-100, 100]."""
    token, _, bias = text.partition("=")
    try:
        token_id, amount = int(token), float(bias)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not TOKEN_ID=BIAS (say 50256=-100)") from None
    if token_id < 0:
        raise argparse.ArgumentTypeError(f"{token_id} is not a token id (0 or more)")
    if not -LOGIT_BIAS_LIMIT <= amount <= LOGIT_BIAS_LIMIT:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"the bias {bias} is not in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}]")
    return token_id, amount


def batch_sizes(text: str) -> list[int]:
    return [positive_int(part) for part in text.split(",")]


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a port number (0 to 65535; 0 picks a free one)")
    return value


DEQUANTIZE_HELP = "dequantize a GGUF file's weights to float32 instead of multiplying from its blocks"
DTYPE_HELP = "float32 (default), or float64: ground truth, every step in float64 with the spec ops (slow)"
SPEC_OPS_HELP = "run the spec ops (the functions of refllm/nn, plain NumPy) instead of their Numba twins"
ACTIVATIONS_HELP = (
    "int8: quantize the layers' activations to 8 bits for integer products with Q4_0, Q4_1 and Q8_0"
    " blocks in decode steps (faster, further from float64 truth); default float32"
)


class DeprecatedName(argparse.Action):
    """A flag's old name, kept for one release: it sets the new flag and says to use that instead."""

    def __init__(self, option_strings, dest, new_name: str, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=argparse.SUPPRESS, **kwargs)
        self.new_name = new_name

    def __call__(self, parser, namespace, values, option_string=None):
        print(
            f"{parser.prog}: warning: {option_string} is deprecated and goes in the next release;"
            f" it means {self.new_name}, which to use instead",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, True)


def add_dequantize_flag(parser: argparse.ArgumentParser, help: str = DEQUANTIZE_HELP, activations: bool = True) -> None:
    """--dequantize, and its old name --float32; and --activations for the quantized blocks, where it applies."""
    parser.add_argument("--dequantize", action="store_true", help=help)
    parser.add_argument("--float32", dest="dequantize", action=DeprecatedName, new_name="--dequantize")
    if activations:
        parser.add_argument("--activations", choices=ACTIVATIONS, default="float32", help=ACTIVATIONS_HELP)


def add_precision_flags(parser: argparse.ArgumentParser, dequantize: bool = True) -> None:
    """--dtype and --spec-ops (docs/reference.md), and --dequantize where quantized blocks are the default."""
    if dequantize:
        add_dequantize_flag(parser)
    parser.add_argument("--dtype", choices=DTYPES, default="float32", help=DTYPE_HELP)
    parser.add_argument("--spec-ops", action="store_true", help=SPEC_OPS_HELP)
    parser.add_argument("--reference", dest="spec_ops", action=DeprecatedName, new_name="--spec-ops")


def precision(args: argparse.Namespace) -> dict:
    """The precision flags as ``common.load``'s keywords: quantized blocks only on the float32 fast path."""
    dtype, spec_ops = args.dtype, args.spec_ops or None
    quantized = not getattr(args, "dequantize", True) and dtype == "float32" and not spec_ops
    keywords = {"quantized": quantized, "dtype": dtype, "reference": spec_ops}
    if getattr(args, "activations", "float32") != "float32":
        keywords["activations"] = args.activations
    return keywords


def add_model_flag(parser: argparse.ArgumentParser, default: str | None = catalog.DEFAULT_MODEL) -> None:
    """-m/--model: a catalog name, a .gguf file or a Hugging Face directory."""
    parser.add_argument("-m", "--model", default=default, metavar="MODEL", help=MODEL_HELP)


def add_generation_flags(parser: argparse.ArgumentParser, max_tokens: int) -> None:
    flag = parser.add_argument
    flag("-n", "--max-tokens", type=positive_int, default=max_tokens, metavar="N", help=f"most tokens (default {max_tokens})")
    flag("--temperature", type=float, default=0.0, metavar="T",
         help=f"0 is greedy (default); else at least {TEMPERATURE_FLOOR:g}, higher is more random")  # fmt: skip
    flag("--top-p", type=float, default=1.0, metavar="P", help="nucleus sampling mass (default 1.0: off)")
    flag("--top-k", type=int, default=0, metavar="K", help="sample among the k most likely (default 0: off)")
    flag("--min-p", type=float, default=0.0, metavar="P", help="drop tokens below P x the top one (default 0: off)")
    flag("--repetition-penalty", type=float, default=1.0, metavar="R", help="(default 1.0: off)")
    flag("--seed", type=seed_number, default=None, metavar="S", help="makes sampling reproducible")
    flag("--logit-bias", type=logit_bias_entry, action="append", default=[], metavar="ID=BIAS",
         help="add BIAS (-100 to 100) to token ID's logit before sampling; -100 bans it (repeatable)")  # fmt: skip
    flag("--context", type=positive_int, metavar="N", help="most tokens of prompt and answer (default: the model's)")
    flag("--quiet", action="store_true", help="no stats line after an answer")


def sampling_params(args: argparse.Namespace, stop: tuple[str, ...] = ()) -> SamplingParams:
    """The sampling flags as SamplingParams; a bad value is a UsageError naming its flag."""
    if "" in stop:
        raise UsageError("argument --stop: a stop string cannot be empty")
    settings = {field: getattr(args, field) for field in SAMPLING_FLAGS}
    flag = {**SAMPLING_FLAGS, "logit_bias": "--logit-bias"}
    return checked_params(settings, stop=stop, logit_bias=args.logit_bias, name=lambda field: f"argument {flag[field]}")


def checked_params(settings: dict, *, name, **more) -> SamplingParams:
    """SamplingParams(**settings, **more); a value out of range is a UsageError that says ``name(field)``."""
    try:
        return SamplingParams(**settings, **more)
    except SamplingParamsError as error:
        if error.name is None:
            raise UsageError(str(error)) from None
        if error.name not in settings:  # a field given whole (logit_bias): the error says what in it is wrong
            raise UsageError(f"{name(error.name)}: {error}") from None
        raise UsageError(f"{name(error.name)}: {settings[error.name]} {error.rule}") from None


def prompt_argument(args: argparse.Namespace) -> str:
    """The prompt given as PROMPT or as -p/--prompt (as llama.cpp and mlx-lm take it), exactly once."""
    if args.prompt is not None and args.prompt_flag is not None:
        raise UsageError("argument -p/--prompt: the prompt is given twice, as PROMPT and with -p; give one")
    if args.prompt is None and args.prompt_flag is None:
        raise UsageError("argument PROMPT: no prompt; give the text to continue (or -p TEXT, or - for stdin)")
    return read_prompt(args.prompt if args.prompt is not None else args.prompt_flag)


def read_prompt(prompt: str) -> str:
    """The PROMPT argument, or standard input when it is ``-``; an empty prompt is a UsageError."""
    if prompt == "-":
        prompt = sys.stdin.read()
        if not prompt.strip():
            raise UsageError("argument PROMPT: - reads the prompt from standard input, which was empty")
    elif not prompt:
        raise UsageError("argument PROMPT: the prompt is empty")
    return prompt


# What --ray's optional ADDRESS can be (as ray.init takes it); any other word after --ray is a positional.
RAY_ADDRESS = re.compile(r"auto|local|ray://\S+|[^\s/\\]+:\d+")


def bare_ray_flag_before_positional(argv: list[str]) -> list[str]:
    """argv with ``--ray FILE`` spelled ``--ray=local FILE``: argparse would take FILE as the address."""
    return [
        f"--ray={LOCAL}" if arg == "--ray" and i + 1 < len(argv) and not RAY_ADDRESS.fullmatch(argv[i + 1])
        and not argv[i + 1].startswith("-") else arg
        for i, arg in enumerate(argv)
    ]  # fmt: skip


def add_cluster_flags(parser: argparse.ArgumentParser, shards_help: str) -> None:
    """--ray [ADDRESS], --workers, --shard-size and --shards (docs/cluster.md)."""
    group = parser.add_argument_group("on a Ray cluster (docs/cluster.md)")
    group.add_argument(
        "--ray",
        nargs="?",
        const=LOCAL,
        metavar="ADDRESS",
        help="run in shards on Ray: a new cluster on this machine, or the one at ADDRESS (auto, host:port, ray://host:port)",
    )
    group.add_argument("--workers", type=positive_int, metavar="N", help="actors, of one CPU each (default: all CPUs)")
    group.add_argument("--shard-size", type=positive_int, metavar="N", help="items per shard (default 1)")
    group.add_argument("--shards", metavar="DIR", help=shards_help)


def cluster_options(args: argparse.Namespace) -> dict | None:
    """The cluster flags as the ``*_on_ray`` functions' keywords; None without --ray, where the others are refused.

    With --ray, Ray must be installed and its address answer: said before anything loads.
    """
    if args.ray is None:
        given = [flag for flag in ("workers", "shard_size", "shards") if getattr(args, flag) is not None]
        if given:
            raise UsageError(f"argument --{given[0].replace('_', '-')}: only with --ray")
        return None
    import_ray()
    check_reachable(args.ray)
    return {"address": args.ray, "workers": args.workers, "shard_size": args.shard_size or 1, "shards": args.shards}
