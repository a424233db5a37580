"""The ``refllm`` command line.

Every error a user can cause prints one sentence and exits non-zero; ``--debug``
shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from refllm import catalog

EXIT_USER_ERROR = 1


def _add_sampling_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (default 1.0: off)")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k most likely (default 0: off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min-p x the top one (default 0)")
    parser.add_argument("--repetition-penalty", type=float, default=1.0, help="(default 1.0: off)")
    parser.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")


def _sampling_params(args: argparse.Namespace):
    from refllm.runtime.sampling import SamplingParams

    return SamplingParams(
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        min_p=args.min_p,
        repetition_penalty=args.repetition_penalty,
        seed=args.seed,
        max_tokens=args.max_tokens,
    )


def _load(name_or_path: str):
    import refllm

    return refllm.load_model(name_or_path)


def cmd_generate(args: argparse.Namespace) -> int:
    from refllm.runtime.generate import generate_stream

    params = _sampling_params(args)
    model = _load(args.model)
    if model.tokenizer is None:
        raise ValueError(f"{args.model} has no tokenizer, so it cannot generate from text")
    if args.chat:
        prompt = model.tokenizer.apply_chat_template([{"role": "user", "content": args.prompt}])
        prompt_ids = model.tokenizer.encode(prompt, add_special_tokens=False)
    else:
        prompt_ids = model.tokenizer.encode(args.prompt)
    if not args.chat:
        sys.stdout.write(args.prompt)
    for step in generate_stream(model, prompt_ids, params):
        sys.stdout.write(step.text)
        sys.stdout.flush()
    sys.stdout.write("\n")
    return 0


def cmd_pull(args: argparse.Namespace) -> int:
    path = catalog.pull(args.name, progress=not args.quiet)
    print(path)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="refllm", description="A NumPy reference implementation of LLM inference that runs on a laptop CPU."
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks instead of one-line errors")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    generate = commands.add_parser("generate", help="continue a prompt, streaming the text")
    generate.add_argument("prompt", help="the text to continue")
    generate.add_argument(
        "--model", default=catalog.DEFAULT_MODEL, help="catalog name, .gguf file or Hugging Face directory"
    )
    generate.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    _add_sampling_flags(generate)
    generate.set_defaults(handler=cmd_generate)

    pull = commands.add_parser("pull", help="download a catalog model into $REFLLM_HOME")
    pull.add_argument("name", choices=sorted(catalog.CATALOG), help="catalog name")
    pull.add_argument("--quiet", action="store_true", help="no progress output")
    pull.set_defaults(handler=cmd_pull)

    from refllm.testing.golden import add_cli as add_golden_cli

    add_golden_cli(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130
    except (ValueError, KeyError, OSError) as error:
        if args.debug:
            raise
        message = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
        print(f"refllm: error: {message}", file=sys.stderr)
        return EXIT_USER_ERROR


if __name__ == "__main__":
    sys.exit(main())
